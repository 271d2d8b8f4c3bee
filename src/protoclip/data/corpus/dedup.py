"""De-duplicating millions of pairs in bounded memory: keys spilled to disk in hash buckets, one sorted at a time.

:class:`KeySpill` finds the rows repeating an earlier key (a CSV's repeated image path); :class:`PairDedup` applies
``manifest.deduplicate``'s rule to a stream of pairs. Memory grows with one bucket and the duplicates, not the corpus.
"""
from __future__ import annotations

import hashlib
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

BUCKETS = 256  # spill files per key
BLOCK = 1 << 16  # records buffered before they are spread over the bucket files


def key16(text: str) -> bytes:
    """The 128-bit BLAKE2b digest of a string (surrogate escapes kept, so every str has one).

    Two different strings share a digest with probability about n^2 / 2^129 (1e-24 at 15M pairs).
    """
    return hashlib.blake2b(text.encode("utf-8", "surrogateescape"), digest_size=16).digest()


def _keys(texts: Sequence[str]) -> np.ndarray:
    """[n, 2] uint64 digests of ``texts``."""
    return np.frombuffer(b"".join(key16(t) for t in texts), dtype="<u8").reshape(-1, 2)


class Buckets:
    """Structured records appended in row order, spread over ``BUCKETS`` files by the low byte of field ``key``.

    The key is a BLAKE2b digest, so the buckets are even; reading one bucket at a time holds about
    rows / BUCKETS records (56 bytes each in :data:`PAIR_RECORD`: 3.3 MiB a bucket at 15M pairs), not the corpus.
    """

    def __init__(self, folder: Path, dtype: np.dtype, key: str):
        self.folder, self.dtype, self.key = Path(folder), np.dtype(dtype), key
        self.folder.mkdir(parents=True, exist_ok=True)
        self._pending: list[np.ndarray] = []
        self._n = 0

    def add(self, records: np.ndarray) -> None:
        self._pending.append(records)
        self._n += len(records)
        if self._n >= BLOCK:
            self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        recs = np.concatenate(self._pending)
        self._pending, self._n = [], 0
        bucket = (recs[self.key][:, 0] & (BUCKETS - 1)).astype(np.intp)
        order = np.argsort(bucket, kind="stable")  # stable: each bucket keeps row order
        counts = np.bincount(bucket, minlength=BUCKETS)
        recs, ends = recs[order], np.cumsum(counts)
        for b in np.flatnonzero(counts):
            with open(self.folder / f"{b:03d}.bin", "ab") as f:
                recs[ends[b] - counts[b]: ends[b]].tofile(f)

    def __iter__(self) -> Iterator[np.ndarray]:
        """Each non-empty bucket's records, in row order within the bucket."""
        self.flush()
        for b in range(BUCKETS):
            path = self.folder / f"{b:03d}.bin"
            if path.is_file():
                yield np.fromfile(path, dtype=self.dtype)


