"""Image transforms for training and evaluation (ProtoCLIP Sec. IV-B3, Table XI).

The paper describes its augmentation only as SimCLR's with two changes; ``protoclip`` follows the authors' code for
the rest. :func:`train_transform` lists every kind with its source; :func:`eval_transform` is open_clip's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

import torch
from open_clip.transform import (OPENAI_DATASET_MEAN, OPENAI_DATASET_STD, _convert_to_rgb, color_jitter, gray_scale,
                                 image_transform)
from torchvision import transforms as T

from protoclip.data.loading.blur import GaussianBlur

Kind = Literal["protoclip", "none", "simclr", "mocov2", "mocov1", "crop50", "crop80"]
CROP_SCALE = {"simclr": (0.08, 1.0), "protoclip": (0.5, 1.0), "none": (0.9, 1.0), "mocov2": (0.2, 1.0),
              "mocov1": (0.2, 1.0), "crop50": (0.5, 1.0), "crop80": (0.8, 1.0)}
CROP_ONLY = ("none", "crop50", "crop80")  # RandomResizedCrop and nothing else
JITTER_P = {"simclr": 0.8, "protoclip": 0.2, "mocov2": 0.8, "mocov1": 1.0}
# brightness, contrast, saturation, hue: SimCLR s = 1 and the authors' code; MoCo v2's weaker jitter; MoCo v1's
JITTER = {"simclr": (0.8, 0.8, 0.8, 0.2), "protoclip": (0.8, 0.8, 0.8, 0.2), "mocov2": (0.4, 0.4, 0.4, 0.1),
          "mocov1": (0.4, 0.4, 0.4, 0.4)}
GRAY_P = 0.2  # SimCLR, MoCo v2 and the authors' code
BLUR_P = {"simclr": 0.5, "protoclip": 0.2, "mocov2": 0.5}  # SimCLR (ImageNet); the authors' code; MoCo v2
# at 224 px: SimCLR 10 % of the side (odd), also used for MoCo v2's PIL blur; authors' code 21
BLUR_KERNEL_224 = {"simclr": 23, "protoclip": 21, "mocov2": 23}
BLUR_SIGMA_224 = (0.1, 2.0)  # SimCLR, MoCo v2 and torchvision's GaussianBlur default (the authors' code)


def blur_params(image_size: int, kind: Kind) -> tuple[int, tuple[float, float]]:
    """The blur of ``kind`` at ``image_size`` px: kernel (odd, >= 3) and sigma range, scaled from 224 px.

    The kernel (21 px at 224 in the authors' code, 10 % of the side in SimCLR) and sigma range scale with
    ``image_size / 224`` so that a 64 px CPU run gets the same relative blur.
    """
    scale = image_size / 224
    kernel = max(3, int(round(BLUR_KERNEL_224[kind] * scale)) | 1)
    return kernel, (BLUR_SIGMA_224[0] * scale, BLUR_SIGMA_224[1] * scale)


def gaussian_blur(image_size: int, kind: Kind) -> T.RandomApply:
    """The blur step of ``kind`` at ``image_size`` px (kernel and sigma scaled from 224 px, :func:`blur_params`).

    torchvision's GaussianBlur, computed in two 1-D passes for kernels of 9 px and more
    (:mod:`protoclip.data.loading.blur`: same draws and kernel, a few values in 10^5 one level apart; the 32/64 px
    runs' kernels keep torchvision's own computation).
    """
    kernel, sigma = blur_params(image_size, kind)
    return T.RandomApply([GaussianBlur(kernel, sigma=sigma)], p=BLUR_P[kind])


@dataclass(frozen=True)
class ImageForm:
    """What a run's training items hold as their image."""

    views: int = 1  # image tensors per item: 1 = one tensor; n > 1 = a tuple of n (a MultiView)
    stored: bool = False  # the stored file's bytes, decoded on the training device (train.decode_on: device)

    def __post_init__(self):
        if self.views < 1 or (self.stored and self.views != 1):
            raise ValueError(f"an image form has >= 1 views and stored files only as one view, got {self}")


def image_form(transform: Callable) -> ImageForm:
    """The form of the images ``transform`` gives: the one it declares (``form``: MultiView, EncodedImage), else
    one tensor. The one rule for it: the dataset (what it reads) and the loader (how it stacks) both ask here."""
    form = getattr(transform, "form", None)
    return form if form is not None else ImageForm()


class EncodedImage:
    """The workers' transform under ``train.decode_on: device``: the stored image file's bytes, untouched
    (:class:`protoclip.data.loading.pairs.ImageTextDataset` hands a transform of this form the file, undecoded);
    the batch is decoded, cropped and flipped on the device by
    :meth:`protoclip.data.loading.device_augment.DeviceAugment.decode_crop`."""

    form = ImageForm(stored=True)

    def __call__(self, data: bytes) -> bytes:
        return data


class MultiView:
    """A transform giving several views of one image: ``MultiView(t1, t2)(img) -> (t1(img), t2(img))`` (a method
    that reads several views per item returns one from its ``train_transform``)."""

    def __init__(self, *transforms: Callable):
        self.transforms = transforms
        self.form = ImageForm(views=len(transforms))

    def __call__(self, img):
        return tuple(t(img) for t in self.transforms)


def train_transform(image_size: int, kind: Kind = "protoclip", photometric: str = "workers",
                    decode: str = "workers") -> Callable:
    """Training augmentation ``kind`` at ``image_size`` px. ``photometric="device"``: the crop and flip only; the
    colour jitter, greyscale and blur run batched on the training device
    (:class:`protoclip.data.loading.device_augment.DeviceAugment`, ``train.augment_on: device``). ``decode="device"``
    (with ``photometric="device"``, ``train.decode_on: device``): nothing but the stored bytes
    (:class:`EncodedImage`); decoding, crop and flip run on the device too.

    Sources. The paper (Sec. IV-B3) describes the ProtoCLIP augmentation only as SimCLR's with two changes: crop
    scale 0.5-1.0 instead of 0.08-1.0 and colour-jitter probability 0.2 instead of 0.8. The authors' code
    (megvii-research/protoclip, ``src/open_clip/transform.py``, augmentation ``protoclip-light-augmentation``) fixes
    the rest, and ``protoclip`` here follows that code:

    * ``protoclip``: RandomResizedCrop(scale 0.5-1.0, bicubic) + horizontal flip + ColorJitter(0.8, 0.8, 0.8, 0.2)
      with p=0.2 + grayscale p=0.2 + GaussianBlur(kernel 21, sigma 0.1-2.0) with p=0.2 (the authors' code; its
      blur p=0.2 is a third change to SimCLR's p=0.5 that the paper does not mention);
    * ``simclr``: SimCLR's ImageNet recipe (Chen et al. 2020, appendix A, colour strength s = 1):
      RandomResizedCrop(scale 0.08-1.0) + flip + ColorJitter(0.8, 0.8, 0.8, 0.2) with p=0.8 + grayscale p=0.2 +
      GaussianBlur (kernel 10 % of the image side, sigma 0.1-2.0) with p=0.5 ("SimCLR Augmentation" of Table XI;
      the authors' code does not include it);
    * ``none``: RandomResizedCrop scale 0.9-1.0 only ("No Augmentation" in Table XI; the authors' code and
      open_clip's default training crop).
    * ``mocov2`` (for the image-only methods): MoCo v2's augmentation, which PCL v2 and PAUC use
      [pcl-protonce.txt Sec. 4; ref-code facebookresearch/moco main_moco.py ``--aug-plus``]: RandomResizedCrop(scale
      0.2-1) + ColorJitter(0.4, 0.4, 0.4, 0.1) with p=0.8 + grayscale p=0.2 + Gaussian blur (sigma 0.1-2 at 224 px,
      p=0.5; kernel 10 % of the side, SimCLR's) + horizontal flip, in MoCo's order. Two-view methods draw it twice
      per image (:class:`MultiView`).
    * ``mocov1``: MoCo v1's augmentation, which PCL v1 and PAUC state ("random crop, random color jittering, random
      horizontal flip, and random grayscale conversion": pcl-protonce.txt Sec. 4.1, pauc-nemd.txt Sec. 4.1;
      ref-code main_moco.py without ``--aug-plus``): RandomResizedCrop(scale 0.2-1) + grayscale p=0.2 +
      ColorJitter(0.4, 0.4, 0.4, 0.4) always + horizontal flip, in MoCo's order; no blur.
    * ``crop50`` / ``crop80``: RandomResizedCrop only, scale 0.5-1.0 (nCLIP: "follow CLIP with image size randomly
      cropped and resized within the scale of (0.5, 1.0)", nclip-xclip.txt Sec. 3.2, l.118) / 0.8-1.0 (the
      temperature paper: "we only apply the RandomResizedCrop with a scale range of [0.8,1.0]", its App. A, l.802).

    Images are converted to RGB first. The colour-jitter and grayscale steps are open_clip's own ``color_jitter`` /
    ``gray_scale`` (probability wrappers); the blur is :func:`gaussian_blur`. All end with ``PILToTensor``
    (:func:`normalize_batch` says why).
    """
    if kind not in CROP_SCALE:
        raise ValueError(f"unknown augmentation kind {kind!r} (known: {', '.join(CROP_SCALE)})")
    if photometric not in ("workers", "device") or decode not in ("workers", "device"):
        raise ValueError(f"photometric and decode must be 'workers' or 'device', got {photometric!r}, {decode!r}")
    if decode == "device":
        if photometric != "device":
            raise ValueError("decode on the device needs the photometric steps there too (photometric='device')")
        return EncodedImage()
    steps: list = [_convert_to_rgb,
                   T.RandomResizedCrop(image_size, scale=CROP_SCALE[kind],
                                       interpolation=T.InterpolationMode.BICUBIC)]
    if photometric == "device":  # the flip commutes with the colour steps and the symmetric blur (device_augment)
        steps += [] if kind in CROP_ONLY else [T.RandomHorizontalFlip()]
    elif kind == "mocov2":  # MoCo v2's order: crop, jitter, grayscale, blur, flip
        steps += [color_jitter(*JITTER[kind], p=JITTER_P[kind]), gray_scale(p=GRAY_P), gaussian_blur(image_size, kind),
                  T.RandomHorizontalFlip()]
    elif kind == "mocov1":  # MoCo v1's order: crop, grayscale, jitter, flip
        steps += [gray_scale(p=GRAY_P), color_jitter(*JITTER[kind], p=JITTER_P[kind]), T.RandomHorizontalFlip()]
    elif kind not in CROP_ONLY:
        steps += [T.RandomHorizontalFlip(), color_jitter(*JITTER[kind], p=JITTER_P[kind]), gray_scale(p=GRAY_P),
                  gaussian_blur(image_size, kind)]
    steps += [T.PILToTensor()]  # uint8 CHW; normalize_batch on the device
    return T.Compose(steps)


_CONSTANTS: dict[torch.device, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}


def _constants(device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """255, mean and std as float32 tensors on ``device``, made once per device: a host-to-device copy from
    pageable memory waits for the device, which a copy per batch would make it do every step."""
    if device not in _CONSTANTS:
        _CONSTANTS[device] = (torch.full((1, 1, 1, 1), 255.0, dtype=torch.float32, device=device),
                              torch.tensor(OPENAI_DATASET_MEAN, dtype=torch.float32, device=device).view(1, 3, 1, 1),
                              torch.tensor(OPENAI_DATASET_STD, dtype=torch.float32, device=device).view(1, 3, 1, 1))
    return _CONSTANTS[device]


def to_unit(images: torch.Tensor) -> torch.Tensor:
    """uint8 images -> float32 in [0, 1], as ToTensor divides (:func:`normalize_batch`'s first half)."""
    return images.float().div(_constants(images.device)[0])


def normalize_unit(x: torch.Tensor) -> torch.Tensor:
    """float32 images in [0, 1] -> Normalize(OPENAI_DATASET_MEAN/STD) (:func:`normalize_batch`'s second half)."""
    _, mean, std = _constants(x.device)
    return x.sub(mean).div(std)


def normalize_batch(images: torch.Tensor) -> torch.Tensor:
    """uint8 images ``[..., 3, H, W]`` (``train_transform``'s output, batched) -> float32 normalised like ToTensor +
    Normalize(OPENAI_DATASET_MEAN/STD), on the images' device and in their memory format; float images (already
    normalised, e.g. ``eval_transform``'s) are returned unchanged.

    Training images leave the DataLoader workers as uint8 CHW tensors (``train_transform`` ends with
    ``PILToTensor``) and are normalised here on the device (open_clip's OPENAI_DATASET_MEAN/STD; the same numbers as
    ToTensor + Normalize), so workers do no float work and a quarter of the bytes travel through shared memory,
    pinning and the host-to-device copy.

    The divisor 255 is a tensor on the images' device, not a Python number: CUDA divides by a host scalar as a
    multiplication by its reciprocal, which differs from ToTensor's division in the last bit for some values."""
    if images.is_floating_point():
        return images
    return normalize_unit(to_unit(images))


def eval_transform(image_size: int) -> Callable:
    """Resize (shortest side) + centre crop + normalise: open_clip's inference preprocessing
    (``image_transform(is_train=False)``; images converted to RGB first)."""
    return image_transform(image_size, is_train=False)


__all__ = ["Kind", "EncodedImage", "ImageForm", "MultiView", "image_form", "train_transform", "normalize_batch",
           "normalize_unit", "to_unit", "eval_transform", "gaussian_blur", "blur_params", "CROP_SCALE", "CROP_ONLY",
           "JITTER_P", "BLUR_P"]
