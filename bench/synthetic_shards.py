"""A synthetic image-caption corpus in img2dataset's webdataset layout, for the data-path scale benchmark.

    python bench/synthetic_shards.py /tmp/protoclip-scale/100000 --pairs 100000 [--image-size 64] [--workers 2]

Writes ``{shard:05d}.tar`` with 1000 samples a shard (the last one shorter), each sample three members as
img2dataset writes them: ``<key>.jpg`` (real JPEG bytes), ``<key>.txt`` (the caption) and ``<key>.json``
(url, key, caption, status, width, height), ``<key>`` = 5-digit shard + 4-digit index; beside each tar its
``{shard:05d}.parquet`` and ``{shard:05d}_stats.json``, and ``done.json`` last (an interrupted run is
redone). Keep corpora out of git (/tmp, or an ignored folder).

Pictures: 4096 distinct coloured-shape images are JPEG-encoded once; every sample gets one of them with its
key written into a JPEG comment (COM) segment, so all image bytes differ (``prepare`` de-duplicates by
sha256) while generating a million costs no more than writing the tars. Decoding cost is that of a real
JPEG of the same size. Captions: 6-10 random words from a fixed vocabulary.
"""
from __future__ import annotations

import argparse
import io
import json
import struct
import tarfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image, ImageDraw

PER_SHARD = 1000  # samples a shard (the issue's; img2dataset's default is 10000)
POOL = 4096  # distinct pictures
VOCAB = ("red green blue yellow purple orange black white small large old new tiny huge bright dark cat dog bird "
         "car boat tree house flower mountain river road city beach forest sky cloud sun moon star person child "
         "table chair lamp book cup plate bottle window door wall street garden field snow rain night morning "
         "a the of with on in near under over beside and two three many some").split()


