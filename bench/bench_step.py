"""Our CLIP training step vs open_clip's own, measured side by side in one run (issue 12).

* ``ours``: protoclip's real trainer (:func:`protoclip.train.loop.train`, ``method: clip``) on in-memory pairs
  (a tensor data set of uint8 images, as the training transform gives them, read by a DataLoader, ``num_workers``
  0; normalised on the device by the trainer): time per optimizer step from the episodes' ``time/train`` in
  ``train_log.jsonl`` (episode 0 dropped: allocator and cuDNN warm-up).
* ``open_clip``: the same architecture built by open_clip alone, ``open_clip.loss.ClipLoss`` and
  ``torch.optim.AdamW`` with open_clip_train's weight-decay groups and logit-scale clamp, over the same images
  float normalised (what open_clip's preprocess gives) in the same kind of DataLoader (``open_clip_train``'s
  ``train_one_epoch`` body without its logging), and once more on pre-stacked tensors already on the device
  (``open_clip (tensors)``: the compute-only bound).
* ``shards, <w> workers, colour in the workers``: our trainer reading JPEG images from webdataset shards
  (``shard.tar::member`` manifest paths, our ``ImageTextDataset`` + the ProtoCLIP augmentation) with ``w``
  DataLoader workers, for each count of ``--workers`` (the suite: 8 and 16). The
  fraction of step time spent waiting for data is ``1 - t(in-memory) / t(shards)``. The shards hold 400x300
  JPEGs at quality 90 (CC3M's size as img2dataset stores it; synthetic_shards.py's pictures, 512 distinct ones cycled);
  before 2026-11-28 they held PNG squares at the training size, cheaper to decode.
* on CUDA, a census of synchronising calls: one more run of ``ours`` (in memory) under
  ``torch.cuda.set_sync_debug_mode("warn")``, counting the warnings (every call that waits for the device) and
  where they come from; a step makes none, so the count should not grow with the steps (the episode ends read the
  step records back, issue 42).
* ``shards, <w> workers, colour on the device``: the same with ``train.augment_on: device`` (the workers crop and flip; the
  colour jitter, greyscale and blur run batched on the device, :mod:`protoclip.data.loading.device_augment`), its data
  wait counted the same way (the device's augmentation work included);
* ``shards, <w> workers, decoded on the device``: and ``train.decode_on: device``: the workers read the files, the device
  decodes them (nvJPEG on CUDA), crops, flips and augments.

The methods are interleaved (``--repeats`` rounds of each) in one process so that a busy machine slows them
alike; the ratios are what to read, the absolute numbers depend on the machine's load.

    python bench/bench_step.py                                           # CPU: tiny-rn 64 px, batch 128
    python bench/bench_step.py --model RN50 --batch 512 --steps 20 --workers 8 16   # GPU (bf16 autocast)
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synthetic_shards import photo_shards  # noqa: E402

from protoclip.files.layout import Layout  # noqa: E402
from protoclip.models import build_model, get_tokenizer  # noqa: E402
from protoclip.train.config import LossConfig, TrainConfig  # noqa: E402
from protoclip.train.loop import train  # noqa: E402

WORDS = "red green blue cat dog car tree house sun moon boat bird small large old new".split()


class TensorPairs(Dataset):
    """n fixed random images and captions held in memory: ``[i] -> (image, tokens, id)``. The images are uint8, as
    our training transform gives them (the trainer normalises on the device); ``normalised``: the same images as
    float32 normalised (open_clip's preprocess output, what open_clip_train's step takes)."""

    def __init__(self, n: int, image_size: int, tokenizer, seed: int = 0, normalised: bool = False):
        from protoclip.data.loading.transforms import normalize_batch

        g = torch.Generator().manual_seed(seed)
        images = torch.randint(0, 256, (n, 3, image_size, image_size), generator=g, dtype=torch.uint8)
        if normalised:  # in chunks: no float temporaries of the whole set
            out = torch.empty(images.shape, dtype=torch.float32)
            for i in range(0, n, 256):
                out[i:i + 256] = normalize_batch(images[i:i + 256])
            images = out
        self.images = images
        rng = np.random.default_rng(seed)
        self.tokens = tokenizer([" ".join(rng.choice(WORDS, size=5)) for _ in range(n)])
        self.ids = [f"s{i:07d}" for i in range(n)]

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int):
        return self.images[i], self.tokens[i], self.ids[i]


def ours(args, dataset: Dataset, out: Path, tag: str, workers: int, augment_on: str = "workers",
         decode_on: str = "workers") -> float:
    """Seconds per optimizer step of protoclip's trainer (CLIP), mean over episodes 1.."""
    cfg = TrainConfig(name=tag, method="clip", model=args.model, teacher=None, head_hidden=args.head_hidden,
                      epochs=1.0, episode_size=args.batch * args.steps, batch_size=args.batch, warmup_episodes=1,
                      lock_image_epoch=None, num_workers=workers, device=args.device, precision="auto", seed=0,
                      loss=LossConfig(external_weight=0.0), augment_on=augment_on, decode_on=decode_on)
    torch.manual_seed(0)
    model = build_model(cfg.model, head_hidden=cfg.head_hidden, head_out=cfg.head_out)
    layout = Layout(out / "data", out / "results")
    train(model, dataset, cfg, layout.train_files(tag))
    recs = [json.loads(line) for line in layout.train_log(tag).read_text().splitlines()]
    eps = [r for r in recs if r.get("kind") == "episode"][1:]
    return sum(r["time/train"] for r in eps) / sum(r["n_steps"] for r in eps)


