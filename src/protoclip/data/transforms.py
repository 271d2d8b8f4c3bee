"""Image transforms for training and evaluation (ProtoCLIP Sec. IV-B3, Table XI).

* ``simclr``: RandomResizedCrop(scale 0.08-1) + horizontal flip + ColorJitter(0.4, 0.4, 0.4, 0.1)
  with p=0.8 + grayscale p=0.2 (SimCLR's recipe without blur, as the paper describes it);
* ``protoclip``: the same with crop scale 0.5-1.0 and colour-jitter p=0.2 (the paper's two changes);
* ``none``: RandomResizedCrop scale 0.9-1.0 only ("No Augmentation" in Table XI, open_clip's default
  training crop).

All end with ToTensor and open_clip's OPENAI_DATASET_MEAN/STD normalisation. The colour-jitter and
grayscale steps are open_clip's own ``color_jitter`` / ``gray_scale`` (probability wrappers);
``eval_transform`` is open_clip's ``image_transform(is_train=False)`` (resize shortest side + centre
crop). Images are converted to RGB first.

``mocov2`` (for the image-only methods) is MoCo v2's augmentation, which PCL v2 and PAUC use [pcl-protonce.txt
Sec. 4; ref-code facebookresearch/moco main_moco.py ``--aug-plus``]: RandomResizedCrop(scale 0.2-1) +
ColorJitter(0.4, 0.4, 0.4, 0.1) with p=0.8 + grayscale p=0.2 + Gaussian blur (sigma 0.1-2, p=0.5; kernel ~10%
of the image side, SimCLR's) + horizontal flip. Two-view methods draw it twice per image
(``protoclip.train.methods.base.MultiView``).
"""
from __future__ import annotations

from typing import Callable, Literal

from open_clip.transform import (OPENAI_DATASET_MEAN, OPENAI_DATASET_STD, _convert_to_rgb, color_jitter, gray_scale,
                                 image_transform)
from torchvision import transforms as T

Kind = Literal["protoclip", "none", "simclr", "mocov2"]
CROP_SCALE = {"simclr": (0.08, 1.0), "protoclip": (0.5, 1.0), "none": (0.9, 1.0), "mocov2": (0.2, 1.0)}
JITTER_P = {"simclr": 0.8, "protoclip": 0.2, "mocov2": 0.8}
BLUR_P = {"mocov2": 0.5}  # MoCo v2: GaussianBlur([.1, 2.]) with p=0.5
BLUR_SIGMA = (0.1, 2.0)
JITTER = (0.4, 0.4, 0.4, 0.1)  # brightness, contrast, saturation, hue (SimCLR)
GRAY_P = 0.2


def train_transform(image_size: int, kind: Kind = "protoclip") -> Callable:
    """Training augmentation ``kind`` at ``image_size`` px (see module docstring)."""
    if kind not in CROP_SCALE:
        raise ValueError(f"unknown augmentation kind {kind!r} (known: {', '.join(CROP_SCALE)})")
    steps: list = [_convert_to_rgb,
                   T.RandomResizedCrop(image_size, scale=CROP_SCALE[kind],
                                       interpolation=T.InterpolationMode.BICUBIC)]
    if kind == "mocov2":  # MoCo v2's order: crop, jitter, grayscale, blur, flip
        kernel = max(3, int(0.1 * image_size) // 2 * 2 + 1)  # odd, ~10% of the side (SimCLR)
        steps += [color_jitter(*JITTER, p=JITTER_P[kind]), gray_scale(p=GRAY_P),
                  T.RandomApply([T.GaussianBlur(kernel, sigma=BLUR_SIGMA)], p=BLUR_P[kind]),
                  T.RandomHorizontalFlip()]
    elif kind != "none":
        steps += [T.RandomHorizontalFlip(), color_jitter(*JITTER, p=JITTER_P[kind]), gray_scale(p=GRAY_P)]
    steps += [T.ToTensor(), T.Normalize(OPENAI_DATASET_MEAN, OPENAI_DATASET_STD)]
    return T.Compose(steps)


def eval_transform(image_size: int) -> Callable:
    """Resize (shortest side) + centre crop + normalise: open_clip's inference preprocessing."""
    return image_transform(image_size, is_train=False)


__all__ = ["Kind", "train_transform", "eval_transform", "CROP_SCALE", "JITTER_P"]
