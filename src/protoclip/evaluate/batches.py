"""A split's images as transformed batches, in split order: what every feature extraction reads
(:mod:`protoclip.evaluate.features`, and its resumable form :mod:`protoclip.evaluate.resumable`)."""
from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch.utils.data import DataLoader, Dataset

from protoclip.evaluate.datasets import ImageSplit


class _Transformed(Dataset):
    """A map-style split with the model's transform applied: ``[i] -> (tensor, label)``."""

    def __init__(self, split: ImageSplit, transform: Callable):
        self.split, self.transform = split, transform

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        img, y = self.split[i]  # type: ignore[index]
        return self.transform(img), int(y)


def image_batches(split: ImageSplit, transform: Callable, batch_size: int,
                  num_workers: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``(images [B,3,H,W], labels [B])`` in split order. Map-style splits (with ``__getitem__``) go through a
    DataLoader so decoding can use ``num_workers`` processes; iterable ones (webdataset) are read in-process."""
    if hasattr(split, "__getitem__"):
        yield from DataLoader(_Transformed(split, transform), batch_size=batch_size, shuffle=False,
                              num_workers=num_workers)
        return
    xs: list[torch.Tensor] = []
    ys: list[int] = []
    for img, y in split:
        xs.append(transform(img))
        ys.append(int(y))
        if len(xs) == batch_size:
            yield torch.stack(xs), torch.tensor(ys)
            xs, ys = [], []
    if xs:
        yield torch.stack(xs), torch.tensor(ys)
