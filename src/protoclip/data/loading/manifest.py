"""The manifest of image-caption pairs: records, de-duplication, parquet I/O.

One row a pair (:data:`COLUMNS`, described in docs/architecture.md); :class:`ManifestWriter` streams a corpus into
the file in bounded memory, byte for byte the file :func:`write_manifest` writes for the whole frame.
"""
from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from protoclip.files.atomic import atomic_path
from protoclip.files.datafiles import PREPARE, reading
from protoclip.data.loading.reading import SEP
from protoclip.errors import ConfigError

# id (unique), path (a file, or shard.tar::member), caption, source, label (coarse, may be empty), sha256 (of the
# image bytes), split (train / heldout), licence, offset / size (a shard member's bytes)
COLUMNS = ["id", "path", "caption", "source", "label", "sha256", "split", "licence", "offset", "size"]
INT_COLUMNS = ("offset", "size")


@dataclass
class Pair:
    id: str
    path: str
    caption: str
    source: str
    label: str
    sha256: str
    licence: str = ""
    split: str = ""  # "" = decide with the seeded id-hash rule
    offset: int = -1  # byte offset of a tar member's data in its shard (-1: a plain file)
    size: int = -1  # its size in bytes (-1: a plain file)


def deduplicate(pairs: list[Pair]) -> tuple[list[Pair], dict[str, collections.Counter]]:
    """Keep the first of each id / image; later ones are dropped and counted per source.

    Reasons: ``duplicate_id`` (id seen before), ``duplicate_pair`` (same image bytes and caption as a
    kept pair), ``duplicate_image`` (same image bytes, other caption: one image, one pair, so the same
    picture can never sit in both the train and the held-out split).

    ``sha256`` is of the bytes the manifest points at: the rendered PNG for the offline sources (so
    identical drawings shipped twice are caught after rendering at the same size) and the original
    file for user data; a user image identical to a packaged drawing is therefore not detected.
    """
    kept: list[Pair] = []
    drops: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    ids: set[str] = set()
    images: dict[str, set[str]] = {}
    for p in pairs:
        if p.id in ids:
            drops[p.source]["duplicate_id"] += 1
        elif p.sha256 in images:
            drops[p.source]["duplicate_pair" if p.caption in images[p.sha256] else "duplicate_image"] += 1
        else:
            ids.add(p.id)
            images[p.sha256] = {p.caption}
            kept.append(p)
    return kept, dict(drops)


def to_frame(pairs: list[Pair]) -> pd.DataFrame:
    """Pairs -> manifest frame (string columns, in ``COLUMNS`` order)."""
    # column by column (not dataclasses.asdict per pair, a recursive deep copy per pair)
    return pd.DataFrame({c: [getattr(p, c) for p in pairs] for c in COLUMNS}, columns=COLUMNS).astype(
        {c: "int64" if c in INT_COLUMNS else "string" for c in COLUMNS})


def write_manifest(df: pd.DataFrame, path: str | Path) -> Path:
    missing = [c for c in ("id", "path", "caption", "source", "split") if c not in df.columns]  # what readers use
    if missing:
        raise ValueError(f"manifest is missing columns {missing}")
    if df["id"].duplicated().any():
        raise ValueError(f"manifest ids are not unique: {df['id'][df['id'].duplicated()].head().tolist()}")
    with atomic_path(path) as tmp:
        df[COLUMNS].to_parquet(tmp, index=False)
    return Path(path)


def absolute_paths(paths: Iterable[str], root: str | Path) -> list[str]:
    """Manifest paths made absolute: a relative path (a rendered image) is relative to ``root``, the folder of the
    manifest (``layout.prepared``); an absolute one (user data, ``shard.tar::member``) is kept.

    Rendered images are stored relative so that a moved or DVC-restored data folder stays valid; this is the one
    rule that makes them absolute again, for training's ``load_manifest`` and the evaluation of the held-out pairs.
    """
    root = Path(root).resolve()
    return [p if Path(p.split(SEP, 1)[0]).is_absolute() else str(root / p) for p in paths]


ROW_GROUP = 1024 * 1024  # rows a parquet row group: what pyarrow's write_table (so DataFrame.to_parquet) uses


def manifest_schema() -> pa.Schema:
    """The Arrow schema ``to_parquet`` gives a manifest frame (large strings, int64, pandas metadata)."""
    return pa.Schema.from_pandas(to_frame([])[COLUMNS], preserve_index=False)


def pairs_batch(pairs: Sequence[Pair], schema: pa.Schema | None = None) -> pa.RecordBatch:
    """Pairs -> one Arrow record batch of the manifest schema (column by column, no pandas)."""
    schema = schema or manifest_schema()
    return pa.RecordBatch.from_arrays([pa.array([getattr(p, c) for p in pairs], type=schema.field(c).type)
                                       for c in COLUMNS], schema=schema)


