"""User image-text pairs in open_clip's formats: CSV/TSV files (:func:`csv_batches`) and webdataset tar shards
(:func:`wds_batches`).

Every image is decoded once here, so a pair that would crash training is skipped now and counted under a reason
of :data:`DROP_RULES`. Pairs come out in batches (a shard, or ``CSV_BATCH`` rows), so a scan holds one batch, not
the corpus; the sample ids it has seen are not kept either.
"""
from __future__ import annotations

import collections
import contextlib
import errno
import hashlib
import logging
import os
import tarfile
import tempfile
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np
import pyarrow as pa
from braceexpand import braceexpand
from tqdm import tqdm

from protoclip.data.corpus.captions import CaptionError, decode_caption
from protoclip.data.config import UserDataConfig
from protoclip.data.corpus.csvfile import CaptionRows, Malformed
from protoclip.data.corpus.dedup import KeySpill, pair_keys
from protoclip.data.corpus.images import open_image_bytes
from protoclip.data.loading.manifest import Pair, pairs_batch
from protoclip.data.corpus.split import split_of

log = logging.getLogger(__name__)

RULES_VERSION = 5  # bump when what the readers keep or drop changes (part of prepare's fingerprint)

# A caption longer than this is junk for a 76/77-token text encoder (and is the csv module's own default
# field limit, which would stop the whole scan with a traceback): the row is dropped as caption_too_long.
MAX_CAPTION_CHARS = 131_072

# per drop reason of user data: the rule that dropped the row, and how to keep such a row (prepare's report)
DROP_RULES = {
    "missing_file": "the image path is empty or names no file: fix the path (relative paths resolve against the "
                    "CSV's folder)",
    "bad_path": "the image path cannot be a file name (a NUL byte, too long): fix the path",
    "unreadable_file": "the image file cannot be read (permissions, a folder): fix its permissions",
    "empty_file": "the image file has 0 bytes: restore it",
    "undecodable_image": "the image does not decode (cut or not an image): restore or re-encode it",
    "empty_caption": "the caption is empty after whitespace is collapsed: write a caption",
    "non_utf8_caption": "the caption is not UTF-8: re-encode the file as UTF-8",
    "caption_too_long": f"the caption has more than {MAX_CAPTION_CHARS} characters: shorten it",
    "duplicate_id": "a row names an image path an earlier row named (the sample id): keep one row per image",
    "duplicate_pair": "the same image bytes and caption as a kept pair: nothing to do (a copy)",
    "duplicate_image": "the same image bytes as a kept pair with another caption (one image, one pair, so an image "
                       "cannot sit in both splits): keep one caption per image",
    "extra_fields": "a CSV row with more fields than the header: quote a caption that holds the delimiter",
    "missing_fields": "a CSV row with fewer fields than the header: fix the row",
    "malformed_row": "a CSV record that is not RFC 4180 (a quote left open, text after a closing quote): fix the "
                     "quoting; user_data quote_max_lines / quote_max_chars bound a quoted caption, "
                     "multiline_captions: false reads one record a line (the lines are listed in the report)",
    "duplicate_key": "a shard holds two members of one sample and extension: keep one",
    "unreadable_member": "a shard member cannot be read (the shard is cut there): restore the shard",
    "undecodable_shard": "the shard is not a tar file: restore it",
}
IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")
SEP = "::"  # path = "<shard>::<member>"


def expand_shards(pattern: str) -> list[str]:
    """``/d/{000..002}.tar`` -> three paths (webdataset's brace convention; ``::`` also separates lists)."""
    return [s for part in pattern.split("::") for s in braceexpand(part)]


def _image_reason(data: bytes | None) -> str:
    if data is None:
        return "missing_file"
    if not data:
        return "empty_file"
    try:
        open_image_bytes(data)
    except Exception:  # noqa: BLE001  any decoder error means the same thing here
        return "undecodable_image"
    return ""


