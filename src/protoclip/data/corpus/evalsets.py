"""Offline labelled evaluation sets in one format: ``layout.eval_set(name)`` (.npz), Fashion-MNIST and digits.

Captions made from these class names never enter pretraining (they would leak zero-shot labels).
"""
from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
from PIL import Image

from protoclip.files.atomic import atomic_path
from protoclip.files.datafiles import PREPARE, reading

FASHION_DIR = Path("usr/share/datasets/fashion-mnist")
FASHION_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                   "Ankle boot"]
# 8 px is below any encoder's patch / stem size; 32 is the CIFAR scale the tiny encoders are built for
DIGITS_SIZE = 32
DIGITS_TEST_FRACTION = 0.3  # digits has no official split: a stratified 70/30 train/test split
# independent of the pretraining split seed, so every run sees the same test digits
DIGITS_SPLIT_SEED = 0


def read_idx(path: str | Path, expect_magic: int) -> np.ndarray:
    """Read a (gzipped) idx file: uint8 [N] (labels, magic 2049) or [N, rows, cols] (images, magic 2051).

    Image files have a 16-byte header (magic 2051, n, rows, cols), label files an 8-byte one (magic 2049, n); both
    big-endian, checked.
    """
    p = Path(path)
    raw = gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes()
    magic, n = struct.unpack(">II", raw[:8])
    if magic != expect_magic:
        raise ValueError(f"{p}: idx magic {magic}, expected {expect_magic}")
    if magic == 2051:
        rows, cols = struct.unpack(">II", raw[8:16])
        arr = np.frombuffer(raw, dtype=np.uint8, offset=16)
        if arr.size != n * rows * cols:
            raise ValueError(f"{p}: {arr.size} pixels, header says {n}x{rows}x{cols}")
        return arr.reshape(n, rows, cols)
    arr = np.frombuffer(raw, dtype=np.uint8, offset=8)
    if arr.size != n:
        raise ValueError(f"{p}: {arr.size} labels, header says {n}")
    return arr


def gray_to_rgb(x: np.ndarray) -> np.ndarray:
    return np.repeat(x[..., None], 3, axis=-1)


def build_fashion_mnist(unpacked: str | Path) -> dict[str, np.ndarray]:
    """Debian ``dataset-fashion-mnist``'s idx files (60k train / 10k t10k, 28x28 gray -> RGB by channel repetition)."""
    root = Path(unpacked) / FASHION_DIR
    imgs, labels, splits = [], [], []
    for part, split in (("train", "train"), ("t10k", "test")):
        x = read_idx(root / f"{part}-images-idx3-ubyte.gz", 2051)
        y = read_idx(root / f"{part}-labels-idx1-ubyte.gz", 2049)
        if len(x) != len(y):
            raise ValueError(f"fashion-mnist {part}: {len(x)} images but {len(y)} labels")
        imgs.append(gray_to_rgb(x))
        labels.append(y.astype(np.int64))
        splits.append(np.full(len(y), split))
    return {"images": np.concatenate(imgs), "labels": np.concatenate(labels), "split": np.concatenate(splits),
            "classnames": np.array(FASHION_CLASSES)}


def build_digits(size: int = DIGITS_SIZE, seed: int = DIGITS_SPLIT_SEED,
                 test_fraction: float = DIGITS_TEST_FRACTION) -> dict[str, np.ndarray]:
    """scikit-learn's ``load_digits`` (1,797 8x8 images, values 0-16) scaled to 0-255, upscaled to ``size`` px with
    bilinear interpolation, gray -> RGB; a stratified train/test split with the fixed ``seed``."""
    from sklearn.datasets import load_digits  # heavy: sklearn, only when the digits set is built
    from sklearn.model_selection import train_test_split  # heavy: sklearn, only when the digits set is built

    d = load_digits()
    x8 = np.clip(np.round(d.images * (255.0 / 16.0)), 0, 255).astype(np.uint8)
    up = np.stack([np.asarray(Image.fromarray(im).resize((size, size), Image.Resampling.BILINEAR)) for im in x8])
    idx = np.arange(len(x8))
    _, test_idx = train_test_split(idx, test_size=test_fraction, random_state=seed, stratify=d.target)
    split = np.full(len(idx), "train", dtype="<U5")
    split[test_idx] = "test"
    return {"images": gray_to_rgb(up), "labels": d.target.astype(np.int64), "split": split,
            "classnames": np.array([str(c) for c in d.target_names])}


def validate_eval_set(arrays: dict[str, np.ndarray]) -> None:
    """The format: ``images`` uint8 [N, H, W, 3], ``labels`` int64 [N], ``split`` str [N] (``train``/``test``),
    ``classnames`` str [C]. Images keep (near) native resolution; the evaluator's ``eval_transform`` resizes them
    to the model's input size."""
    x, y, s, c = arrays["images"], arrays["labels"], arrays["split"], arrays["classnames"]
    if x.dtype != np.uint8 or x.ndim != 4 or x.shape[-1] != 3:
        raise ValueError(f"images must be uint8 [N,H,W,3], got {x.dtype} {x.shape}")
    if y.dtype != np.int64 or y.shape != (len(x),) or s.shape != (len(x),):
        raise ValueError("labels / split must be [N]")
    if y.min() < 0 or y.max() >= len(c):
        raise ValueError("labels out of range of classnames")
    if not set(np.unique(s)) <= {"train", "test"}:
        raise ValueError(f"split values must be train/test, got {set(np.unique(s))}")


def save_eval_set(path: str | Path, arrays: dict[str, np.ndarray]) -> Path:
    validate_eval_set(arrays)
    with atomic_path(path) as tmp:
        np.savez_compressed(tmp, **{k: np.asarray(v) for k, v in arrays.items()})
    return Path(path)


def load_eval_set(path: str | Path) -> dict[str, np.ndarray]:
    with reading(path, "evaluation set", PREPARE), np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def summary(arrays: dict[str, np.ndarray]) -> dict[str, int]:
    s = arrays["split"]
    return {"train": int((s == "train").sum()), "test": int((s == "test").sum()),
            "classes": int(len(arrays["classnames"])), "height": int(arrays["images"].shape[1])}


__all__ = ["FASHION_CLASSES", "read_idx", "build_fashion_mnist", "build_digits", "save_eval_set", "load_eval_set",
           "validate_eval_set", "summary"]
