"""protoclip.data.loading.blur: torchvision's GaussianBlur computed in two 1-D passes gives torchvision's image (the
same sigma draw, kernel, border and rounding), up to one level where float summation order decides a .5 rounding."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import transforms as T

from protoclip.data.loading.blur import SEPARABLE_MIN_KERNEL, GaussianBlur
from protoclip.data.loading.transforms import gaussian_blur


def photo(size: int) -> Image.Image:
    """A real photograph (scikit-learn's sample), resized: edges and texture, not a flat test pattern."""
    from sklearn.datasets import load_sample_image

    return Image.fromarray(load_sample_image("china.jpg")).resize((size, size), Image.BICUBIC)


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_large_kernel_matches_torchvision_within_one_level(mode):
    img = photo(224).convert(mode)
    ours, theirs = GaussianBlur(21, (0.1, 2.0)), T.GaussianBlur(21, (0.1, 2.0))
    for seed in range(4):
        torch.manual_seed(seed)
        a = np.asarray(ours(img)).astype(int)
        after_ours = torch.rand(1)
        torch.manual_seed(seed)
        b = np.asarray(theirs(img)).astype(int)
        assert torch.equal(after_ours, torch.rand(1))  # one sigma draw each: the RNG stream stays the same
        assert a.shape == b.shape and ours(img).mode == mode
        diff = np.abs(a - b)
        assert diff.max() <= 1 and (diff > 0).mean() < 1e-3, (diff.max(), (diff > 0).mean())
    # the blur does blur: a strong sigma changes the picture far beyond one level
    strong = GaussianBlur(21, (2.0, 2.0))
    assert np.abs(np.asarray(strong(img)).astype(int) - np.asarray(img)).max() > 20


def test_small_kernels_are_torchvisions_own_computation():
    """Below SEPARABLE_MIN_KERNEL (the 32 / 64 px runs' 3 and 7 px kernels) the image is torchvision's, bit for bit."""
    img = photo(64)
    for size in (32, 64):
        blur = gaussian_blur(size, "protoclip").transforms[0]
        assert isinstance(blur, GaussianBlur) and blur.kernel_size[0] < SEPARABLE_MIN_KERNEL
        torch.manual_seed(1)
        a = np.asarray(blur(img))
        torch.manual_seed(1)
        assert np.array_equal(a, np.asarray(T.GaussianBlur(blur.kernel_size, blur.sigma)(img)))
    assert gaussian_blur(224, "protoclip").transforms[0].kernel_size == (21, 21)