def _pair_split(cfg: UserDataConfig) -> str:
    return "" if cfg.split == "auto" else cfg.split


CSV_BATCH = 4096  # CSV pairs a batch


def _read_file(path: Path) -> tuple[bytes | None, str]:
    """(bytes, "") or (None, drop reason) for an image path from a CSV row (never raises)."""
    if "\x00" in str(path):  # no file system allows it (pathlib's is_file would just say False)
        return None, "bad_path"
    try:
        if not path.is_file():
            return None, "missing_file"
        return path.read_bytes(), ""
    except ValueError:  # an embedded NUL byte
        return None, "bad_path"
    except OSError as err:  # name too long, permission denied, a folder vanishing under us ...
        return None, "bad_path" if err.errno == errno.ENAMETOOLONG else "unreadable_file"


def _repeated_rows(cfg: UserDataConfig, scratch: Path | None) -> np.ndarray:
    """Ordinals (among the data rows :class:`CaptionRows` yields) of the rows whose image path an earlier row
    already named: one pass over the file, keys spilled to disk (sorted int64 array)."""
    with tempfile.TemporaryDirectory(dir=scratch, prefix="csv-ids-") as tmp, CaptionRows(cfg, quiet=True) as rows:
        spill, paths, start = KeySpill(Path(tmp)), [], 0
        for row in rows:
            paths.append(row.image)
            if len(paths) == CSV_BATCH:
                spill.add(np.arange(start, start + len(paths)), paths)
                start, paths = start + len(paths), []
        spill.add(np.arange(start, start + len(paths)), paths)
        return spill.later_repeats()


def csv_batches(cfg: UserDataConfig, drops: collections.Counter, scratch: Path | None = None,
                malformed: list[Malformed] | None = None) -> Iterator[list[Pair]]:
    """The pairs of one CSV/TSV user data set, ``CSV_BATCH`` at a time; drops counted into ``drops``.

    One row per pair, image path in column ``img_key`` (default ``filepath``, as open_clip's ``--csv-img-key``)
    and caption in ``caption_key`` (default ``caption``; open_clip's ``--csv-caption-key`` defaults to ``title``,
    so a file made for open_clip's defaults needs ``caption_key: title``, and, being tab-separated as open_clip's
    ``--csv-separator`` default is, ``format: tsv``). Relative image paths resolve against the CSV's folder.
    Sample id = ``<name>/<filepath as written>``. Optional ``label_key``: a column of coarse labels (our addition,
    not open_clip's) that the held-out pairs' zero-shot and linear probes use, as the offline sources' folders;
    an empty cell leaves that pair unlabelled. Rows, lines and quotes: ``protoclip.data.corpus.csvfile`` (RFC 4180:
    quoted line breaks are read, a quote left open costs its own row). Repeated image paths are found by a first
    pass over the file with the keys spilled to disk (:func:`_repeated_rows`).

    Every data row ends up either as a pair or in exactly one drop count (a malformed record in as many as the
    lines it consumed). A file that cannot be used at all (no header, no image or caption column) stops with a
    :class:`ConfigError` naming the file and the cause, before anything is yielded. ``scratch``: where the
    repeated-path pass spills its keys (default: the system's temporary folder); ``malformed`` receives the first
    malformed records (line, lines consumed, where a quote opened).
    """
    with CaptionRows(cfg, quiet=True):  # the header is checked before the first pass reads the whole file
        pass
    repeated = _repeated_rows(cfg, scratch)
    nxt, r = 0, 0  # next index into ``repeated``; ordinal of the current row
    batch: list[Pair] = []
    with CaptionRows(cfg) as rows:
        for row in tqdm(rows, desc=cfg.name, unit="row", leave=False):
            ordinal, r = r, r + 1
            if nxt < len(repeated) and repeated[nxt] == ordinal:
                nxt += 1
                drops["duplicate_id"] += 1
                continue
            if len(row.caption) > MAX_CAPTION_CHARS:
                drops["caption_too_long"] += 1
                continue
            try:
                caption = decode_caption(row.caption.encode("utf-8", "surrogateescape"))
            except CaptionError as err:
                drops[err.reason] += 1
                continue
            if not row.image:
                drops["missing_file"] += 1
                continue
            img = rows.image_path(row.image)
            data, reason = _read_file(img)
            reason = reason or _image_reason(data)
            if reason:
                drops[reason] += 1
                continue
            batch.append(Pair(f"{cfg.name}/{row.image}", str(img.resolve()), caption, cfg.name, row.label.strip(),
                              hashlib.sha256(data).hexdigest(), split=_pair_split(cfg)))
            if len(batch) == CSV_BATCH:
                yield batch
                batch = []
    drops.update(rows.drops)
    if malformed is not None:
        malformed.extend(rows.malformed)
    if batch:
        yield batch


