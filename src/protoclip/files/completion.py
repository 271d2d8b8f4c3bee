"""Completion markers: a stage's output folder counts as complete only when its marker says so.

Each file is written atomically, but a stage killed between two files of one folder (``evaluate``: one metrics
file per task) leaves it half done, and a reader would take the files that exist for the whole. The marker, written
last with every file's sha256, also covers what Snakemake and DVC cannot see: a stage run by hand, a folder damaged
after its job finished.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from protoclip.files.atomic import clean_stale_temps, write_json
from protoclip.errors import UserError
from protoclip.files.hashing import sha256_file

FILES_KEY = "complete_files"  # {file name in the folder: sha256} in the marker


class IncompleteOutputError(UserError):
    """A stage output that is missing its completion marker, or whose files changed after it was written."""

    kind = "incomplete output"


class RecordError(UserError):
    """A JSON record file that cannot be read (empty, cut, not JSON, not an object); the message names it."""

    kind = "broken file"


def read_record(path: str | Path) -> dict[str, Any]:
    """The JSON object in ``path``; anything else stops with one line naming the file."""
    path = Path(path)
    data = path.read_bytes()
    if not data.strip():
        raise RecordError(f"{path}: empty file ({len(data)} bytes): its write was cut short; run its stage again")
    try:
        record = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise RecordError(f"{path}: not valid JSON ({type(err).__name__}: {str(err).splitlines()[0]}); "
                          "run its stage again") from None
    if not isinstance(record, dict):
        raise RecordError(f"{path}: a JSON {type(record).__name__}, not the JSON object a record is")
    return record


def start(folder: str | Path, marker: str | Path) -> dict[str, Any] | None:
    """Make ``folder`` incomplete before a stage writes into it (stale temps and the old marker removed); returns
    the old marker's record (or None). A writer calls ``start(folder, marker)``, writes the folder's files, then
    ``finish(marker, {"tasks": ...}, files)``; a reader lists them with ``complete_files(folder, marker)``."""
    folder, marker = Path(folder), Path(marker)
    clean_stale_temps(folder)
    old = None
    if marker.is_file():
        try:
            old = read_record(marker)
        except RecordError:
            old = None
        marker.unlink()
    return old


def finish(marker: str | Path, record: dict[str, Any], files: Iterable[str | Path]) -> Path:
    """Write ``marker`` (``record`` plus the sha256 of each of ``files``, all in the marker's folder) last."""
    marker = Path(marker)
    listed = {}
    for f in sorted({Path(f) for f in files}):
        if f.parent != marker.parent:
            raise ValueError(f"{f} is not in the marker's folder {marker.parent}")
        listed[f.name] = sha256_file(f)
    return write_json(marker, {**record, FILES_KEY: listed})


def vouched(old_marker: dict[str, Any] | None, folder: str | Path) -> dict[str, str]:
    """{file name: sha256} that ``old_marker`` (from :func:`start`) vouched for and that are still intact."""
    folder = Path(folder)
    out = {}
    for name, digest in ((old_marker or {}).get(FILES_KEY) or {}).items():
        path = folder / name
        if path.is_file() and sha256_file(path) == digest:
            out[name] = digest
    return out


def complete_files(folder: str | Path, marker: str | Path, pattern: str = "*.json") -> list[Path]:
    """The files of a stage output folder that its marker vouches for, sorted.

    No marker: [] when the folder holds no ``pattern`` file besides it, else :class:`IncompleteOutputError`
    (the stage was killed or failed half-way); a listed file missing or changed since: the same one-line error.
    """
    folder, marker = Path(folder), Path(marker)
    present = sorted(p for p in folder.glob(pattern) if p != marker and p.is_file())
    if not marker.is_file():
        if present:
            raise IncompleteOutputError(
                f"{folder}: incomplete: {len(present)} file(s) but no {marker.name} (its stage was killed or "
                f"failed half-way, e.g. {present[0].name}); run that stage again")
        return []
    listed = read_record(marker).get(FILES_KEY)
    if not isinstance(listed, dict):
        raise IncompleteOutputError(f"{marker}: lists no files ({FILES_KEY}); run its stage again")
    out = []
    for name, digest in sorted(listed.items()):
        path = folder / name
        if not path.is_file():
            raise IncompleteOutputError(f"{path}: listed in {marker} but missing; run its stage again")
        if sha256_file(path) != digest:
            raise IncompleteOutputError(f"{path}: changed after its stage completed (sha256 differs from "
                                        f"{marker.name}); run that stage again")
        out.append(path)
    return out


__all__ = ["FILES_KEY", "IncompleteOutputError", "RecordError", "complete_files", "finish", "read_record", "start",
           "vouched"]
