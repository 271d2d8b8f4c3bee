"""Resumable image-feature extraction: a split's features written in chunks to a work folder outside the evaluation
job's outputs, so that a killed job continues where it stopped instead of starting over.

    z, h, y = encode_images_resumable(model, split, transform, device, batch_size=256, desc="imagenet train",
                                      folder=layout.eval_progress(run, "imagenet") / "train", chunk_batches=16)
"""
from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from tqdm import tqdm

from protoclip.files.atomic import atomic_path, clean_stale_temps, write_json
from protoclip.evaluate.batches import image_batches
from protoclip.evaluate.datasets import ImageSplit

log = logging.getLogger(__name__)

CHUNK = "chunk_{:05d}.npz"


class ExtractionProgress:
    """A set's work folder, valid for one ``key`` (the feature cache key: model file hash, data, subsample; and the
    chunk size): a folder left by another model or data set is removed before anything is reused, and the whole
    folder is removed once the set's feature file is written.

    The folder (``results/runs/<run>/checkpoints/eval/<set>/``, beside the training checkpoints) is no workflow
    output: Snakemake deletes a failed job's outputs, and with them anything written inside them."""

    def __init__(self, folder: str | Path, key: dict[str, Any]):
        self.folder, self.key = Path(folder), key
        self._key_file = self.folder / "key.json"

    def open(self) -> "ExtractionProgress":
        """Keep the folder if it was written for ``key``, else start it afresh."""
        stored = None
        if self._key_file.is_file():
            try:
                stored = json.loads(self._key_file.read_text())
            except (OSError, ValueError):
                stored = None
        if stored != json.loads(json.dumps(self.key, sort_keys=True)):
            if self.folder.exists():
                log.info("%s: left by another model or data set; starting the extraction afresh", self.folder)
                shutil.rmtree(self.folder)
            self.folder.mkdir(parents=True)
            write_json(self._key_file, self.key)
        else:
            clean_stale_temps(self.folder)  # a chunk whose write was killed
        return self

    def part(self, name: str) -> Path:
        """The folder of one split's chunks (``test``, ``train``, ``caption_images``)."""
        return self.folder / name

    def remove(self) -> None:
        """The extraction is complete (its feature file written): its chunks are no longer needed."""
        shutil.rmtree(self.folder, ignore_errors=True)


class _MapTail:
    """Items ``start:`` of a map-style split (what the DataLoader path of ``image_batches`` needs)."""

    def __init__(self, split: ImageSplit, start: int):
        self.split, self.start = split, start

    def __len__(self) -> int:
        return len(self.split) - self.start

    def __getitem__(self, i: int):
        return self.split[self.start + i]  # type: ignore[index]


class _IterTail:
    """Items ``start:`` of an iterable split (webdataset): the skipped ones are read, not encoded."""

    def __init__(self, split: ImageSplit, start: int):
        self.split, self.start = split, start

    def __len__(self) -> int:
        return len(self.split) - self.start

    def __iter__(self):
        for i, item in enumerate(self.split):
            if i >= self.start:
                yield item


def _chunk_rows(path: Path, rows: int) -> bool:
    """Whether ``path`` is a whole chunk of ``rows`` rows (a chunk that cannot be read is redone)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            return all(z[k].shape[0] == rows for k in ("z", "h", "y"))
    except Exception:  # noqa: BLE001  missing, cut or foreign (OSError, BadZipFile, KeyError ...): redo it
        return False


def _write_chunk(path: Path, parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.savez(f, z=np.concatenate([p[0] for p in parts]), h=np.concatenate([p[1] for p in parts]),
                 y=np.concatenate([p[2] for p in parts]))


@torch.inference_mode()  # as encode_images: no autograd bookkeeping, same values
def encode_images_resumable(model: Any, split: ImageSplit, transform: Callable, device: torch.device,
                            batch_size: int, desc: str, num_workers: int, folder: Path,
                            chunk_batches: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(z [N, d], h [N, d_h], labels [N])`` of every image of ``split``, as
    :func:`protoclip.evaluate.features.encode_images` returns them, extracted chunk by chunk into ``folder`` (whole
    chunks found there are kept, not encoded again).

    Each chunk holds ``chunk_batches`` whole batches (``chunk_NNNNN.npz``: ``z``, ``h``, ``y``), written atomically;
    a restarted job keeps the chunks before the first missing or unreadable one and encodes from there. Chunks are
    whole batches, so a resumed extraction feeds the model exactly the batches an uninterrupted one does, and on the
    same machine gives the same bits (tests/e2e/test_eval_resume.py kills a real evaluation and compares)."""

    n, per_chunk = len(split), batch_size * chunk_batches
    n_chunks = -(-n // per_chunk)
    if n == 0:
        raise ValueError(f"{desc}: no images")
    folder.mkdir(parents=True, exist_ok=True)
    kept = 0
    while kept < n_chunks and _chunk_rows(folder / CHUNK.format(kept), min(per_chunk, n - kept * per_chunk)):
        kept += 1
    for stale in folder.glob("chunk_*.npz"):  # after a missing or broken chunk nothing is trusted
        if int(stale.stem.split("_")[1]) >= kept:
            stale.unlink()
    start = kept * per_chunk
    if kept:
        log.info("%s: resumed: %d of %d images were extracted before (%d of %d chunks in %s)", desc, min(start, n),
                 n, kept, n_chunks, folder)
    if start < n:
        tail = (_MapTail if hasattr(split, "__getitem__") else _IterTail)(split, start)
        c, parts = kept, []
        with tqdm(total=n, initial=start, desc=desc, unit="img", leave=False) as bar:
            for x, y in image_batches(tail, transform, batch_size, num_workers):  # type: ignore[arg-type]
                z = model.encode_image(x.to(device))
                parts.append((z.float().cpu().numpy(), model.image_head(z).float().cpu().numpy(),
                              y.long().numpy()))
                bar.update(len(y))
                if len(parts) == chunk_batches:
                    _write_chunk(folder / CHUNK.format(c), parts)
                    c, parts = c + 1, []
            if parts:
                _write_chunk(folder / CHUNK.format(c), parts)
    zs, hs, ys = [], [], []
    for c in range(n_chunks):
        with np.load(folder / CHUNK.format(c), allow_pickle=False) as z:
            zs.append(z["z"])
            hs.append(z["h"])
            ys.append(z["y"])
    return np.concatenate(zs), np.concatenate(hs), np.concatenate(ys)


__all__ = ["CHUNK", "ExtractionProgress", "encode_images_resumable"]