def pictures(n: int, source: tuple[int, int], seed: int) -> list[bytes]:
    """``n`` natural-looking JPEGs of ``source`` (w, h) px, quality 90: random crops (40-100 % of the side),
    flips and colour shifts of scikit-learn's two sample photographs, a fifth of them in portrait."""
    from sklearn.datasets import load_sample_images

    photos = [Image.fromarray(a) for a in load_sample_images().images]
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        photo = photos[i % len(photos)]
        w, h = photo.size
        f = rng.uniform(0.4, 1.0)
        cw, ch = int(w * f), int(h * f)
        x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
        size = source if rng.random() >= 0.2 else source[::-1]
        img = photo.crop((x, y, x + cw, y + ch)).resize(size, Image.BICUBIC)
        if rng.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        a = np.asarray(img, np.float32) * rng.uniform(0.7, 1.3, 3)
        buf = io.BytesIO()
        Image.fromarray(np.clip(a, 0, 255).astype(np.uint8)).save(buf, format="JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def photo_shards(root: Path, n: int, words, per_shard: int = 256, distinct: int = 512, seed: int = 0) -> pd.DataFrame:
    """n 400x300 photo JPEGs (CC3M's size as img2dataset stores it; ``distinct`` of :func:`pictures`, cycled) in
    webdataset tars laid out as img2dataset writes them (``<key>.jpg``, ``<key>.txt``, ``<key>.json``), captions of 5
    of ``words``; a manifest frame of their ``shard.tar::member`` paths, as our reader takes them (the step and
    episode benches' data-wait input)."""
    jpgs = pictures(min(n, distinct), (400, 300), seed)
    rng = np.random.default_rng(seed)
    rows = []
    for s in range(-(-n // per_shard)):
        shard = root / f"{s:05d}.tar"
        with tarfile.open(shard, "w") as tar:
            for i in range(s * per_shard, min(n, (s + 1) * per_shard)):
                key, caption = f"{s:05d}{i % per_shard:04d}", " ".join(rng.choice(words, size=5))
                meta = json.dumps({"key": key, "caption": caption, "status": "success", "width": 400, "height": 300})
                for member, data in ((f"{key}.jpg", jpgs[i % len(jpgs)]), (f"{key}.txt", caption.encode()),
                                     (f"{key}.json", meta.encode())):
                    _add(tar, member, data, 1_700_000_000)
                rows.append({"id": key, "path": f"{shard}::{key}.jpg", "caption": caption})
    return pd.DataFrame(rows)


def picture_pool(size: int, seed: int = 0) -> list[bytes]:
    """POOL distinct JPEGs: a random background, 1-3 random shapes (quality 90, as img2dataset's default 95)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(POOL):
        img = Image.new("RGB", (size, size), tuple(int(c) for c in rng.integers(0, 256, 3)))
        d = ImageDraw.Draw(img)
        for _ in range(int(rng.integers(1, 4))):
            x0, y0 = (int(v) for v in rng.integers(0, size - size // 4, 2))
            w, h = (int(v) for v in rng.integers(size // 8, size // 2, 2))
            box = (x0, y0, min(size - 1, x0 + w), min(size - 1, y0 + h))
            fill = tuple(int(c) for c in rng.integers(0, 256, 3))
            (d.ellipse if rng.random() < 0.5 else d.rectangle)(box, fill=fill)
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def with_comment(jpeg: bytes, text: bytes) -> bytes:
    """The JPEG with a COM segment carrying ``text`` right after SOI (still a valid JPEG, other bytes)."""
    return jpeg[:2] + b"\xff\xfe" + struct.pack(">H", len(text) + 2) + text + jpeg[2:]


def _add(tar: tarfile.TarFile, name: str, data: bytes, mtime: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), mtime, 0o644
    tar.addfile(info, io.BytesIO(data))


def write_shard(root: str, shard: int, n: int, size: int, seed: int) -> int:
    rng = np.random.default_rng([seed, shard])
    pool = _POOL_CACHE.get(size) or _POOL_CACHE.setdefault(size, picture_pool(size, seed))
    rows = []
    path = Path(root) / f"{shard:05d}.tar"
    with tarfile.open(path.with_suffix(".tar.part"), "w", format=tarfile.GNU_FORMAT) as tar:
        for i in range(n):
            key = f"{shard:05d}{i:04d}"
            caption = " ".join(rng.choice(VOCAB, size=int(rng.integers(6, 11))))
            jpg = with_comment(pool[int(rng.integers(POOL))], key.encode())
            meta = {"url": f"https://example.invalid/{key}.jpg", "key": key, "caption": caption, "status": "success",
                    "error_message": None, "width": size, "height": size, "original_width": size,
                    "original_height": size}
            _add(tar, f"{key}.jpg", jpg, 1_700_000_000)
            _add(tar, f"{key}.txt", caption.encode(), 1_700_000_000)
            _add(tar, f"{key}.json", json.dumps(meta).encode(), 1_700_000_000)
            rows.append(meta)
    pd.DataFrame(rows).to_parquet(path.with_suffix(".parquet"), index=False)
    (Path(root) / f"{shard:05d}_stats.json").write_text(json.dumps({"count": n, "successes": n, "failed_to_download": 0,
                                                                     "failed_to_resize": 0}))
    path.with_suffix(".tar.part").rename(path)
    return n


_POOL_CACHE: dict[int, list[bytes]] = {}


def _write_star(args) -> int:
    return write_shard(*args)


def generate(root: Path, pairs: int, size: int = 64, workers: int = 2, seed: int = 0) -> str:
    """Write the corpus (unless ``done.json`` says it is there) and return its brace shard pattern."""
    root.mkdir(parents=True, exist_ok=True)
    n_shards = -(-pairs // PER_SHARD)
    pattern = str(root / f"{{00000..{n_shards - 1:05d}}}.tar")
    done = root / "done.json"
    want = {"pairs": pairs, "image_size": size, "seed": seed, "per_shard": PER_SHARD}
    if done.exists() and json.loads(done.read_text()) == want:
        return pattern
    jobs = [(str(root), s, min(PER_SHARD, pairs - s * PER_SHARD), size, seed) for s in range(n_shards)]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=workers) as pool:
        written = sum(pool.map(_write_star, jobs, chunksize=4))
    assert written == pairs
    done.write_text(json.dumps(want))
    print(f"generated {pairs} pairs in {n_shards} shards under {root} in {time.perf_counter() - t0:.1f} s")
    return pattern


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("--pairs", type=int, required=True)
    ap.add_argument("--image-size", type=int, default=64)  # the CPU configs' prepare.image_size
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print(generate(args.root, args.pairs, args.image_size, args.workers, args.seed))


if __name__ == "__main__":
    main()
