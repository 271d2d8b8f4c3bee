"""A training augmentation on the training device, batched (``train.augment_on`` / ``train.decode_on: device``).

The workers' augmentation (:mod:`protoclip.data.loading.transforms`) split so that the workers decode, crop and flip
(or only read the files) and :class:`DeviceAugment` does the rest on the device, a draw per image, as torchvision
computes it on tensors; its docstring lists how that differs from the PIL path.
"""
from __future__ import annotations

import hashlib
import logging
import math
import struct
from dataclasses import dataclass

import torch
from torchvision.io import ImageReadMode, decode_image, decode_jpeg
from torchvision.transforms import InterpolationMode
from torchvision.transforms import functional as TF
from torchvision.transforms.v2.functional._color import _hsv_to_rgb, _rgb_to_grayscale_image, _rgb_to_hsv

from protoclip.data.loading.transforms import (BLUR_P, CROP_ONLY, CROP_SCALE, GRAY_P, JITTER, JITTER_P, EncodedImage,
                                               Kind, blur_params, normalize_batch, normalize_unit, to_unit)

log = logging.getLogger(__name__)
JPEG_MAGIC = b"\xff\xd8"  # a JPEG file's first bytes (SOI marker)
CROP_RATIO = (3 / 4, 4 / 3)  # RandomResizedCrop's default aspect range

# the photometric steps of each kind, in its order (transforms.train_transform); crop-only kinds have none
ORDER: dict[str, tuple[str, ...]] = {"protoclip": ("jitter", "gray", "blur"), "simclr": ("jitter", "gray", "blur"),
                                     "mocov2": ("jitter", "gray", "blur"), "mocov1": ("gray", "jitter")}