def sync_census(args, dataset: Dataset, out: Path) -> list[str]:
    """Lines: the synchronising CUDA calls of one ``ours`` run (3 episodes of ``--steps`` steps), by call site."""
    import collections
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            ours(args, dataset, out, "sync", workers=0)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    sites = collections.Counter(f"{Path(w.filename).name}:{w.lineno}" for w in syncs)
    lines = [f"synchronising CUDA calls in one run of 3 episodes x {args.steps} steps (ours, in memory): {len(syncs)}"]
    lines += [f"  {n:5d}  {site}" for site, n in sites.most_common(12)]
    return lines


def open_clip_step_fn(args, device: torch.device):
    """open_clip_train's step: forward, ClipLoss, backward, AdamW, logit_scale clamp to [0, ln 100]."""
    import open_clip
    from open_clip.loss import ClipLoss

    torch.manual_seed(0)
    model = open_clip.create_model(args.model, pretrained=None, device=device)
    model.output_dict = True  # forward -> {"image_features", "text_features", "logit_scale"} (open_clip_train)
    model.train()

    def exclude(n, p):  # open_clip_train/main.py
        return p.ndim < 2 or "bn" in n or "ln" in n or "bias" in n or "logit_scale" in n

    named = list(model.named_parameters())
    opt = torch.optim.AdamW([
        {"params": [p for n, p in named if exclude(n, p) and p.requires_grad], "weight_decay": 0.0},
        {"params": [p for n, p in named if not exclude(n, p) and p.requires_grad], "weight_decay": 0.5},
    ], lr=5e-4, betas=(0.9, 0.999), eps=1e-8)
    loss_fn = ClipLoss()
    bf16 = device.type == "cuda"

    def step(images: torch.Tensor, texts: torch.Tensor) -> None:
        images, texts = images.to(device, non_blocking=True), texts.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
            out = model(images, texts)
            loss = loss_fn(**out, output_dict=True)["contrastive_loss"]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        with torch.no_grad():
            model.logit_scale.clamp_(0, math.log(100))

    return step


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def theirs(args, dataset: Dataset, device: torch.device, from_loader: bool) -> float:
    """Seconds per step of open_clip's step (episode-0-like warm-up of 2 steps excluded)."""
    step = open_clip_step_fn(args, device)
    loader = DataLoader(dataset, batch_size=args.batch, shuffle=False, num_workers=0, drop_last=True,
                        pin_memory=device.type == "cuda")
    if from_loader:
        batches = iter(loader)
        warm = [next(batches) for _ in range(2)]
        for images, texts, _ in warm:
            step(images, texts)
        sync(device)
        t0, n = time.perf_counter(), 0
        for images, texts, _ in batches:
            step(images, texts)
            n += 1
        sync(device)
        return (time.perf_counter() - t0) / max(n, 1)
    images, texts, _ = next(iter(loader))
    images, texts = images.to(device), texts.to(device)
    for _ in range(2):
        step(images, texts)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step(images, texts)
    sync(device)
    return (time.perf_counter() - t0) / args.steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny-rn")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=4, help="optimizer steps per episode (ours: 3 episodes, 1st dropped)")
    p.add_argument("--head-hidden", type=int, default=512)
    p.add_argument("--repeats", type=int, default=2, help="interleaved rounds of every method")
    p.add_argument("--workers", type=int, nargs="+", default=[2],
                   help="DataLoader workers of the shard variants: one count or several (8 16: each measured)")
    p.add_argument("--device", default="auto")
    p.add_argument("--skip-open-clip", action="store_true",
                   help="ours only (the data-wait rows): open_clip's step, measured before, is not run again")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: leave torch's default)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from protoclip.jobs.devices import resolve_device
    from protoclip.data.loading.pairs import ImageTextDataset
    from protoclip.data.loading.transforms import train_transform

    device = resolve_device(args.device)
    tok = get_tokenizer(args.model)
    size = build_model(args.model, head_hidden=0).image_size
    n = 3 * args.batch * args.steps  # 3 episodes of `steps` steps: 1 epoch
    mem = TensorPairs(n, size, tok)  # uint8, as our data path gives them
    mem_float = TensorPairs(n, size, tok, normalised=True)  # the same images, float normalised: open_clip's input
    shard_paths = {"colour in the workers": ("workers", "workers"), "colour on the device": ("device", "workers"),
                   "decoded on the device": ("device", "device")}  # label -> (augment_on, decode_on)
    times: dict[str, list[float]] = {"ours": []}
    if not args.skip_open_clip:
        times.update({"open_clip": [], "open_clip (tensors)": []})
    times.update({f"shards, {w} workers, {where}": [] for w in args.workers for where in shard_paths})
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "shards").mkdir()
        manifest = photo_shards(tmp / "shards", n, WORDS)
        datasets = {where: ImageTextDataset(manifest, train_transform(size, "protoclip", aug, dec), tok)
                    for where, (aug, dec) in shard_paths.items()}
        for r in range(args.repeats):
            times["ours"].append(ours(args, mem, tmp / f"m{r}", f"mem{r}", workers=0))
            if not args.skip_open_clip:
                times["open_clip"].append(theirs(args, mem_float, device, from_loader=True))
                times["open_clip (tensors)"].append(theirs(args, mem_float, device, from_loader=False))
            for w in args.workers:
                for i, (where, (aug, dec)) in enumerate(shard_paths.items()):
                    times[f"shards, {w} workers, {where}"].append(
                        ours(args, datasets[where], tmp / f"s{r}_{w}_{i}", f"shards{r}_{w}_{i}", workers=w,
                             augment_on=aug, decode_on=dec))
        census = sync_census(args, mem, tmp / "sync") if device.type == "cuda" else []
    dev = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    prec = "bf16 autocast" if device.type == "cuda" else "fp32"
    print(f"\nCLIP training step: {args.model} {size}px, batch {args.batch}, {prec}, on {dev}; "
          f"median of {args.repeats} interleaved rounds; torch {torch.__version__}")
    print(f"{'path':<46} {'s/step':>8} {'samples/s':>10} {'ours / this speed':>18}")
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in med.items():
        print(f"{k:<46} {v:>8.3f} {args.batch / v:>10.1f} {v / med['ours']:>17.2f}x")
    if not args.skip_open_clip:
        print(f"ours vs open_clip (same DataLoader): {med['open_clip'] / med['ours']:.2f}x open_clip's speed "
              f"(target >= 1.0)")
    for w in args.workers:
        for where in shard_paths:
            wait = max(0.0, 1.0 - med["ours"] / med[f"shards, {w} workers, {where}"])
            print(f"ours reading JPEG shards with {w} workers, {where}: {100 * wait:.0f}% of step time waiting "
                  f"for data (target <= 5%)")
    for line in census:
        print(line)


if __name__ == "__main__":
    main()
