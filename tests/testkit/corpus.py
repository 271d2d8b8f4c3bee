"""The drawn-shapes corpus of the end-to-end pipeline tests: a user_data CSV of PNG shapes and a labelled set."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from testkit.data import COLORS, SHAPES, make_png

SOURCE = "shapes"  # the fixture corpus' user_data name
SIZES = {"tiny": 32, "small": 36, "medium": 40, "large": 44, "big": 48, "huge": 52}  # 5 x 4 x 6 = 120 pairs


def fixture_corpus(root: Path) -> Path:
    """120 drawn PNGs, caption "a <size> <colour> <shape>", coarse label = the shape."""
    lines = ["filepath,caption,label"]
    for word, size in SIZES.items():
        for color in COLORS:
            for shape in SHAPES:
                name = f"{word}_{color}_{shape}.png"
                make_png(root / "userdata" / name, color, shape, size)
                lines.append(f"{name},a {word} {color} {shape},{shape}")
    path = root / "userdata" / "pairs.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def fixture_labelled_set(path: Path) -> Path:
    """A stand-in for Fashion-MNIST in the offline .npz format: drawn shapes, 4 classes, 120 train / 40 test."""
    from PIL import Image

    rng = np.random.default_rng(0)
    images, labels = [], []
    tmp = path.parent / "draw.png"
    for i in range(160):
        label = i % len(SHAPES)
        make_png(tmp, list(COLORS)[rng.integers(len(COLORS))], SHAPES[label], int(rng.integers(24, 40)))
        images.append(np.asarray(Image.open(tmp).convert("RGB").resize((28, 28))))
        labels.append(label)
    tmp.unlink()
    split = np.array(["train"] * 120 + ["test"] * 40)
    np.savez(path, images=np.stack(images).astype(np.uint8), labels=np.array(labels, np.int64), split=split,
             classnames=np.array(SHAPES))
    return path