def scan_csv(cfg: UserDataConfig, scratch: Path | None = None) -> tuple[list[Pair], collections.Counter]:
    """Every pair and the drop counts of one CSV/TSV user data set (see :func:`csv_batches`), in one list."""
    drops: collections.Counter = collections.Counter()
    return [p for b in csv_batches(cfg, drops, scratch) for p in b], drops


def _key_ext(member: str) -> tuple[str, str]:
    folder, _, base = member.rpartition("/")
    stem, _, ext = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), ext.lower()


# A well-formed tar ends in (at least) two zero blocks; a shard without them was cut or overwritten.
_EOF_MARKER = 2 * tarfile.BLOCKSIZE


@dataclass
class ShardScan:
    """What one shard yields: per key (sorted) its sample id and either a pair or a drop reason, plus the
    drops that belong to the shard as a whole (missing_file / undecodable_shard)."""
    outcomes: list[tuple[str, Pair | None, str]]
    shard_drops: collections.Counter


def _list_members(tar: tarfile.TarFile, size: int) -> tuple[list[tarfile.TarInfo], str]:
    """The shard's members in order, read header by header, and where the shard is cut: "" (whole),
    "data" (the last member listed has a whole header but its data is cut) or "header" (every member
    listed is whole; a header after them is cut or unreadable, or the end-of-archive blocks are missing).

    Not ``getmembers()``: it raises on a cut shard and takes every intact member with it. Reading
    header by header keeps what precedes the cut (webdataset's streaming reader does the same). The shard
    counts as cut when a header fails to parse after the first, a member's data runs past the end of the
    file, or the archive lacks its end-of-archive zero blocks.
    """
    members: list[tarfile.TarInfo] = []
    while True:
        try:
            m = tar.next()
        except (tarfile.TarError, OSError, EOFError):
            if not members:
                raise
            return members, "header"
        if m is None:
            break
        members.append(m)
        if m.isfile() and m.offset_data + m.size > size:  # its header is whole, its data is not
            return members, "data"
    # tarfile ends quietly on a bad header after the first: require the end-of-archive blocks
    tar.fileobj.seek(tar.offset)
    return members, "" if tar.fileobj.read(_EOF_MARKER) == bytes(_EOF_MARKER) else "header"