def key_seed(key: tuple[int, ...]) -> int:
    """A 64-bit seed from a tuple of ints (BLAKE2b of their int64 bytes): the batches' generators here and the
    workers' per-item seeds (:func:`protoclip.train.loader.seed_item`)."""
    digest = hashlib.blake2b(struct.pack(f"<{len(key)}q", *key), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def _blend(a: torch.Tensor, b: torch.Tensor, ratio: torch.Tensor) -> torch.Tensor:
    """torchvision's ``_blend`` on float images with a ratio per image ([B, 1, 1, 1])."""
    return (a * ratio + b * (1.0 - ratio)).clamp_(0.0, 1.0)


def _gray(x: torch.Tensor) -> torch.Tensor:
    """torchvision's tensor greyscale (0.2989 R + 0.587 G + 0.114 B), one channel."""
    return _rgb_to_grayscale_image(x, num_output_channels=1, preserve_dtype=False)


def adjust_brightness(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    return _blend(x, torch.zeros_like(x), f)


def adjust_contrast(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    return _blend(x, _gray(x).mean(dim=(-3, -2, -1), keepdim=True), f)


def adjust_saturation(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    return _blend(x, _gray(x), f)


def adjust_hue(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    h, s, v = _rgb_to_hsv(x).unbind(dim=-3)
    h = (h + f.view(-1, 1, 1)).remainder(1.0)
    return _hsv_to_rgb(torch.stack((h, s, v), dim=-3))


def gaussian_blur(x: torch.Tensor, kernel: int, sigma: torch.Tensor) -> torch.Tensor:
    """Each image ``x[i]`` blurred with torchvision's normalised Gaussian of ``sigma[i]`` (``kernel`` px, odd,
    reflect border) as two 1-D passes, one grouped convolution per axis over the batch's channels."""
    b, c, h, w = x.shape
    half = (kernel - 1) * 0.5
    t = torch.linspace(-half, half, steps=kernel, dtype=x.dtype, device=x.device)
    pdf = torch.exp(-0.5 * (t.view(1, -1) / sigma.view(-1, 1)).pow(2))
    k1 = (pdf / pdf.sum(dim=1, keepdim=True)).repeat_interleave(c, dim=0)  # [B*C, k]
    pad = kernel // 2
    y = torch.nn.functional.pad(x.reshape(1, b * c, h, w), (pad, pad, pad, pad), mode="reflect")
    y = torch.nn.functional.conv2d(y, k1.view(b * c, 1, kernel, 1), groups=b * c)
    y = torch.nn.functional.conv2d(y, k1.view(b * c, 1, 1, kernel), groups=b * c)
    return y.view(b, c, h, w)


JITTER_OPS = (adjust_brightness, adjust_contrast, adjust_saturation, adjust_hue)  # ColorJitter's fn_idx order


def crop_params(height: int, width: int, scale: tuple[float, float], gen: torch.Generator,
                ratio: tuple[float, float] = CROP_RATIO) -> tuple[int, int, int, int]:
    """torchvision's ``RandomResizedCrop.get_params`` (top, left, height, width), the same draws in the same order
    from ``gen`` instead of the global generator: ten tries of an area in ``scale`` and a log-uniform aspect in
    ``ratio``, else the central crop."""
    area = height * width
    log_ratio = torch.log(torch.tensor(ratio))
    for _ in range(10):
        target_area = area * torch.empty(1).uniform_(scale[0], scale[1], generator=gen).item()
        aspect = torch.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1], generator=gen)).item()
        w, h = int(round(math.sqrt(target_area * aspect))), int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            i = int(torch.randint(0, height - h + 1, size=(1,), generator=gen).item())
            j = int(torch.randint(0, width - w + 1, size=(1,), generator=gen).item())
            return i, j, h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        w, h = int(round(height * max(ratio))), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def decode_images(blobs: list[bytes], device: torch.device) -> list[torch.Tensor]:
    """Image files -> RGB uint8 [3, H, W] tensors on ``device``: the JPEGs in one batched
    ``torchvision.io.decode_jpeg`` there (nvJPEG on CUDA, libjpeg-turbo on the CPU: Pillow's pixels), any other
    format (PNG, ...) decoded on the host and copied (a warning says how many). torchvision 0.29 deprecates its
    decoders for TorchCodec's; the pinned 0.29.1 still has them."""
    data = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in blobs]
    jpeg = [i for i, b in enumerate(blobs) if bytes(b[:2]) == JPEG_MAGIC]
    out: list[torch.Tensor | None] = [None] * len(blobs)
    if jpeg:
        for i, img in zip(jpeg, decode_jpeg([data[i] for i in jpeg], mode=ImageReadMode.RGB, device=device)):
            out[i] = img
    others = [i for i in range(len(blobs)) if out[i] is None]
    if others:
        log.warning("decode_on: device: %d of %d images of a batch are not JPEG; decoded on the host", len(others),
                    len(blobs))
        for i in others:
            out[i] = decode_image(data[i], mode=ImageReadMode.RGB).to(device, non_blocking=True)
    return out  # type: ignore[return-value]


@dataclass(frozen=True)
class DeviceAugment:
    """``augment(images, key)``: uint8 ``[B, 3, H, W]`` on the device -> float32, augmented (``kind``'s
    photometric steps at ``image_size``) and normalised (:func:`normalize_batch`); float images (already
    normalised, e.g. an evaluation view) pass unchanged. ``key``: ints naming the batch.

    With ``augment_on: device`` the DataLoader workers decode, crop and flip only
    (:func:`protoclip.data.loading.transforms.train_transform` with ``photometric="device"``) and hand over uint8
    images; this applies the kind's colour jitter, greyscale and Gaussian blur on the device, with a draw per image,
    and normalises the batch. With ``decode_on: device`` as well the workers hand over the stored files and
    :meth:`decode_crop` decodes, crops and flips first. It is the same augmentation as the workers'
    (:mod:`protoclip.data.loading.transforms`: the same probabilities, ranges, kernel sizes and order), computed as
    torchvision computes it on tensors, with these differences from the PIL path (the crop's resize too:
    antialiased bicubic on tensors, within a level or two of Pillow's):

    * the values stay float between the steps (PIL rounds to uint8 after each), and greyscale and the jitter's grey
      reference use torchvision's tensor weights (0.2989, 0.587, 0.114; PIL: 299/587/114 per mille);
    * the draws come from a host generator seeded by the batch's key (:func:`key_seed` of (seed, episode, pass,
      first position, view)), so a batch's augmentation is a pure function of its key, the same on any device:
      resume-exact and independent of the worker count, as the workers' per-item seeds are
      (:mod:`protoclip.train.loader`).

    The horizontal flip is drawn with the crop for every kind (in the workers, or in ``decode_crop``): it commutes
    with the pointwise colour steps and with a symmetric Gaussian kernel under reflect padding, so MoCo v2's
    flip-last order is unchanged. Nothing is read back from the device: drawn on the host, the images a step
    touches are known there, and each step runs on those images only (``index_select`` / ``index_copy`` with
    indices sent from pinned memory), about a fifth of the batch per step for the paper's augmentation.
    """

    kind: Kind
    image_size: int

    def __post_init__(self):
        if self.kind not in CROP_SCALE:
            raise ValueError(f"unknown augmentation kind {self.kind!r} (known: {', '.join(CROP_SCALE)})")

    @property
    def steps(self) -> tuple[str, ...]:
        return ORDER.get(self.kind, ())

    def decode_crop(self, blobs: list[bytes], key: tuple[int, ...], device: torch.device) -> torch.Tensor:
        """Image files -> uint8 [B, 3, S, S] on ``device``: decoded there (:func:`decode_images`), each cropped as
        the workers' RandomResizedCrop (the kind's scale, bicubic, antialiased: torchvision's tensor resize, close
        to Pillow's) and flipped with probability 1/2 (kinds with a flip), the draws from a host generator seeded
        by ``key`` (:func:`crop_params`)."""
        gen = torch.Generator().manual_seed(key_seed((*key, 1)))
        size = [self.image_size, self.image_size]
        out = []
        for img in decode_images(blobs, device):
            top, left, h, w = crop_params(img.shape[-2], img.shape[-1], CROP_SCALE[self.kind], gen)
            img = TF.resized_crop(img, top, left, h, w, size, InterpolationMode.BICUBIC, antialias=True)
            if self.kind not in CROP_ONLY and torch.rand(1, generator=gen).item() < 0.5:
                img = img.flip(-1)
            out.append(img)
        return torch.stack(out)

    def __call__(self, images: torch.Tensor, key: tuple[int, ...]) -> torch.Tensor:
        if images.is_floating_point() or not self.steps:
            return normalize_batch(images)
        # one draw per image and column on the host: jitter applied, b, c, s, h, the jitter order (4), grey, blur,
        # sigma. Drawn there, the images each step touches are known without reading the device back
        u = torch.rand((images.shape[0], 12), generator=torch.Generator().manual_seed(key_seed(key)))
        x = to_unit(images)  # an image no step touches ends as normalize_batch's, bit for bit
        for step in self.steps:
            if step == "jitter":
                x = self._jitter(x, u)
            elif step == "gray":
                x = _on(x, u[:, 9] < GRAY_P, lambda sub, _: _gray(sub).expand_as(sub).contiguous())
            else:
                kernel, (lo, hi) = blur_params(self.image_size, self.kind)
                x = _on(x, u[:, 10] < BLUR_P[self.kind], lambda sub, s: gaussian_blur(sub, kernel, s),
                        lo + (hi - lo) * u[:, 11])
        return normalize_unit(x)

    def _jitter(self, x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """ColorJitter with probability ``JITTER_P``: factors uniform in [max(0, 1 - v), 1 + v] (hue [-v, v]),
        the four adjustments in a random order per image (argsort of uniform draws: a uniform permutation)."""
        bri, con, sat, hue = JITTER[self.kind]
        on = u[:, 0] < JITTER_P[self.kind]
        lo = torch.tensor([max(0.0, 1 - bri), max(0.0, 1 - con), max(0.0, 1 - sat), -hue])
        hi = torch.tensor([1 + bri, 1 + con, 1 + sat, hue])
        factors = lo + (hi - lo) * u[:, 1:5]  # [B, 4]
        order = torch.argsort(u[:, 5:9], dim=1)  # [B, 4]: the adjustment at each slot
        for slot in range(4):
            for op, fn in enumerate(JITTER_OPS):
                shape = (-1,) if op == 3 else (-1, 1, 1, 1)
                x = _on(x, on & (order[:, slot] == op), lambda sub, f, fn=fn, shape=shape: fn(sub, f.view(shape)),
                        factors[:, op])
        return x


def _on(x: torch.Tensor, mask: torch.Tensor, fn, values: torch.Tensor | None = None) -> torch.Tensor:
    """``x`` with ``fn(x[mask], values[mask])`` in the images ``mask`` (a host bool tensor) selects; the indices and
    values travel to the device from pinned memory without waiting for it."""
    idx = mask.nonzero().flatten()
    if idx.numel() == 0:
        return x
    vals = values[idx] if values is not None else None
    if x.is_cuda:
        idx, vals = idx.pin_memory(), vals.pin_memory() if vals is not None else None
    idx = idx.to(x.device, non_blocking=True)
    vals = vals.to(x.device, non_blocking=True) if vals is not None else None
    return x.index_copy(0, idx, fn(x.index_select(0, idx), vals))


__all__ = ["DeviceAugment", "EncodedImage", "ORDER", "JITTER_OPS", "crop_params", "decode_images", "key_seed",
           "gaussian_blur", "adjust_brightness", "adjust_contrast", "adjust_saturation", "adjust_hue"]
