"""Tux Paint stamps (Debian ``tuxpaint-stamps-default``): clip art and cut-out photos with English text.

One pair per stamp description (``.txt``), its first line as the caption; the rules are in :func:`scan_tuxpaint`.
"""
from __future__ import annotations

import collections
from pathlib import Path

from protoclip.data.corpus.captions import CaptionError, decode_caption
from protoclip.data.corpus.images import Candidate

SOURCE = "tuxpaint"
LICENCE = "GPL-2.0"
STAMPS_DIR = Path("usr/share/tuxpaint/stamps")


def first_line(data: bytes) -> str:
    """The first line of a stamp description; raises ``CaptionError`` if empty or not UTF-8."""
    return decode_caption(data.split(b"\n", 1)[0])


def coarse_label(rel: Path) -> str:
    """'animals/mammals/cats/x.txt' -> 'animals/mammals'; 'plants/x.txt' -> 'plants'."""
    return "/".join(rel.parent.parts[:2])


def scan_tuxpaint(unpacked: str | Path) -> tuple[list[Candidate], collections.Counter]:
    """Candidates (sorted by id) and drop counts from an unpacked ``tuxpaint-stamps-default``.

    Layout of the package: ``usr/share/tuxpaint/stamps/<category>/<sub>/.../<name>.{png,svg,txt,...}``.
    Each stamp's ``.txt`` starts with its English description ("A little rabbit."); later lines are
    translations (``fr.utf8=...``). One pair per ``.txt``:

    * caption = the first line of the ``.txt`` (whitespace-normalised);
    * image = ``<name>.png`` if present, else ``<name>.svg`` (Tux Paint itself prefers the PNG when both
      exist; 83 stamps have both), else the stamp is dropped as ``no_image``;
    * coarse label = the top and second folder levels below ``stamps/`` ("animals/mammals"; a stamp
      directly in a top folder gets just "plants").
    """
    root = Path(unpacked) / STAMPS_DIR
    if not root.is_dir():
        raise FileNotFoundError(f"tuxpaint stamps folder not found: {root}")
    cands: list[Candidate] = []
    drops: collections.Counter = collections.Counter()
    for txt in sorted(root.rglob("*.txt")):
        rel = txt.relative_to(root)
        try:
            caption = first_line(txt.read_bytes())
        except CaptionError as err:
            drops[err.reason] += 1
            continue
        png, svg = txt.with_suffix(".png"), txt.with_suffix(".svg")
        if png.exists():
            img, kind = png, "raster"
        elif svg.exists():
            img, kind = svg, "svg"
        else:
            drops["no_image"] += 1
            continue
        cands.append(Candidate(id=f"{SOURCE}/{rel.with_suffix('').as_posix()}", source=SOURCE, kind=kind,
                               src=str(img), caption=caption, label=coarse_label(rel), licence=LICENCE))
    return cands, drops


__all__ = ["SOURCE", "scan_tuxpaint", "first_line", "coarse_label"]
