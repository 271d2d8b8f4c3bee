"""Reading the manifest as a torch Dataset of (image, tokens, id).

    from protoclip.data.pairs import load_manifest, ImageTextDataset
    df = load_manifest(layout, split="train")
    ds = ImageTextDataset(df, train_transform(64, "protoclip"), open_clip.get_tokenizer("RN50"))
    image, tokens, sample_id = ds[0]

Paths are plain files or ``<shard.tar>::<member>`` (webdataset user data); tar members are read by
random access through a per-worker cache of open ``TarFile`` objects (their member index is built
once per shard and process).
"""
from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path
from typing import Callable, Iterable

import pandas as pd
import torch
from PIL import Image
from torch.utils.data import Dataset

from protoclip.config import ConfigError
from protoclip.data.manifest import read_manifest
from protoclip.layout import Layout

SEP = "::"


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


class TarCache:
    """Open tar files per process (a DataLoader worker gets its own after fork/spawn)."""

    def __init__(self) -> None:
        self.pid = None
        self.tars: dict[str, tarfile.TarFile] = {}

    def read(self, shard: str, member: str) -> bytes:
        if self.pid != os.getpid():
            self.pid, self.tars = os.getpid(), {}
        tar = self.tars.get(shard)
        if tar is None:
            tar = self.tars[shard] = tarfile.open(shard)
        f = tar.extractfile(member)
        if f is None:
            raise FileNotFoundError(f"{shard}{SEP}{member}")
        return f.read()


def read_image(path: str, tars: TarCache | None = None) -> Image.Image:
    """Open a manifest path (file or ``shard.tar::member``) as an RGB PIL image."""
    if SEP in path:
        shard, member = path.split(SEP, 1)
        data = (tars or TarCache()).read(shard, member)
        img = Image.open(io.BytesIO(data))
    else:
        img = Image.open(path)
    img.load()
    return img.convert("RGB")


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
