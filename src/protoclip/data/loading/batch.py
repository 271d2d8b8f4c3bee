"""The training batch: what the run's loader (:mod:`protoclip.train.loader`) yields and the training step reads.

:func:`collate` stacks ``(image, tokens, position)`` items into a :class:`Batch` with named fields, so that no reader
of a batch guesses what it holds.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

import torch
from torch.utils.data import default_collate

from protoclip.data.loading.transforms import ImageForm, normalize_batch


@dataclass(frozen=True)
class Batch:
    """One batch of training items, in episode order (this rank's share)."""

    views: tuple[torch.Tensor, ...]  # [B, 3, H, W] per view: uint8 (normalised on the device) or float; () if stored
    tokens: torch.Tensor  # [B, context length] token ids
    positions: torch.Tensor  # [B] int64 episode positions, on the host
    multi: bool = False  # the method reads the list of views (its MultiView), not one tensor
    stored: tuple[bytes, ...] = ()  # the stored files (decode_on: device) until the loader decodes them

    def __len__(self) -> int:
        return len(self.positions)

    @property
    def images(self) -> torch.Tensor | list[torch.Tensor]:
        """What the method's forward takes: the one view, or the list of views of a multi-view method."""
        return list(self.views) if self.multi else self.views[0]

    def with_views(self, views: Sequence[torch.Tensor]) -> "Batch":
        """The same items with these images (decoded: no stored files left)."""
        return replace(self, views=tuple(views), stored=())

    def on_device(self, device: torch.device, memory_format: torch.memory_format = torch.preserve_format) -> "Batch":
        """Views and tokens on ``device``, the uint8 views normalised there
        (:func:`~protoclip.data.loading.transforms.normalize_batch`; float views pass unchanged); positions stay."""
        views = tuple(normalize_batch(v.to(device, non_blocking=True, memory_format=memory_format))
                      for v in self.views)
        return replace(self, views=views, tokens=self.tokens.to(device, non_blocking=True))

    def pin_memory(self) -> "Batch":
        """Pinned host tensors (the DataLoader's ``pin_memory`` calls this)."""
        return replace(self, views=tuple(v.pin_memory() for v in self.views), tokens=self.tokens.pin_memory(),
                       positions=self.positions.pin_memory())


def collate(items: list[tuple[Any, torch.Tensor, int]], form: ImageForm) -> Batch:
    """Items ``(image, tokens, position)`` whose images have ``form`` -> one :class:`Batch` (each field stacked
    as torch's default collate stacks it, in shared memory inside a worker).

    What an item's image is follows from the training transform and is fixed for a run
    (:class:`~protoclip.data.loading.transforms.ImageForm`): one tensor (``train_transform``'s uint8 CHW, or a float
    one), a tuple of ``views`` tensors (:class:`~protoclip.data.loading.transforms.MultiView`, e.g. PCL's query, key
    and centre crop) or the stored file's bytes (:class:`~protoclip.data.loading.transforms.EncodedImage`,
    ``train.decode_on: device``).
    """
    images = [item[0] for item in items]
    tokens, positions = default_collate([item[1] for item in items]), default_collate([item[2] for item in items])
    if form.stored:
        return Batch((), tokens, positions, stored=tuple(images))
    if form.views == 1:
        return Batch((default_collate(images),), tokens, positions)
    if any(len(image) != form.views or image[0].dim() != 3 for image in images):
        raise ValueError(f"training items must give {form.views} image views each (the method's MultiView)")
    return Batch(tuple(default_collate([image[v] for image in images]) for v in range(form.views)), tokens,
                 positions, multi=True)


__all__ = ["Batch", "collate"]
