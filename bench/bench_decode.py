"""Images/s per DataLoader worker at training size: our data path vs open_clip_train's webdataset pipeline.

On real-size JPEG shards in img2dataset's webdataset layout (``<key>.jpg`` / ``.txt`` / ``.json``; default
400x300 pictures at quality 90, CC3M's size as img2dataset stores it), each pipeline reads the same shards with the
same number of DataLoader workers and batch size:

* ``ours``: :class:`protoclip.data.loading.pairs.ImageTextDataset` as the trainer builds it (manifest rows with the
  members' byte offsets and sha256, one ``pread`` + hash check + decode per image) with our training augmentation
  (``protoclip.data.loading.transforms.train_transform``: ``--augmentation``, the paper's ``protoclip`` by default) and
  the run's tokenizer, in a ``torch.utils.data.DataLoader`` over a random order (what an episode reads); its
  batches are uint8 (the trainer normalises them on the device);
* ``ours (protoclip), float out``: ``ours`` with the transform ending in ToTensor + Normalize, float32 batches:
  the data path before uint8 batches (``ours (protoclip) / ours (protoclip), float out``: the change's gain);
* ``open_clip_train``: ``open_clip_train.data.get_wds_dataset`` (shard shuffle, sample shuffle buffer,
  ``decode("pilrgb")``) with ``open_clip.image_transform(size, is_train=True)`` and open_clip's tokenizer (its
  tar reader without webdataset 1.0's end-of-shard markers, which open_clip_train 3.3 cannot read); float32
  normalised batches, as open_clip_train has them;
* ``open_clip_train (protoclip)``: open_clip_train's pipeline with our augmentation instead of its preprocess, ending
  in ToTensor + Normalize as open_clip's does: the like-for-like row for the paper's augmentation
  (``ours (protoclip) / open_clip_train (protoclip)``);
* ``ours (crop only)``: ``ours`` with ``augmentation: none``, RandomResizedCrop(0.9-1) only: the same image
  transform as open_clip's, so the like-for-like row;
* ``ours, torchvision blur``: ``ours`` with the blur as torchvision computes it (the 2-D kernel; the data path
  before :mod:`protoclip.data.loading.blur`);
* ``ours (<augmentation>), colour on the device``: ``ours`` with ``train.augment_on: device``, the workers cropping
  and flipping only (``ours (<augmentation>), colour on the device / ours (<augmentation>)``: what the workers gain);
  the colour steps' own cost is then the device's, timed after the rounds on a batch of ``--batch`` images
  (:class:`protoclip.data.loading.device_augment.DeviceAugment`; with CUDA on the GPU, else on one CPU thread), and
  so is the whole of ``train.decode_on: device`` (the shards' files decoded, cropped, flipped and coloured there: the
  workers then only read files);

Each pipeline's first batch (worker start, shuffle buffer fill) is not timed: images/s = the next ``--batches``
batches' images / their wall time / workers. The pipelines run interleaved (``--rounds`` rounds of each, one
process) so that a busy machine slows them alike; read the ratios (min and median over rounds).

A single-process section times the pieces behind the choice of decoder, interleaved: PIL's decode (what every
stage uses), PIL's JPEG draft mode (its reduced-scale decode: the scale PIL picks for the output size),
``torchvision.io.decode_jpeg`` (libjpeg-turbo; + the PIL image the transforms take) and whether its pixels equal
PIL's, and the ProtoCLIP blur as torchvision computes it vs :mod:`protoclip.data.loading.blur`'s 1-D passes (and their
pixel difference). With CUDA, ``torchvision.io.decode_jpeg(device="cuda")`` (nvJPEG) on batches too.

    python bench/bench_decode.py --out bench/results/decode_cpu2_<date>.txt     # 224 px, 1 worker
    python bench/bench_decode.py --workers 8 --batches 6 --images 2048 --shards 8  # a GPU machine's CPUs
    python bench/bench_decode.py --tiny                                          # seconds: CI smoke

Shards go to ``--root`` (a temporary folder by default; kept there when given, regenerated if the sizes differ).
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import io
import json
import os
import platform
import statistics
import sys
import tarfile
import tempfile
import time
import types
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synthetic_shards import VOCAB, _add, pictures  # noqa: E402

from protoclip.data.loading.device_augment import ORDER  # noqa: E402

TINY = {"images": 48, "shards": 2, "source": (80, 60), "size": 32, "batch": 8, "batches": 2, "rounds": 1,
        "workers": 1, "micro": 8}


def make_shards(root: Path, images: int, shards: int, source: tuple[int, int],
                seed: int = 0) -> tuple[str, pd.DataFrame]:
    """Write the shards (unless ``done.json`` matches) and return their brace pattern and our manifest rows
    (id, ``shard.tar::member`` path, caption, sha256, offset, size: what ``prepare`` stores)."""
    root.mkdir(parents=True, exist_ok=True)
    want = {"images": images, "shards": shards, "source": list(source), "seed": seed}
    paths = [root / f"{s:05d}.tar" for s in range(shards)]
    done = root / "done.json"
    if not (done.exists() and json.loads(done.read_text()) == want):
        jpgs = pictures(images, source, seed)
        rng = np.random.default_rng(seed)
        for s, path in enumerate(paths):
            with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
                for i in range(s, images, shards):
                    key = f"{s:05d}{i:04d}"
                    caption = " ".join(rng.choice(VOCAB, size=int(rng.integers(6, 11))))
                    w, h = Image.open(io.BytesIO(jpgs[i])).size
                    meta = {"url": f"https://example.invalid/{key}.jpg", "key": key, "caption": caption,
                            "status": "success", "width": w, "height": h}
                    _add(tar, f"{key}.jpg", jpgs[i], 1_700_000_000)
                    _add(tar, f"{key}.txt", caption.encode(), 1_700_000_000)
                    _add(tar, f"{key}.json", json.dumps(meta).encode(), 1_700_000_000)
        done.write_text(json.dumps(want))
    rows = []
    for path in paths:
        with tarfile.open(path) as tar:
            members = {m.name: m for m in tar.getmembers()}
            for name, m in members.items():
                if name.endswith(".jpg"):
                    key = name[:-4]
                    data = tar.extractfile(m).read()
                    rows.append({"id": key, "path": f"{path}::{name}", "offset": m.offset_data, "size": m.size,
                                 "sha256": hashlib.sha256(data).hexdigest(),
                                 "caption": tar.extractfile(members[key + ".txt"]).read().decode()})
    return f"{root}/{{00000..{shards - 1:05d}}}.tar", pd.DataFrame(rows)


def float_out(transform):
    """``transform`` (ending in PILToTensor: uint8) ending in ToTensor + Normalize instead: float32 normalised images,
    what open_clip's preprocess returns (and our data path before uint8 batches)."""
    from open_clip.transform import OPENAI_DATASET_MEAN, OPENAI_DATASET_STD
    from torchvision import transforms as T

    assert isinstance(transform.transforms[-1], T.PILToTensor)
    return T.Compose(transform.transforms[:-1] + [T.ToTensor(), T.Normalize(OPENAI_DATASET_MEAN, OPENAI_DATASET_STD)])