def scan_shard(shard: str, name: str, split: str = "") -> ShardScan:
    """Scan one webdataset shard (a pure function of the shard's bytes; run in a process pool by
    :func:`scan_wds`). Image members' byte offsets go into the pairs, so training reads them with one
    ``pread`` (``protoclip.data.loading.reading``), never re-listing the tar."""
    sp = Path(shard)
    drops: collections.Counter = collections.Counter()
    if not sp.is_file():
        log.warning("user data '%s': shard not found: %s", name, sp)
        drops["missing_file"] += 1
        return ShardScan([], drops)
    try:
        size = sp.stat().st_size
        with open(sp, "rb") as f, tarfile.open(fileobj=f) as tar:
            members, cut = _list_members(tar, size)
            samples: dict[str, dict[str, tarfile.TarInfo]] = collections.defaultdict(dict)
            repeated: set[str] = set()
            for m in members:
                if m.isfile():
                    key, ext = _key_ext(m.name)
                    if ext in samples[key]:
                        repeated.add(key)
                    samples[key][ext] = m
            # the cut counts once as unreadable_member: the sample at the cut is dropped as such when it may be
            # incomplete (a member's data is cut, or it lacks its caption or image); every whole sample before
            # it is kept (webdataset's streaming reader yields them too)
            cut_key = None
            if cut:
                last = _key_ext(members[-1].name)[0]
                got = samples.get(last, {})  # not samples[last]: the defaultdict would add an empty sample
                if cut == "header" and "txt" in got and any(e in got for e in IMAGE_EXTS) or not got:
                    drops["unreadable_member"] += 1  # a whole sample (kept), or the cut after a non-file member
                else:
                    cut_key = last
                log.warning("user data '%s': shard %s is cut after %d members; the samples before the cut are "
                            "kept", name, sp, len(members))
            if repeated:
                log.warning("user data '%s': shard %s repeats %d keys (first: %s)", name, sp, len(repeated),
                            sorted(repeated)[0])
            resolved = str(sp.resolve())
            outcomes = []
            for key in sorted(samples):
                sid = f"{name}/{sp.name}/{key}"  # one string object for the outcome and the pair (pickled once)
                outcomes.append((sid, *_sample(f, samples[key], key in repeated, key == cut_key, sid, resolved, name,
                                               split)))
    except (tarfile.TarError, OSError, EOFError) as err:
        log.warning("user data '%s': cannot read shard %s: %s", name, sp, err)
        drops["undecodable_shard"] += 1
        return ShardScan([], drops)
    return ShardScan(outcomes, drops)


def _read_at(f, member: tarfile.TarInfo) -> bytes:
    f.seek(member.offset_data)
    data = f.read(member.size)
    if len(data) != member.size:
        raise EOFError(f"{member.name}: unexpected end of data")
    return data


def _sample(f, members: dict[str, tarfile.TarInfo], repeated: bool, cut: bool, sid: str, shard: str, name: str,
            split: str) -> tuple[Pair | None, str]:
    """(pair, "") or (None, drop reason) of one sample's members."""
    if repeated:
        return None, "duplicate_key"
    if cut:
        return None, "unreadable_member"
    img_m = next((members[e] for e in IMAGE_EXTS if e in members), None)
    if "txt" not in members:
        return None, "empty_caption"
    try:
        raw_caption = _read_at(f, members["txt"])
        data = _read_at(f, img_m) if img_m is not None else None
    except (OSError, EOFError):
        return None, "unreadable_member"
    if len(raw_caption) > 4 * MAX_CAPTION_CHARS:  # UTF-8: at most 4 bytes a character
        return None, "caption_too_long"
    try:
        caption = decode_caption(raw_caption)
    except CaptionError as err:
        return None, err.reason
    if len(caption) > MAX_CAPTION_CHARS:
        return None, "caption_too_long"
    reason = _image_reason(data)
    if reason:
        return None, reason
    return Pair(sid, f"{shard}{SEP}{img_m.name}", caption, name, "", hashlib.sha256(data).hexdigest(), split=split,
                offset=img_m.offset_data, size=img_m.size), ""


@dataclass
class Packed:
    """Scanned pairs as the prepare stage spills them: one Arrow record batch of the manifest schema (empty splits
    filled by the seeded id-hash rule) and their de-duplication keys (``protoclip.data.corpus.dedup.pair_keys``). Made
    where the pairs were scanned (a shard's worker process), so the stage's main process does no per-pair work."""
    batch: pa.RecordBatch
    keys: np.ndarray

    @classmethod
    def of(cls, pairs: list[Pair], split_rule: tuple[int, float]) -> "Packed":
        seed, fraction = split_rule
        for p in pairs:
            p.split = p.split or split_of(p.id, seed, fraction)
        return cls(pairs_batch(pairs), pair_keys(pairs))


