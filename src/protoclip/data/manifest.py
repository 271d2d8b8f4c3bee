"""The manifest of image-caption pairs: records, de-duplication, parquet I/O.

Columns (docs/architecture.md): ``id`` (unique), ``path`` (a file, or ``shard.tar::member``),
``caption``, ``source``, ``label`` (coarse, may be empty), ``sha256`` (of the image bytes), ``split``
(``train`` / ``heldout``), plus ``licence``. Paths of rendered images are stored relative to
``layout.prepared`` (so a moved or DVC-restored data folder stays valid); :func:`absolute_paths` makes them
absolute again (the one rule, for training's ``load_manifest`` and the evaluation of the held-out pairs).
User-data paths are stored absolute.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from protoclip.atomic import atomic_path
from protoclip.data.reading import SEP
from protoclip.errors import ConfigError

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
    # column by column (not dataclasses.asdict per pair, a recursive deep copy: ~5 s per million pairs)
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
    manifest (``layout.prepared``); an absolute one (user data, ``shard.tar::member``) is kept."""
    root = Path(root).resolve()
    return [p if Path(p.split(SEP, 1)[0]).is_absolute() else str(root / p) for p in paths]


def read_manifest(path: str | Path) -> pd.DataFrame:
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"manifest not found: {p} (run `protoclip prepare` first)")
    try:
        df = pd.read_parquet(p)
    except Exception as err:  # noqa: BLE001  pyarrow raises several types for a cut or foreign file
        raise ConfigError(f"{p}: not a readable manifest ({type(err).__name__}: {str(err)[:200]}); rebuild it "
                          "with `protoclip prepare`") from None
    missing = [c for c in ("id", "path", "caption", "source", "split") if c not in df.columns]  # what readers use
    if missing:
        raise ConfigError(f"{p}: not a manifest of this version (missing columns {missing}); rebuild it with "
                          "`protoclip prepare`")
    return df


__all__ = ["COLUMNS", "INT_COLUMNS", "Pair", "deduplicate", "to_frame", "write_manifest", "read_manifest",
           "absolute_paths"]