def ours_loader(df: pd.DataFrame, size: int, augmentation: str, batch: int, workers: int, seed: int,
                torchvision_blur: bool = False, float_images: bool = False, photometric: str = "workers"):
    from torch.utils.data import DataLoader, Subset
    from torchvision import transforms as T

    from protoclip.data.loading.pairs import ImageTextDataset
    from protoclip.data.loading.transforms import train_transform
    from protoclip.models import get_tokenizer

    transform = train_transform(size, augmentation, photometric)
    if torchvision_blur:  # the blur as torchvision computes it (2-D kernel): the data path before blur.py
        for step in transform.transforms:
            if isinstance(step, T.RandomApply) and isinstance(step.transforms[0], T.GaussianBlur):
                b = step.transforms[0]
                step.transforms[0] = T.GaussianBlur(b.kernel_size, b.sigma)
    if float_images:
        transform = float_out(transform)
    ds = ImageTextDataset(df, transform, get_tokenizer("RN50"))
    order = np.random.default_rng(seed).permutation(len(ds)).tolist()  # an episode's draw: a random order
    return DataLoader(Subset(ds, order), batch_size=batch, shuffle=False, num_workers=workers, drop_last=True,
                      persistent_workers=False)


def open_clip_loader(pattern: str, images: int, size: int, batch: int, workers: int, seed: int,
                     augmentation: str | None = None):
    import functools

    import open_clip
    import open_clip_train.data as ocd
    from webdataset.tariterators import tar_file_expander

    # webdataset 1.0 (the project's pin) ends each shard with an EOF marker ``{}`` that open_clip_train 3.3's
    # group_by_keys_nothrow does not expect (KeyError 'fname' at the first shard's end; open_clip_train pins
    # webdataset < 0.3, which yields none): no marker, as there
    ocd.tar_file_expander = functools.partial(tar_file_expander, eof_value=None)
    get_wds_dataset = ocd.get_wds_dataset
    args = types.SimpleNamespace(train_data=pattern, train_num_samples=images, train_data_upsampling_factors=None,
                                 dataset_resampled=False, seed=seed, batch_size=batch, workers=workers, world_size=1)
    preprocess = open_clip.image_transform(size, is_train=True)  # what create_model_and_transforms returns
    if augmentation is not None:  # our augmentation inside open_clip_train's pipeline, float out as open_clip's
        from protoclip.data.loading.transforms import train_transform

        preprocess = float_out(train_transform(size, augmentation))
    tokenizer = open_clip.get_tokenizer("RN50")
    return get_wds_dataset(args, preprocess, is_train=True, epoch=0, tokenizer=tokenizer).dataloader