def _scan_shard_star(args: tuple[str, str, str, tuple[int, float] | None]) -> ShardScan | tuple[collections.Counter, Packed]:
    """One shard's scan; with a split rule, its drop counts and its kept pairs packed (see :class:`Packed`)."""
    shard, name, split, split_rule = args
    res = scan_shard(shard, name, split)
    if split_rule is None:
        return res
    drops, pairs = collections.Counter(res.shard_drops), []
    for _sid, pair, reason in res.outcomes:
        if reason:
            drops[reason] += 1
        else:
            pairs.append(pair)
    return drops, Packed.of(pairs, split_rule)


def _ordered_map(pool: Executor | None, fn: Callable, jobs: list, window: int) -> Iterator:
    """``map(fn, jobs)`` in order, in ``pool`` with at most ``window`` jobs in flight (Executor.map submits every
    job at once and keeps every finished result until it is consumed: the whole corpus, for a slow consumer)."""
    if pool is None:
        yield from map(fn, jobs)
        return
    pending = collections.deque()
    for job in jobs:
        pending.append(pool.submit(fn, job))
        if len(pending) >= window:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


def wds_batches(cfg: UserDataConfig, drops: collections.Counter, num_workers: int = 1,
                split_rule: tuple[int, float] | None = None) -> Iterator[list[Pair] | Packed]:
    """The pairs of one webdataset shard set, one batch per shard; drops counted into ``drops``. With
    ``split_rule`` ((seed, held-out fraction)) each batch comes :class:`Packed` by the shard's worker.

    ``path`` is a shard pattern with brace ranges (``/data/cc3m/{00000..00331}.tar``); members sharing a key (the
    member path up to the first dot of its file name, webdataset's rule) form a sample; the image is the
    ``jpg``/``jpeg``/``png``/``webp`` member, the caption the ``txt`` member. Images are not extracted: the manifest
    path is ``<shard>::<member>`` and ``protoclip.data.loading.pairs`` reads the member by random access.

    Every sample (distinct key of a shard) ends up as a pair or in one drop count; a shard that cannot
    be opened or listed counts once (missing_file / undecodable_shard). A key that repeats a member
    (two ``0001.jpg``, or a second ``0001.txt``) is ambiguous, since webdataset would split it into two samples
    with one id; it is dropped as ``duplicate_key``. A cut shard keeps the samples before the cut; the sample
    at the cut (its members may be incomplete) is dropped as ``unreadable_member``.

    Shards are scanned by ``num_workers`` processes (one shard a task) and merged in shard order, so the
    pairs and counts do not depend on ``num_workers``. A sample id (``<name>/<shard file name>/<key>``) can repeat
    only between shards of the same file name (a pattern over several folders, a shard listed twice): the ids of
    those shards alone are remembered (their outcomes come back unpacked), and a repeat is dropped as
    ``duplicate_id``.
    """
    shards = expand_shards(cfg.path)
    names = collections.Counter(Path(s).name for s in shards)
    seen: dict[str, set[str]] = {n: set() for n, k in names.items() if k > 1}
    jobs = [(s, cfg.name, _pair_split(cfg), None if Path(s).name in seen else split_rule) for s in shards]
    bar = dict(total=len(jobs), desc=cfg.name, unit="shard", leave=False)
    with contextlib.ExitStack() as stack:
        pool = None
        if num_workers > 1 and len(jobs) > 1:
            pool = stack.enter_context(ProcessPoolExecutor(max_workers=min(num_workers, len(jobs))))
        for shard, res in tqdm(zip(shards, _ordered_map(pool, _scan_shard_star, jobs, 4 * num_workers)), **bar):
            if isinstance(res, tuple):  # packed by the worker
                drops.update(res[0])
                yield res[1]
                continue
            drops.update(res.shard_drops)
            ids = seen.get(Path(shard).name)
            batch = []
            for sid, pair, reason in res.outcomes:
                if ids is not None:
                    if sid in ids:
                        drops["duplicate_id"] += 1
                        continue
                    ids.add(sid)
                if reason:
                    drops[reason] += 1
                else:
                    batch.append(pair)
            yield batch if split_rule is None else Packed.of(batch, split_rule)


