"""Batching of evaluation images: map-style (DataLoader, workers) and iterable splits agree, in order."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torchvision.transforms.functional import pil_to_tensor

from protoclip.evaluate.datasets import ArraySplit
from protoclip.evaluate.batches import image_batches
from protoclip.evaluate.features import resolve_device, sha256_file


class IterOnly:
    """The same images as an iterable without __getitem__ (like webdataset shards)."""

    def __init__(self, split):
        self.split = split

    def __len__(self):
        return len(self.split)

    def __iter__(self):
        yield from self.split


@pytest.fixture
def split():
    rng = np.random.default_rng(0)
    return ArraySplit(rng.integers(0, 255, (11, 4, 4, 3), dtype=np.uint8), np.arange(11) % 3)


@pytest.mark.parametrize("workers", [0, 1])
def test_map_and_iterable_batches_agree(split, workers):
    def naive():  # oracle: one image at a time, straight from the arrays
        return torch.stack([torch.from_numpy(im).permute(2, 0, 1) for im in split.images])

    for source in (split, IterOnly(split)):
        batches = list(image_batches(source, pil_to_tensor, batch_size=4,
                                     num_workers=workers if source is split else 0))
        assert [len(y) for _, y in batches] == [4, 4, 3]
        x = torch.cat([b for b, _ in batches])
        y = torch.cat([lab for _, lab in batches])
        assert torch.equal(x, naive()) and y.tolist() == list(split.labels)


def test_resolve_device_and_sha(tmp_path):
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    f = tmp_path / "m.pt"
    f.write_bytes(b"abc")
    # FIPS 180-2 test vector for "abc", read in 2-byte chunks
    assert sha256_file(f, chunk=2) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
