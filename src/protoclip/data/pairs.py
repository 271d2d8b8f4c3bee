"""Reading the manifest as a torch Dataset of (image, tokens, id).

    from protoclip.data.pairs import load_manifest, ImageTextDataset
    df = load_manifest(layout, split="train")
    ds = ImageTextDataset(df, train_transform(64, "protoclip"), open_clip.get_tokenizer("RN50"))
    image, tokens, sample_id = ds[0]

Paths are plain files or ``<shard.tar>::<member>`` (webdataset user data), read by
:mod:`protoclip.data.reading` (a per-worker cache of open ``TarFile`` objects).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable

import pandas as pd
import torch
from torch.utils.data import Dataset

from protoclip.config import ConfigError
from protoclip.data.reading import SEP, TarCache, read_image  # noqa: F401  (re-exported)
from protoclip.data.manifest import read_manifest
from protoclip.layout import Layout


def load_manifest(layout: Layout, sources: Iterable[str] | None = None, split: str | None = None) -> pd.DataFrame:
    """The manifest with absolute paths, optionally filtered by source(s) and split (index reset)."""
    df = read_manifest(layout.manifest)
    if len(df) == 0:
        raise ConfigError(f"{layout.manifest}: the manifest has no pairs (every input was dropped? see "
                          f"{layout.prepare_report})")
    if sources is not None:
        sources = [sources] if isinstance(sources, str) else list(sources)
        unknown = set(sources) - set(df["source"].unique())
        if unknown:
            raise ConfigError(f"{layout.manifest}: no pairs of source(s) {sorted(unknown)} (it has "
                              f"{sorted(df['source'].unique())}); rerun `protoclip prepare` after adding user data")
        df = df[df["source"].isin(sources)]
    if split is not None:
        if split not in ("train", "heldout"):
            raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
        df = df[df["split"] == split]
    root = Path(layout.prepared).resolve()
    df = df.copy()
    df["path"] = [p if Path(p.split(SEP, 1)[0]).is_absolute() else str(root / p) for p in df["path"]]
    return df.reset_index(drop=True)


class ImageTextDataset(Dataset):
    """``ds[i] -> (transform(image), tokens LongTensor[context_length], id)`` over a manifest frame."""

    def __init__(self, df: pd.DataFrame, transform: Callable, tokenizer: Callable):
        missing = {"id", "path", "caption"} - set(df.columns)
        if missing:
            raise ValueError(f"manifest frame lacks columns {sorted(missing)}")
        self.ids = df["id"].astype(str).tolist()
        self.paths = df["path"].astype(str).tolist()
        self.captions = df["caption"].astype(str).tolist()
        self.transform = transform
        self.tokenizer = tokenizer
        self._tars = TarCache()

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, str]:
        image = self.transform(read_image(self.paths[i], self._tars))
        tokens = self.tokenizer([self.captions[i]])
        tokens = torch.as_tensor(tokens[0] if getattr(tokens, "ndim", 1) == 2 else tokens, dtype=torch.long)
        return image, tokens, self.ids[i]


__all__ = ["load_manifest", "read_image", "ImageTextDataset"]