def _in_repeated_groups(keys: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(order, repeated, first): ``order`` sorts the records by (key, row); ``repeated[i]`` says whether record
    ``order[i]``'s key occurs more than once, ``first[i]`` whether it is the first (lowest row) of its key."""
    order = np.lexsort((rows, keys[:, 1], keys[:, 0]))
    k = keys[order]
    same = np.all(k[1:] == k[:-1], axis=1)  # record i+1 has record i's key
    repeated = np.zeros(len(k), bool)
    repeated[1:] |= same
    repeated[:-1] |= same
    return order, repeated, np.concatenate([[True], ~same]) if len(k) else np.zeros(0, bool)


KEY_RECORD = np.dtype([("row", "<i8"), ("key", "<u8", (2,))])


class KeySpill:
    """First occurrence wins: which rows repeat a key seen at an earlier row.

        keys = KeySpill(folder)
        keys.add(rows, [key16(s) for s in texts]);  later = keys.later_repeats()     # sorted rows to drop
    """

    def __init__(self, folder: Path):
        self.buckets = Buckets(folder, KEY_RECORD, "key")

    def add(self, rows: np.ndarray, texts: Sequence[str]) -> None:
        recs = np.empty(len(texts), KEY_RECORD)
        recs["row"], recs["key"] = rows, _keys(texts)
        self.buckets.add(recs)

    def later_repeats(self) -> np.ndarray:
        """Sorted rows whose key occurred at an earlier row."""
        out = [np.zeros(0, np.int64)]
        for recs in self.buckets:
            order, _repeated, first = _in_repeated_groups(recs["key"], recs["row"])
            out.append(recs["row"][order[~first]])
        return np.sort(np.concatenate(out))


PAIR_RECORD = np.dtype([("row", "<i8"), ("id", "<u8", (2,)), ("sha", "<u8", (2,)), ("cap", "<u8", (2,))])
# the rows the manifest leaves out after the scan: the de-duplication's, and a capped user data set's pairs beyond
# its seeded subset (UserDataConfig.max_pairs, protoclip.data.corpus.prepare.subset_removed)
REASONS = ("duplicate_id", "duplicate_pair", "duplicate_image", "over_max_pairs")


def pair_keys(pairs: Sequence) -> np.ndarray:
    """:data:`PAIR_RECORD` records of ``pairs`` (id, image sha256 and caption digests; rows unset)."""
    recs = np.zeros(len(pairs), PAIR_RECORD)
    recs["id"] = _keys([p.id for p in pairs])
    recs["sha"] = _keys([p.sha256 for p in pairs])
    recs["cap"] = _keys([p.caption for p in pairs])
    return recs


@dataclass
class Removed:
    rows: np.ndarray  # int64, sorted: rows ``deduplicate`` drops
    reasons: np.ndarray  # int8 per row: index into REASONS


class PairDedup:
    """``protoclip.data.loading.manifest.deduplicate``'s rule over pairs streamed in manifest order (rows may start
    negative: the offline pairs come first in the manifest but are logged after the user data's scan).

        dedup = PairDedup(folder)
        dedup.add(first_row, pairs); ...;  removed = dedup.resolve()              # removed.rows, removed.reasons

    The rule is kept exactly: a pair is kept unless an earlier *kept* pair has its id or its image. A pair whose id
    and image occur once in the whole stream is always kept; only the pairs that share an id or an image with
    another pair (the conflict set, found bucket by bucket) are replayed through the rule in row order, so memory
    grows with the number of duplicates, not of pairs.
    """

    def __init__(self, folder: Path):
        self.by_id = Buckets(Path(folder) / "id", PAIR_RECORD, "id")
        self.by_sha = Buckets(Path(folder) / "sha", PAIR_RECORD, "sha")

    def add(self, first_row: int, pairs: Sequence) -> None:
        """Log ``pairs`` (objects with ``id``, ``sha256``, ``caption``) at rows ``first_row, first_row + 1, ...``."""
        self.add_keys(first_row, pair_keys(pairs))

    def add_keys(self, first_row: int, recs: np.ndarray) -> None:
        """Log records of :func:`pair_keys` (computed where the pairs were scanned) from row ``first_row`` on."""
        recs["row"] = np.arange(first_row, first_row + len(recs), dtype=np.int64)
        self.by_id.add(recs)
        self.by_sha.add(recs)

    def resolve(self) -> Removed:
        conflict = [np.zeros(0, PAIR_RECORD)]
        for key, buckets in (("id", self.by_id), ("sha", self.by_sha)):
            for recs in buckets:
                order, repeated, _first = _in_repeated_groups(recs[key], recs["row"])
                conflict.append(recs[order[repeated]])
        recs = np.concatenate(conflict)
        recs = recs[np.unique(recs["row"], return_index=True)[1]]  # once each, in row order
        ids: set[bytes] = set()
        images: dict[bytes, bytes] = {}
        rows, reasons = [], []
        for row, id_, sha, cap in zip(recs["row"].tolist(), map(bytes, recs["id"]), map(bytes, recs["sha"]),
                                      map(bytes, recs["cap"])):
            if id_ in ids:
                rows.append(row), reasons.append(0)
            elif sha in images:
                rows.append(row), reasons.append(1 if images[sha] == cap else 2)
            else:
                ids.add(id_)
                images[sha] = cap
        return Removed(np.asarray(rows, np.int64), np.asarray(reasons, np.int8))

    def close(self) -> None:
        for b in (self.by_id, self.by_sha):
            shutil.rmtree(b.folder, ignore_errors=True)


__all__ = ["BUCKETS", "key16", "Buckets", "KeySpill", "PairDedup", "Removed", "REASONS", "PAIR_RECORD", "pair_keys"]
