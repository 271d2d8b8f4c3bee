"""Reading the manifest as a torch Dataset of (image, tokens, id): :func:`load_manifest`, :class:`ImageTextDataset`.

Per-row data lives in flat numpy buffers (:class:`StringColumn`), not Python lists, so that DataLoader workers'
memory stays flat; images are read by :mod:`protoclip.data.loading.reading`.
"""
from __future__ import annotations

from typing import Callable, Iterable, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import torch
from PIL import Image
from torch.utils.data import Dataset

from protoclip.errors import ConfigError
from protoclip.data.loading.reading import SEP, TarCache, read_checked, read_image  # noqa: F401  (re-exported)
from protoclip.data.loading.manifest import absolute_paths, manifest_sources, read_manifest
from protoclip.data.loading.transforms import image_form
from protoclip.files.layout import Layout


def load_manifest(layout: Layout, sources: Iterable[str] | None = None, split: str | None = None,
                  columns: list[str] | None = None) -> pd.DataFrame:
    """The manifest with absolute paths, optionally filtered by source(s) and split (index reset); ``columns``:
    read only those. The filters apply while the file is read (row group by row group): a run on one source of a
    large corpus never holds the others' rows."""
    if split is not None and split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    filters = []
    if sources is not None:
        sources = [sources] if isinstance(sources, str) else list(sources)
        have = manifest_sources(layout.manifest)
        if not have:
            raise ConfigError(f"{layout.manifest}: the manifest has no pairs (every input was dropped? see "
                              f"{layout.prepare_report})")
        unknown = set(sources) - set(have)
        if unknown:
            raise ConfigError(f"{layout.manifest}: no pairs of source(s) {sorted(unknown)} (it has "
                              f"{sorted(have)}); rerun `protoclip prepare` after adding user data")
        filters.append(("source", "in", sources))
    if split is not None:
        filters.append(("split", "==", split))
    df = read_manifest(layout.manifest, columns, filters or None)
    if len(df) == 0 and not filters:
        raise ConfigError(f"{layout.manifest}: the manifest has no pairs (every input was dropped? see "
                          f"{layout.prepare_report})")
    df = df.reset_index(drop=True)
    if "path" in df.columns and len(df):
        # only the relative paths (rendered images: not starting with "/") go through absolute_paths' pathlib rule;
        # the user data's absolute ones are never turned into Python strings
        relative = ~df["path"].str.startswith("/").to_numpy(dtype=bool)
        if relative.any():
            df.loc[relative, "path"] = absolute_paths(df.loc[relative, "path"].tolist(), layout.prepared)
    return df


def release_unused_memory() -> None:
    """Give back the memory Arrow's allocator keeps after a large read (mimalloc keeps freed pages for reuse).

    After the manifest of a million pairs was read into a dataset about 450 MB stayed resident in a training process
    that DataLoader workers then fork from; this returns it to the system."""
    pa.default_memory_pool().release_unused()


class StringColumn:
    """An immutable column of strings in two numpy arrays: the UTF-8 bytes of all rows, and row offsets.

    ``col[i] -> str``; ``len(col)``. Built through Arrow (its large_string layout is exactly this), so a
    million rows take one pass in C, not a Python loop.

    Not a Python list of ``str``: a DataLoader worker forked from the trainer reads rows without touching a
    reference count, so the parent's pages stay shared (PyTorch's copy-on-read problem, pytorch/pytorch#13246:
    with lists every worker's private memory grows by the size of the list over an epoch).
    """

    def __init__(self, values: Sequence[str] | pd.Series):
        arr = pa.array(pd.Series(values, dtype="string").fillna(""), type=pa.large_string())
        if isinstance(arr, pa.ChunkedArray):  # pandas' Arrow-backed strings come chunked
            arr = arr.combine_chunks()
        _validity, offsets, data = arr.buffers()
        offs = np.frombuffer(offsets, dtype=np.int64)[arr.offset: arr.offset + len(arr) + 1]  # a slice starts later
        raw = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)
        self.offsets = offs - offs[0]  # copies: nothing of Arrow's buffers stays referenced
        self.data = raw[offs[0]: offs[-1]].copy()

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> str:
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        i = i % len(self)
        return self.data[self.offsets[i]: self.offsets[i + 1]].tobytes().decode("utf-8")

    def tolist(self) -> list[str]:
        return [self[i] for i in range(len(self))]


TOKEN_CACHE_ROWS = 250_000  # frames up to this size keep their captions' tokens (77 MB as int32); larger: per item


