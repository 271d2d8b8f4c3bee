"""The related methods' augmentation kinds (MoCo v2 and v1, the crop-only kinds of nCLIP and the temperature paper) and
the two-view wrapper (protoclip.data.loading.transforms)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import transforms as T

from protoclip.data.loading.transforms import CROP_SCALE, MultiView, train_transform


def test_mocov2_steps_and_two_views():
    t = train_transform(32, "mocov2")
    kinds = [type(s).__name__ for s in t.transforms]
    crop = next(s for s in t.transforms if isinstance(s, T.RandomResizedCrop))
    assert crop.scale == (0.2, 1.0) == CROP_SCALE["mocov2"]
    blur = next(s for s in t.transforms if isinstance(s, T.RandomApply))
    assert blur.p == 0.5 and isinstance(blur.transforms[0], T.GaussianBlur)
    # MoCo v2's sigma 0.1-2 at 224 px, scaled to the image size like every blur here (data/loading/transforms.py)
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


@pytest.mark.parametrize("kind, scale", [("crop50", (0.5, 1.0)), ("crop80", (0.8, 1.0))])
def test_crop_only_kinds_of_nclip_and_the_temperature_paper(kind, scale):
    """nCLIP: "randomly cropped and resized within the scale of (0.5, 1.0)" (nclip-xclip.txt l.118); the temperature
    paper: "only ... RandomResizedCrop with a scale range of [0.8,1.0]" (l.802): the crop and nothing else."""
    t = train_transform(32, kind)
    names = [type(s).__name__ for s in t.transforms]
    assert names[1:] == ["RandomResizedCrop", "PILToTensor"]
    assert t.transforms[1].scale == scale
    # the crop keeps at least `scale[0]` of the area: on a 2-colour image split at the middle column, a crop of
    # >= 80 % of the area always holds both colours; the crop draws differ between calls
    img = Image.fromarray(np.concatenate([np.zeros((64, 32, 3), np.uint8), np.full((64, 32, 3), 255, np.uint8)], 1))
    torch.manual_seed(0)
    draws = [t(img) for _ in range(8)]
    if kind == "crop80":
        assert all(d.amin() == 0 and d.amax() == 255 for d in draws)  # uint8: both colours kept
    assert any(not torch.equal(draws[0], d) for d in draws[1:])


def test_mocov1_steps_in_mocos_order():
    """MoCo v1 (PCL v1, PAUC: pauc-nemd.txt l.156): crop 0.2-1, grayscale 0.2, ColorJitter(0.4 x 4) always, flip."""
    t = train_transform(32, "mocov1")
    names = [type(s).__name__ for s in t.transforms]
    assert names[1:] == ["RandomResizedCrop", "gray_scale", "color_jitter", "RandomHorizontalFlip", "PILToTensor"]
    jitter = t.transforms[3]
    assert jitter.p == 1.0 and jitter.transf.hue == (-0.4, 0.4) and jitter.transf.brightness == (0.6, 1.4)
    assert t.transforms[1].scale == (0.2, 1.0) and t.transforms[2].p == 0.2