def scan_wds(cfg: UserDataConfig, num_workers: int = 1) -> tuple[list[Pair], collections.Counter]:
    """Every pair and the drop counts of one webdataset shard set (see :func:`wds_batches`), in one list."""
    drops: collections.Counter = collections.Counter()
    return [p for b in wds_batches(cfg, drops, num_workers) for p in b], drops


def user_batches(cfg: UserDataConfig, drops: collections.Counter, num_workers: int = 1, scratch: Path | None = None,
                 malformed: list[Malformed] | None = None) -> Iterable[list[Pair]]:
    """The pairs of one user data set in batches (CSV/TSV or webdataset)."""
    if cfg.format == "wds":
        return wds_batches(cfg, drops, num_workers)
    return csv_batches(cfg, drops, scratch, malformed)


def packed_batches(cfg: UserDataConfig, drops: collections.Counter, split_rule: tuple[int, float],
                   num_workers: int = 1, scratch: Path | None = None,
                   malformed: list[Malformed] | None = None) -> Iterator[Packed]:
    """:func:`user_batches` as :class:`Packed` batches (webdataset: packed by the scan workers)."""
    if cfg.format == "wds":
        yield from wds_batches(cfg, drops, num_workers, split_rule)
        return
    for batch in csv_batches(cfg, drops, scratch, malformed):
        yield Packed.of(batch, split_rule)


def scan_user_data(cfg: UserDataConfig, num_workers: int = 1) -> tuple[list[Pair], collections.Counter]:
    drops: collections.Counter = collections.Counter()
    return [p for b in user_batches(cfg, drops, num_workers) for p in b], drops


def input_files(cfg: UserDataConfig) -> list[Path]:
    """The files whose stats fingerprint this data set (the CSV/TSV, or every shard)."""
    return [Path(cfg.path)] if cfg.format != "wds" else [Path(s) for s in expand_shards(cfg.path)]


def absent_reason(cfg: UserDataConfig) -> str | None:
    """None when some file of the data set exists, else one line saying that none does (a user who has not got
    this corpus: its runs are skipped, protoclip.project.ProjectConfig.runs_without_data)."""
    if any(p.is_file() for p in input_files(cfg)):
        return None
    return f"{cfg.name}: no file of {cfg.path} exists"


def image_stats_digest(cfg: UserDataConfig) -> str:
    """sha256 over (path, size, mtime_ns) of every image path a CSV/TSV names, in row order (absent: null).

    Part of prepare's fingerprint: replacing, adding or deleting an image the file points to makes the
    prepared data stale even though the CSV itself is unchanged. Rows are read as the scan reads them
    (:class:`CaptionRows`); a file the scan cannot use gives a marker instead of a digest (the scan then
    reports the file).
    """
    h = hashlib.sha256()
    try:
        with CaptionRows(cfg, quiet=True) as rows:
            for row in rows:
                st = None
                if row.image and "\x00" not in row.image:
                    try:
                        st = os.stat(rows.image_path(row.image))
                    except (OSError, ValueError):
                        pass
                h.update(repr((row.image, st.st_size if st else None, st.st_mtime_ns if st else None)).encode(
                    "utf-8", "surrogateescape"))
    except (OSError, ValueError) as err:  # ConfigError is a ValueError
        return f"unreadable: {type(err).__name__}"
    return h.hexdigest()


__all__ = ["DROP_RULES", "IMAGE_EXTS", "SEP", "CSV_BATCH", "ShardScan", "Packed", "expand_shards", "csv_batches",
           "wds_batches", "absent_reason", "user_batches", "packed_batches", "scan_csv", "scan_shard", "scan_wds",
           "scan_user_data", "input_files", "image_stats_digest"]
