"""Atomic, durable writes: a killed stage never leaves a half-written output that Snakemake or DVC would trust,
and after a power loss a file reads back old or new, never empty.

The file is fsynced before the rename and its folder after it: without the first, ext4 (``data=writeback``),
XFS and others may persist the rename before the data. Cost: bench/bench_fsync.py.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import re
import tempfile
from contextlib import contextmanager
import io
from pathlib import Path
from typing import Any, Iterator

log = logging.getLogger(__name__)

# what atomic_path's mkstemp makes: ".<name>.<8 random chars>.tmp<suffixes of name>"
TEMP_NAME = re.compile(r"\..+\.[A-Za-z0-9_]{8}\.tmp(\..*)?")


def fsync_path(path: str | Path, folder: bool = False) -> None:
    """``fsync`` a written file, or a folder (its entries: a rename or a new file in it). A file system that
    cannot sync a folder (some network and FUSE file systems answer EINVAL) is left as it is."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if folder else 0))
    try:
        os.fsync(fd)
    except OSError as err:
        if not folder or err.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def durable_replace(tmp: str | Path, path: str | Path, durable: bool = True) -> None:
    """Rename the written file ``tmp`` onto ``path`` (same folder), its data and the rename on disk first."""
    if durable:
        fsync_path(tmp)
    os.replace(tmp, path)
    if durable:
        fsync_path(Path(path).parent, folder=True)


@contextmanager
def atomic_path(path: str | Path, durable: bool = True) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` only if the block succeeds (``durable``:
    with :func:`durable_replace`'s fsyncs; False only to measure what they cost)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp" + "".join(path.suffixes), dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp_path, 0o666 & ~umask)  # mkstemp makes 0600 files; outputs get the usual permissions
    try:
        yield tmp_path
        durable_replace(tmp_path, path, durable)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def write_json(path: str | Path, obj: Any) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
    return Path(path)


def write_text(path: str | Path, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def clean_stale_temps(folder: str | Path, recursive: bool = True) -> list[Path]:
    """Delete the temp files :func:`atomic_path` left behind when a process was killed mid-write.

    Call it when a stage starts, on the folders only that stage writes: the stage's own earlier
    (killed) run is the only writer such a temp file can belong to, because Snakemake and DVC never run
    one stage twice at once. Returns the paths removed.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = folder.rglob(".*.tmp*") if recursive else folder.glob(".*.tmp*")
    removed = []
    for path in sorted(found):
        if TEMP_NAME.fullmatch(path.name) and (path.is_file() or path.is_symlink()):
            path.unlink(missing_ok=True)
            removed.append(path)
    if removed:
        log.info("removed %d stale temp file(s) of a killed write under %s (first: %s)", len(removed), folder,
                 removed[0].name)
    return removed


def clean_stale_temps_of(outputs: list[str | Path]) -> list[Path]:
    """Delete the temp files :func:`atomic_path` left beside these output files when a write was killed.

    For a stage whose folder other stages write into too (a run folder holds train's files and, under
    ``eval/``, evaluate's): only the temp names of its own outputs are touched. Returns the paths removed.
    """
    removed = []
    for out in map(Path, outputs):
        if not out.parent.is_dir():
            continue
        own = re.compile(re.escape(f".{out.name}.") + r"[A-Za-z0-9_]{8}\.tmp" + re.escape("".join(out.suffixes)))
        for path in sorted(out.parent.iterdir()):
            if own.fullmatch(path.name) and (path.is_file() or path.is_symlink()):
                path.unlink(missing_ok=True)
                removed.append(path)
    if removed:
        log.info("removed %d stale temp file(s) of a killed write (first: %s)", len(removed), removed[0])
    return removed


def save_torch(path: str | Path, obj: Any) -> Path:
    """``torch.save(obj)`` to ``path`` atomically and byte-deterministically.

    ``torch.save(obj, filename)`` names the zip records after the file (``<tmpname>/data.pkl``), and our atomic
    writes use a random temp name, so the same weights gave different bytes every time (a change for DVC and
    any content-addressed store). Saving to a buffer uses the fixed record prefix ``archive/``: same object,
    same bytes (tests/unit/test_determinism.py).
    """
    import torch  # heavy: torch, only when tensors are saved

    buf = io.BytesIO()
    torch.save(obj, buf)
    with atomic_path(path) as tmp:
        tmp.write_bytes(buf.getvalue())
    return Path(path)