def device_augment_cost(kind: str, size: int, batch: int, rounds: int, jpgs: list[bytes] | None = None) -> str:
    """Milliseconds per batch of ``DeviceAugment`` on the GPU if there is one, else on this process's one CPU
    thread (median of ``rounds`` x 5 timed batches after a warm-up): the colour steps of ``augment_on: device`` on
    uint8 crops, or with ``jpgs`` (files) the whole of ``decode_on: device``: decode, crop, flip and colour."""
    from protoclip.data.loading.device_augment import DeviceAugment

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    aug = DeviceAugment(kind, size)
    x = torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8, device=dev)
    blobs = [jpgs[i % len(jpgs)] for i in range(batch)] if jpgs else None

    def one(i: int) -> None:
        aug(aug.decode_crop(blobs, (i,), dev) if blobs else x, (i,))
    one(0)
    times = []
    for i in range(rounds * 5):
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        one(i)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    ms = statistics.median(times) * 1e3
    what = "decode, crop, flip and colour on the device" if jpgs else "colour on the device"
    return (f"device augmentation ({kind}, {what}): {ms:.1f} ms per batch of {batch} at {size} px on "
            f"{dev.type}{'' if dev.type == 'cuda' else ' (one thread; the GPU is what it is for)'}, "
            f"{ms / batch:.3f} ms an image")


def read_jpgs(df: pd.DataFrame, n: int) -> list[bytes]:
    """The first ``n`` JPEG files of the shards (manifest rows: shard path, member offset and size)."""
    out = []
    for path, off, size in df[["path", "offset", "size"]].head(n).itertuples(index=False):
        with open(path.split("::")[0], "rb") as f:
            out.append(os.pread(f.fileno(), int(size), int(off)))
    return out


def images_per_s(loader, batches: int, batch: int, workers: int) -> tuple[float, float, torch.dtype]:
    """(images/s per worker over ``batches`` batches after the first, seconds to the first batch, the images'
    dtype)."""
    t0 = time.perf_counter()
    it = iter(loader)
    next(it)
    first = time.perf_counter() - t0
    t1 = time.perf_counter()
    got, dtype = 0, None
    for _ in range(batches):
        images = next(it)[0]
        dtype = images.dtype
        assert images.shape[0] == batch
        got += images.shape[0]
    wall = time.perf_counter() - t1
    del it
    return got / wall / max(1, workers), first, dtype


