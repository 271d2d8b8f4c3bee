"""The MoCo v2 augmentation kind and the two-view wrapper (protoclip.data.transforms)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import transforms as T

from protoclip.data.transforms import CROP_SCALE, train_transform
from protoclip.train.methods.base import MultiView


def test_mocov2_steps_and_two_views():
    t = train_transform(32, "mocov2")
    kinds = [type(s).__name__ for s in t.transforms]
    crop = next(s for s in t.transforms if isinstance(s, T.RandomResizedCrop))
    assert crop.scale == (0.2, 1.0) == CROP_SCALE["mocov2"]
    blur = next(s for s in t.transforms if isinstance(s, T.RandomApply))
    assert blur.p == 0.5 and isinstance(blur.transforms[0], T.GaussianBlur)
    # MoCo v2's sigma 0.1-2 at 224 px, scaled to the image size like every blur here (data/transforms.py)
    assert blur.transforms[0].sigma == pytest.approx((0.1 * 32 / 224, 2.0 * 32 / 224))
    assert kinds.index("RandomApply") < kinds.index("RandomHorizontalFlip")  # MoCo v2's order
    img = Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 48, 3), dtype=np.uint8))
    torch.manual_seed(0)
    x = MultiView(t, t)(img)
    assert len(x) == 2 and x[0].shape == (3, 32, 32)
    assert not torch.equal(x[0], x[1])  # two independent draws


def test_existing_kinds_unchanged():
    assert CROP_SCALE["protoclip"] == (0.5, 1.0) and CROP_SCALE["simclr"] == (0.08, 1.0)
    names = [type(s).__name__ for s in train_transform(32, "none").transforms]
    assert "RandomApply" not in names and "RandomHorizontalFlip" not in names
