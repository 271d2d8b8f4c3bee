"""Chunked image-feature extraction (protoclip.evaluate.resumable) against the one-pass extraction it replaces, on a
real tiny-rn: the same arrays (the same batches: bit for bit), on a map-style and an iterable split; a damaged chunk
and every chunk after it are encoded again; a work folder of another key is cleared before anything is reused."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from protoclip.data.loading.transforms import eval_transform
from protoclip.evaluate.datasets.sets import ArraySplit
from protoclip.evaluate.features import encode_images
from protoclip.evaluate.resumable import CHUNK, ExtractionProgress, encode_images_resumable
from protoclip.models import build_model

N, BATCH, CHUNK_BATCHES = 21, 2, 3  # chunks of 6 images: 4 chunks, the last of 3


class _Iterable:
    """The split as a webdataset split is seen: iterable with a length, no __getitem__."""

    def __init__(self, split: ArraySplit):
        self.split = split

    def __len__(self) -> int:
        return len(self.split)

    def __iter__(self):
        return (self.split[i] for i in range(len(self.split)))


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = build_model("tiny-rn", head_hidden=16, head_out=8).eval()
    rng = np.random.default_rng(0)
    split = ArraySplit(rng.integers(0, 255, (N, 16, 16, 3), dtype=np.uint8), np.arange(N) % 3)
    transform = eval_transform(model.image_size)
    return model, split, transform, encode_images(model, split, transform, torch.device("cpu"), BATCH)


def _run(setup, folder, split=None):
    model, base, transform, _ = setup
    return encode_images_resumable(model, split or base, transform, torch.device("cpu"), BATCH, "t", 0, folder,
                                   CHUNK_BATCHES)


def _equal(a, b) -> None:
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def test_chunks_give_the_one_pass_arrays(setup, tmp_path):
    _equal(_run(setup, tmp_path / "map"), setup[3])
    assert sorted(p.name for p in (tmp_path / "map").iterdir()) == [CHUNK.format(c) for c in range(4)]
    _equal(_run(setup, tmp_path / "iter", _Iterable(setup[1])), setup[3])


def test_a_damaged_chunk_and_the_ones_after_it_are_encoded_again(setup, tmp_path, caplog):
    folder = tmp_path / "w"
    _run(setup, folder)
    for c in range(4):  # a constant in every chunk: what is kept keeps it, what is redone loses it
        path = folder / CHUNK.format(c)
        with np.load(path) as z:
            arrays = {k: z[k] for k in z.files}
        arrays["z"] = np.full_like(arrays["z"], float(c + 1))
        with open(path, "wb") as f:
            np.savez(f, **arrays)
    (folder / CHUNK.format(1)).write_bytes((folder / CHUNK.format(1)).read_bytes()[:100])  # cut short
    with caplog.at_level("INFO", logger="protoclip.evaluate.resumable"):
        z, h, y = _run(setup, folder)
    assert "t: resumed: 6 of 21 images were extracted before (1 of 4 chunks" in caplog.text
    assert (z[:6] == 1.0).all()  # chunk 0 kept
    np.testing.assert_array_equal(z[6:], setup[3][0][6:])  # chunks 1-3 encoded again (3 was whole, but after 1)
    np.testing.assert_array_equal(h, setup[3][1])


def test_a_work_folder_of_another_key_is_cleared(tmp_path):
    folder = tmp_path / "w"
    ExtractionProgress(folder, {"model_sha256": "a", "chunk_images": 6}).open()
    (folder / "test").mkdir()
    (folder / "test" / CHUNK.format(0)).write_bytes(b"x")
    ExtractionProgress(folder, {"model_sha256": "a", "chunk_images": 6}).open()
    assert (folder / "test" / CHUNK.format(0)).exists()  # same key: kept
    progress = ExtractionProgress(folder, {"model_sha256": "b", "chunk_images": 6}).open()
    assert not (folder / "test").exists() and (folder / "key.json").is_file()
    progress.remove()
    assert not folder.exists()