def micro(jpgs: list[bytes], size: int, rounds: int) -> list[str]:
    """Single-process, interleaved: decoders and the blur (median ms per image over ``rounds`` passes)."""
    from torchvision import transforms as T
    from torchvision.io import ImageReadMode, decode_jpeg

    from protoclip.data.loading.transforms import BLUR_KERNEL_224, BLUR_SIGMA_224, gaussian_blur

    def pil(j):
        return Image.open(io.BytesIO(j)).convert("RGB")

    def draft(j):
        img = Image.open(io.BytesIO(j))
        img.draft("RGB", (size, size))
        return img.convert("RGB")

    def tv(j):
        t = decode_jpeg(torch.frombuffer(bytearray(j), dtype=torch.uint8), mode=ImageReadMode.RGB)
        return Image.fromarray(t.permute(1, 2, 0).numpy())

    def tv_tensor(j):
        return decode_jpeg(torch.frombuffer(bytearray(j), dtype=torch.uint8), mode=ImageReadMode.RGB)

    decoded = [pil(j) for j in jpgs]
    crops = [T.RandomResizedCrop(size, scale=(0.5, 1.0))(im) for im in decoded]
    ours_blur = gaussian_blur(size, "protoclip").transforms[0]
    tv_blur = T.GaussianBlur(ours_blur.kernel_size, ours_blur.sigma)
    fns = {"PIL decode (used)": (pil, jpgs), "PIL draft decode": (draft, jpgs),
           "torchvision.io.decode_jpeg -> PIL": (tv, jpgs), "torchvision.io.decode_jpeg (tensor)": (tv_tensor, jpgs),
           f"blur k={ours_blur.kernel_size[0]}, torchvision 2-D": (tv_blur, crops),
           f"blur k={ours_blur.kernel_size[0]}, protoclip.data.loading.blur (used)": (ours_blur, crops)}
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for name, (fn, items) in fns.items():
            t0 = time.perf_counter()
            for x in items:
                fn(x)
            times[name].append((time.perf_counter() - t0) / len(items) * 1e3)
    same = sum(np.array_equal(np.asarray(pil(j)), np.asarray(tv(j))) for j in jpgs)
    scales = sorted({f"{pil(j).size[0]}x{pil(j).size[1]} -> {draft(j).size[0]}x{draft(j).size[1]}" for j in jpgs})
    differ = total = worst = 0
    for seed, im in enumerate(crops):
        torch.manual_seed(seed)
        a = np.asarray(ours_blur(im)).astype(int)
        torch.manual_seed(seed)
        d = np.abs(a - np.asarray(tv_blur(im)))
        differ, total, worst = differ + int((d > 0).sum()), total + d.size, max(worst, int(d.max()))
    lines = [f"single process, {len(jpgs)} images, {rounds} interleaved passes (median ms per image):"]
    lines += [f"  {name:42s} {statistics.median(v):7.3f} ms" for name, v in times.items()]
    lines += [f"  decode_jpeg pixels equal to PIL's: {same}/{len(jpgs)} images",
              f"  PIL draft for {size}x{size}: {'; '.join(scales)} (draft reduces only by 1/2, 1/4, 1/8 and keeps "
              f">= the requested size)",
              f"  blur (kernel {ours_blur.kernel_size[0]}, sigma {BLUR_SIGMA_224} x {size}/224 ; 224 px kernel "
              f"{BLUR_KERNEL_224['protoclip']}): 1-D passes vs torchvision, same draws: {differ} of {total} "
              f"channel values differ, by at most {worst}"]
    if torch.cuda.is_available():
        batch = [torch.frombuffer(bytearray(j), dtype=torch.uint8) for j in jpgs]
        decode_jpeg(batch[:4], device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(rounds):
            decode_jpeg(batch, device="cuda", mode=ImageReadMode.RGB)
        torch.cuda.synchronize()
        lines.append(f"  torchvision.io.decode_jpeg(device='cuda') (nvJPEG), batches of {len(batch)}: "
                     f"{(time.perf_counter() - t0) / rounds / len(batch) * 1e3:7.3f} ms per image "
                     f"({torch.cuda.get_device_name()})")
    else:
        lines.append("  torchvision.io.decode_jpeg(device='cuda') (nvJPEG): not measured, no CUDA device")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=None, help="shard folder (default: a temporary one, deleted)")
    ap.add_argument("--images", type=int, default=1536)
    ap.add_argument("--shards", type=int, default=4, help="shards (open_clip_train needs >= workers)")
    ap.add_argument("--source", type=int, nargs=2, default=(400, 300), metavar=("W", "H"), help="JPEG size")
    ap.add_argument("--image-size", type=int, default=224, help="the transforms' output side")
    ap.add_argument("--augmentation", default="protoclip", help="our train transform (train.augmentation)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--batches", type=int, default=12, help="timed batches per pipeline and round")
    ap.add_argument("--workers", type=int, default=1, help="DataLoader workers of every pipeline")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of every pipeline")
    ap.add_argument("--micro", type=int, default=64, help="images of the single-process decode/blur section (0: skip)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiny", action="store_true", help="seconds-long smoke at tiny sizes (CI)")
    ap.add_argument("--out", type=Path, default=None, help="also write the output to this file")
    ap.add_argument("--note", default="", help="a line about the machine (e.g. 'shared by 8 sessions')")
    a = ap.parse_args(argv)
    if a.tiny:
        a.images, a.shards, a.source, a.image_size, a.batch = TINY["images"], TINY["shards"], TINY["source"], \
            TINY["size"], TINY["batch"]
        a.batches, a.rounds, a.workers, a.micro = TINY["batches"], TINY["rounds"], TINY["workers"], TINY["micro"]
    need = (a.batches + 1) * a.batch
    if a.images < need * max(1, a.workers):
        ap.error(f"--images must be >= (batches + 1) x batch x workers = {need * max(1, a.workers)}")
    torch.set_num_threads(1)
    lines: list[str] = []

    def say(s: str) -> None:
        print(s, flush=True)
        lines.append(s)

    say(f"# {' '.join(['python', 'bench/bench_decode.py', *(argv if argv is not None else sys.argv[1:])])}")
    say(f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
        f"{os.cpu_count()} CPUs, load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}, "
        f"torch {torch.__version__}" + (f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""))
    if a.note:
        say(f"# {a.note}")
    with tempfile.TemporaryDirectory(prefix="bench-decode-") as tmp:
        root = a.root or Path(tmp)
        t0 = time.perf_counter()
        pattern, df = make_shards(root, a.images, a.shards, tuple(a.source), a.seed)
        say(f"shards: {len(df)} JPEGs {a.source[0]}x{a.source[1]} (a fifth portrait), quality 90, mean "
            f"{df['size'].mean() / 1024:.1f} KiB, {a.shards} shards ({time.perf_counter() - t0:.1f} s); output "
            f"{a.image_size} px, batch {a.batch}, {a.workers} worker(s), {a.batches} timed batches a run")
        pipelines = {f"ours ({a.augmentation})": lambda: ours_loader(df, a.image_size, a.augmentation, a.batch,
                                                                      a.workers, a.seed),
                     "open_clip_train": lambda: open_clip_loader(pattern, a.images, a.image_size, a.batch, a.workers,
                                                                 a.seed),
                     f"open_clip_train ({a.augmentation})": lambda: open_clip_loader(
                         pattern, a.images, a.image_size, a.batch, a.workers, a.seed, a.augmentation),
                     f"ours ({a.augmentation}), float out": lambda: ours_loader(
                         df, a.image_size, a.augmentation, a.batch, a.workers, a.seed, float_images=True),
                     "ours (crop only)": lambda: ours_loader(df, a.image_size, "none", a.batch, a.workers, a.seed),
                     f"ours ({a.augmentation}), colour on the device": lambda: ours_loader(
                         df, a.image_size, a.augmentation, a.batch, a.workers, a.seed, photometric="device"),
                     "ours, torchvision blur": lambda: ours_loader(df, a.image_size, a.augmentation, a.batch,
                                                                   a.workers, a.seed, torchvision_blur=True)}
        if a.augmentation == "none" or a.tiny:
            del pipelines["ours (crop only)"], pipelines["ours, torchvision blur"]
            del pipelines[f"ours ({a.augmentation}), float out"]
            del pipelines[f"open_clip_train ({a.augmentation})"]
        rates: dict[str, list[float]] = {k: [] for k in pipelines}
        for r in range(a.rounds):
            for name, make in pipelines.items():
                ips, first, dtype = images_per_s(make(), a.batches, a.batch, a.workers)
                rates[name].append(ips)
                say(f"round {r + 1}: {name:30s} {ips:7.1f} images/s per worker (first batch {first:.1f} s, "
                    f"{str(dtype).removeprefix('torch.')})")
        say("images/s per worker (median of rounds):")
        for name, v in rates.items():
            say(f"  {name:30s} {statistics.median(v):7.1f}  (min {min(v):.1f}, max {max(v):.1f})")
        pairs = [(n, "open_clip_train") for n in rates if not n.startswith("open_clip_train")]
        if f"open_clip_train ({a.augmentation})" in rates:  # the same transform in both pipelines
            pairs.append((f"ours ({a.augmentation})", f"open_clip_train ({a.augmentation})"))
        if f"ours ({a.augmentation}), float out" in rates:  # uint8 batches vs the float ones before
            pairs.append((f"ours ({a.augmentation})", f"ours ({a.augmentation}), float out"))
        if f"ours ({a.augmentation}), colour on the device" in rates:  # what the workers gain
            pairs.append((f"ours ({a.augmentation}), colour on the device", f"ours ({a.augmentation})"))
        for name, ref in pairs:
            ratio = [x / y for x, y in zip(rates[name], rates[ref])]
            say(f"ratio {name} / {ref} per round: {' '.join(f'{x:.2f}' for x in ratio)}; "
                f"min {min(ratio):.2f}x, median {statistics.median(ratio):.2f}x")
        if a.augmentation in ORDER:
            say(device_augment_cost(a.augmentation, a.image_size, a.batch, a.rounds))
            say(device_augment_cost(a.augmentation, a.image_size, a.batch, a.rounds, jpgs=read_jpgs(df, a.batch)))
        if a.micro:
            for s in micro(read_jpgs(df, a.micro), a.image_size, a.rounds):
                say(s)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
