"""The paper configuration's data in miniature: webdataset shards in the brace-range layout of `user_data` and an
ImageNet in its class-folder layout, both of drawn shapes (tests/e2e/test_paper_miniature*.py)."""
from __future__ import annotations

import tarfile
from pathlib import Path

from protoclip.evaluate.prompts import load_prompts
from testkit.data import COLORS, SHAPES, add_member, make_png


def shards(folder: Path, count: int = 3, first_size: int = 30) -> str:
    """``count`` webdataset shards of 60 distinct pairs each (Fig. 7's 10 % subset of three: 18 pairs, one batch),
    captions "a <colour> <shape>", drawn at sizes from ``first_size`` px (two corpora from different sizes share no
    image: prepare keeps one pair per image); the brace-range pattern that names them."""
    folder.mkdir(parents=True)
    sizes = range(first_size, first_size + 2 * (3 * count), 2)  # 3 x 5 colours x 4 shapes = 60 pairs per shard
    pairs = [(c, s, size) for size in sizes for c in COLORS for s in SHAPES]
    drawn = folder / "draw.png"
    for k in range(count):
        with tarfile.open(folder / f"{k:05d}.tar", "w") as tar:
            for i, (color, shape, size) in enumerate(pairs[k * 60:(k + 1) * 60]):
                add_member(tar, f"s{k}_{i:03d}.png", make_png(drawn, color, shape, size).read_bytes())
                add_member(tar, f"s{k}_{i:03d}.txt", f"a {color} {shape}".encode())
    drawn.unlink()
    return f"{folder}/{{00000..{count - 1:05d}}}.tar"


def imagenet_folders(root: Path, per_class: dict[str, int], first_size: int = 80) -> dict[str, str]:
    """ImageNet's class-folder layout (``<split>/<wnid>/*.png``, evaluate.datasets.imagenet) with one of the first
    four ILSVRC wnids per shape, ``per_class[split]`` images of each (sizes from ``first_size`` px); {wnid: shape}."""
    wnids = load_prompts("imagenet").wnids[:len(SHAPES)]
    for split, n in per_class.items():
        for wnid, shape in zip(wnids, SHAPES):
            for i in range(n):
                color = list(COLORS)[i % len(COLORS)]
                make_png(root / split / wnid / f"{split}_{shape}_{i:02d}.png", color, shape,
                         first_size + 2 * (i // len(COLORS)))
    return dict(zip(wnids, SHAPES))


def training_csv(root: Path, split: str = "train") -> Path:
    """``user_data``'s CSV (filepath, caption) of the images under ``root/<split>/``, captions "a photo of a
    <wnid>" (image-only methods ignore them)."""
    lines = ["filepath,caption"] + [f"{p.relative_to(root)},a photo of a {p.parent.name}"
                                    for p in sorted((root / split).rglob("*.png"))]
    path = root / f"{split}.csv"
    path.write_text("\n".join(lines) + "\n")
    return path