class ImageCache:
    """Decoded RGB images kept by row, their uint8 pixels in one buffer of ``max_bytes`` (its pages taken as they
    are written, so memory grows by what is kept, without the fragments of one allocation per image), first come
    first kept (no eviction: with random episodes every row is as likely to come back). 0 keeps none. A read
    gets a new PIL image of the kept pixels, so no transform can change what the next read sees."""

    def __init__(self, max_bytes: int = 0):
        self.max_bytes = max_bytes
        self.nbytes = 0
        self.rows: dict[int, tuple[int, int, int]] = {}  # row -> (offset, height, width)
        self._pixels: np.ndarray | None = None

    def get(self, i: int) -> Image.Image | None:
        if (at := self.rows.get(i)) is None:
            return None
        offset, h, w = at
        return Image.fromarray(self._pixels[offset: offset + h * w * 3].reshape(h, w, 3))

    def put(self, i: int, image: Image.Image) -> None:
        size = image.width * image.height * 3
        if not self.max_bytes or self.nbytes + size > self.max_bytes:
            return
        if self._pixels is None:
            self._pixels = np.empty(self.max_bytes, np.uint8)
        self._pixels[self.nbytes: self.nbytes + size] = np.asarray(image).reshape(-1)
        self.rows[i] = (self.nbytes, image.height, image.width)
        self.nbytes += size


class ImageTextDataset(Dataset):
    """``ds[i] -> (transform(image), tokens LongTensor[context_length], id)`` over a manifest frame.

        df = load_manifest(layout, split="train")
        ds = ImageTextDataset(df, train_transform(64, "protoclip"), open_clip.get_tokenizer("RN50"))
        image, tokens, sample_id = ds[0]

    Paths are plain files or ``<shard.tar>::<member>`` (webdataset user data), read by
    :mod:`protoclip.data.loading.reading`; an image that changed or vanished since ``prepare`` stops the stage with
    one line naming it.
    Optional columns: ``offset`` / ``size`` (where a tar member's bytes lie; read with one ``pread``) and
    ``sha256`` (checked whenever the file is read: a changed image stops the stage, see
    ``protoclip.data.loading.reading``).
    Captions are tokenized once, in one batch, where the frame has at most ``token_cache_rows`` rows (int32, 77
    tokens: 308 bytes a row, shared with forked workers), instead of again every epoch; larger frames (user data
    of millions of pairs) tokenize per item so that memory stays flat. The tokens are the same either way.
    ``image_cache_bytes``: decoded images kept in this process (:class:`ImageCache`), so that a corpus that fits
    is read, checked and decoded once per run instead of once per pass; the transforms (and their random draws)
    still run on every read, on a copy, so the items are the same either way.
    """

    def __init__(self, df: pd.DataFrame, transform: Callable, tokenizer: Callable,
                 token_cache_rows: int = TOKEN_CACHE_ROWS, image_cache_bytes: int = 0):
        missing = {"id", "path", "caption"} - set(df.columns)
        if missing:
            raise ValueError(f"manifest frame lacks columns {sorted(missing)}")
        self.ids = StringColumn(df["id"])
        self.paths = StringColumn(df["path"])
        self.captions = StringColumn(df["caption"])
        self.sha256 = StringColumn(df["sha256"]) if "sha256" in df.columns else None
        n = len(df)
        self.offsets = df["offset"].to_numpy(np.int64) if "offset" in df.columns else np.full(n, -1, np.int64)
        self.sizes = df["size"].to_numpy(np.int64) if "size" in df.columns else np.full(n, -1, np.int64)
        self.transform = transform
        self.reads_stored = image_form(transform).stored  # the transform takes the file (decode_on: device)
        self.tokenizer = tokenizer
        self._tokens = (torch.as_tensor(tokenizer(df["caption"].tolist())).to(torch.int32)
                        if 0 < n <= token_cache_rows else None)
        self._tars = TarCache()
        self._images = ImageCache(image_cache_bytes)

    def __len__(self) -> int:
        return len(self.ids)

    def image(self, i: int):
        """Row ``i``'s image (RGB PIL), before the transform."""
        image = self._images.get(i)
        if image is None:
            image = read_image(self.paths[i], self._tars, int(self.offsets[i]), int(self.sizes[i]),
                               self.sha256[i] if self.sha256 is not None else None)
            self._images.put(i, image)
        return image

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, str]:
        if self.reads_stored:  # decoded on the training device (train.decode_on)
            return self.transform(self.stored(i)), self.tokens(i), self.ids[i]
        image = self.transform(self.image(i))
        return image, self.tokens(i), self.ids[i]

    def stored(self, i: int) -> bytes:
        """Row ``i``'s image file as stored (checked against the manifest's sha256), not decoded."""
        return read_checked(self.paths[i], self._tars, int(self.offsets[i]), int(self.sizes[i]),
                            self.sha256[i] if self.sha256 is not None else None)

    def tokens(self, i: int) -> torch.Tensor:
        """Row ``i``'s caption tokens, LongTensor[context_length]."""
        if self._tokens is not None:
            return self._tokens[i].long()
        tokens = self.tokenizer([self.captions[i]])
        return torch.as_tensor(tokens[0] if getattr(tokens, "ndim", 1) == 2 else tokens, dtype=torch.long)


__all__ = ["ImageCache", "ImageTextDataset", "StringColumn", "load_manifest", "manifest_sources", "read_image",
           "release_unused_memory"]
