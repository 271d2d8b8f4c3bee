"""Training images leave the workers as uint8 and are normalised on the device (protoclip.data.loading.transforms
.normalize_batch): the numbers must equal the float pipeline's (ToTensor + Normalize in the worker) bit for bit."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from open_clip.transform import OPENAI_DATASET_MEAN, OPENAI_DATASET_STD
from PIL import Image
from torchvision import transforms as T

from protoclip.data.loading.transforms import CROP_SCALE, normalize_batch, train_transform


def old_float(tf: T.Compose) -> T.Compose:
    """The same augmentation ending in ToTensor + Normalize (the float pipeline)."""
    assert isinstance(tf.transforms[-1], T.PILToTensor)
    return T.Compose(tf.transforms[:-1] + [T.ToTensor(), T.Normalize(OPENAI_DATASET_MEAN, OPENAI_DATASET_STD)])


def seed(s: int) -> None:
    """Both RNGs the augmentations draw from: torch's and Python's (open_clip's probability wrappers)."""
    torch.manual_seed(s)
    random.seed(s)


def images(n: int = 4, seed: int = 0) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    sizes = [(7, 13), (31, 64), (300, 401), (224, 224)][:n]
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in sizes]


def test_normalize_batch_equals_totensor_normalize_exactly():
    norm = T.Normalize(OPENAI_DATASET_MEAN, OPENAI_DATASET_STD)
    for img in images():
        want = norm(T.ToTensor()(img))
        got = normalize_batch(T.PILToTensor()(img)[None])
        assert got.dtype == torch.float32 and got.shape == (1, *want.shape)
        assert torch.equal(got[0], want)
    # every uint8 value of every channel, against the formula in float64 (within float32 rounding)
    x = torch.arange(256, dtype=torch.uint8).view(1, 1, 1, 256).expand(1, 3, 1, 256)
    ref = (x.double() / 255 - torch.tensor(OPENAI_DATASET_MEAN).double().view(1, 3, 1, 1)) \
        / torch.tensor(OPENAI_DATASET_STD).double().view(1, 3, 1, 1)
    assert torch.allclose(normalize_batch(x).double(), ref, atol=1e-6, rtol=0)


def test_normalize_batch_passes_float_through_and_keeps_the_memory_format():
    x = torch.randn(2, 3, 5, 5)
    assert normalize_batch(x) is x
    u = torch.randint(0, 256, (2, 3, 6, 5), dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
    assert normalize_batch(u).is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("kind", sorted(CROP_SCALE))
@pytest.mark.parametrize("size", [32, 224])
def test_every_augmentation_kind_gives_the_float_pipelines_numbers(kind, size):
    new = train_transform(size, kind)
    old = old_float(new)
    for i, img in enumerate(images()):
        for draw in range(3):  # several seeds: jitter / grayscale / blur applied in some draws
            seed(1000 * i + draw)
            u = new(img)
            seed(1000 * i + draw)
            f = old(img)
            assert u.dtype == torch.uint8 and u.shape == (3, size, size)
            assert torch.equal(normalize_batch(u[None])[0], f)