class ManifestWriter:
    """Append record batches of the manifest schema; the file appears (atomically) when the block ends.

        with ManifestWriter(layout.manifest) as w:
            for batch in batches:
                w.write(batch)

    Rows are regrouped into row groups of exactly ``ROW_GROUP`` rows (the last one shorter), each written as one
    contiguous table: the parquet writer then sees what ``write_table`` hands it for the whole frame, so the
    bytes are the same as :func:`write_manifest`'s (tested), and one row group is held at a time instead of the
    corpus. Ids are not checked for uniqueness here (that would hold every id): the caller
    de-duplicates (``protoclip.data.corpus.dedup``).
    """

    def __init__(self, path: str | Path, row_group: int | None = None):
        self.path, self.row_group = Path(path), row_group or ROW_GROUP
        self.schema = manifest_schema()
        self.rows = 0
        self._stack = contextlib.ExitStack()
        self._pending: list[pa.RecordBatch] = []
        self._n = 0

    def __enter__(self) -> "ManifestWriter":
        tmp = self._stack.enter_context(atomic_path(self.path))
        self._writer = pq.ParquetWriter(tmp, self.schema)
        self._stack.callback(self._writer.close)
        return self

    def write(self, batch: pa.RecordBatch) -> None:
        while batch.num_rows:  # cut at the row-group boundary: a flush writes everything pending
            take = min(batch.num_rows, self.row_group - self._n)
            self._pending.append(batch.slice(0, take))
            self._n += take
            batch = batch.slice(take)
            if self._n == self.row_group:
                self._flush()

    def _flush(self) -> None:
        table = pa.Table.from_batches(self._pending, schema=self.schema)
        self._pending, rows, self._n = [], self._n, 0
        for i, field in enumerate(self.schema):  # one contiguous array a column, one column at a time: the
            table = table.set_column(i, field, pa.concat_arrays(table.column(i).chunks))  # batches go as we go
        self._writer.write_table(table)
        self.rows += rows

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:  # close the writer and remove the temporary file: no manifest appears
            return self._stack.__exit__(exc_type, exc, tb)
        with self._stack:  # closed, then renamed onto the manifest (removed instead if the last flush fails)
            if self._n:
                self._flush()
            elif not self.rows:  # an empty manifest: to_parquet writes the schema and one empty row group
                self._writer.write_table(self.schema.empty_table())


def _open(p: Path) -> pq.ParquetFile:
    if not p.exists():
        raise FileNotFoundError(f"manifest not found: {p} (run `protoclip prepare` first)")
    with reading(p, "manifest", PREPARE):
        return pq.ParquetFile(p)


def _check_columns(p: Path, have: list[str], wanted: Iterable[str]) -> None:
    missing = [c for c in wanted if c not in have]
    if missing:
        raise ConfigError(f"{p}: not a manifest of this version (missing columns {missing}); rebuild it with "
                          "`protoclip prepare`")


def manifest_batches(path: str | Path, columns: list[str], batch_size: int = 65536):
    """The manifest's ``columns`` as Arrow record batches, in file order, without reading the whole file. A
    missing file: FileNotFoundError; an empty, cut or foreign one (also when the damage is found mid-file) or one
    without ``columns``: one line naming it and ``protoclip prepare`` (:mod:`protoclip.files.datafiles`)."""
    p = Path(path)
    f = _open(p)
    _check_columns(p, f.schema_arrow.names, columns)
    with f, reading(p, "manifest", PREPARE):
        yield from f.iter_batches(batch_size=batch_size, columns=columns)


def manifest_sources(path: str | Path) -> list[str]:
    """The sources a manifest holds (its ``source`` column read as a dictionary: a few bytes a row)."""
    p = Path(path)
    f = _open(p)
    _check_columns(p, f.schema_arrow.names, ["source"])
    with f, reading(p, "manifest", PREPARE):
        col = pq.read_table(p, columns=["source"], read_dictionary=["source"]).column("source")
    return sorted({str(v) for chunk in col.chunks for v in chunk.dictionary.to_pylist()
                   if len(chunk) and v is not None})


def read_manifest(path: str | Path, columns: list[str] | None = None, filters: list | None = None) -> pd.DataFrame:
    """The manifest as a frame (``columns``: only those, in that order; ``filters``: pyarrow's row filters, applied
    row group by row group while reading, so the unfiltered manifest is never held). Errors as
    :func:`manifest_batches`."""
    p = Path(path)
    names = _open(p).schema_arrow.names
    with reading(p, "manifest", PREPARE):
        df = pd.read_parquet(p, columns=[c for c in columns if c in names] if columns is not None else None,
                             filters=filters)
    _check_columns(p, list(df.columns), ("id", "path", "caption", "source", "split") if columns is None else columns)
    return df


__all__ = ["COLUMNS", "INT_COLUMNS", "ROW_GROUP", "Pair", "deduplicate", "to_frame", "write_manifest", "read_manifest",
           "absolute_paths", "manifest_schema", "pairs_batch", "manifest_batches", "manifest_sources", "ManifestWriter"]
