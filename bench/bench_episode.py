"""Episodic-training cost of ProtoCLIP vs CLIP, measured side by side in one run (paper Sec. IV-G4, Fig. 9).

The paper reports ProtoCLIP's extra steps (feature extraction 31 %, k-means 2.3 % of an episode) and its
training time in "relative epochs" of CLIP (Table IV: 32 ProtoCLIP epochs = 43.1 CLIP epochs, x1.35).
This trains both methods with the real trainer (protoclip.train.loop.train) on the same synthetic pairs (speed
only, no learning claims) and prints the time split per episode and the ProtoCLIP / CLIP ratio. The pairs are
either random uint8 images in memory (``--data memory``: the compute alone) or 400x300 photo JPEGs in webdataset
shards in img2dataset's layout read by ``--workers`` DataLoader workers with the ProtoCLIP augmentation
(``--data shards``: the extraction and training passes wait for data as a real run does, the loader reading on
across pass boundaries); ``--augment-on workers device`` measures both places of the colour augmentation, for
both passes.

    python bench/bench_episode.py                                  # CPU: tiny-rn, 64 px, in memory
    python bench/bench_episode.py --model RN50 --image-size 224 --episode 16384 --batch 512 \
        --data shards --workers 8 --augment-on workers device      # GPU
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import sys

import numpy as np
import torch
from torch.utils.data import Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synthetic_shards import photo_shards  # noqa: E402

from protoclip.data.loading.pairs import ImageTextDataset  # noqa: E402
from protoclip.data.loading.transforms import train_transform  # noqa: E402
from protoclip.files.layout import Layout
from protoclip.models import build_model, get_tokenizer
from protoclip.train.config import KMeansConfig, LossConfig, TrainConfig
from protoclip.train.loop import train

WORDS = "red green blue cat dog car tree house sun moon boat bird small large old new".split()


class SyntheticPairs(Dataset):
    """n uint8 images (as the training transform gives them) made on the fly from a per-item seed (no storage) and
    random 5-word captions."""

    def __init__(self, n: int, image_size: int, tokenizer, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.tokens = tokenizer([" ".join(rng.choice(WORDS, size=5)) for _ in range(n)])
        self.n, self.size = n, image_size

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(i)
        image = torch.randint(0, 256, (3, self.size, self.size), generator=g, dtype=torch.uint8)
        return image, self.tokens[i], f"s{i:07d}"


def run(method: str, args, dataset, out: Path, augment_on: str = "workers") -> dict:
    cfg = TrainConfig(augment_on=augment_on,
        name=method, method=method, model=args.model, teacher=None, epochs=args.episodes * args.episode / len(dataset),
        episode_size=args.episode, batch_size=args.batch, warmup_episodes=1, lock_image_epoch=None,
        num_workers=args.workers, device=args.device, precision="auto", seed=0,
        head_hidden=args.head_hidden, kmeans=KMeansConfig(backend="auto"), loss=LossConfig(external_weight=0.0))
    torch.manual_seed(0)
    model = build_model(cfg.model, head_hidden=cfg.head_hidden, head_out=cfg.head_out)
    layout = Layout(out / "data", out / "results")
    tag = f"{method}_{augment_on}"
    start = time.perf_counter()
    train(model, dataset, cfg, layout.train_files(tag))
    total = time.perf_counter() - start
    episodes = [json.loads(line) for line in layout.train_log(tag).read_text().splitlines()]
    episodes = [e for e in episodes if e.get("kind") == "episode"][1:]  # drop episode 0 (warm-up, compile)
    split = {k: float(np.mean([e.get(f"time/{k}", 0.0) for e in episodes])) for k in ("extract", "kmeans", "pbt", "train")}
    # the first-batch waits after the episode's pass boundaries (inside the phases above, not added to them)
    wait = float(np.mean([e.get("time/data_wait", 0.0) for e in episodes]))
    return {"total_s": total, "episode_s": sum(split.values()), **split, "data_wait": wait}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny-rn")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--episode", type=int, default=512, help="m, samples per episode")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--episodes", type=int, default=3)
    p.add_argument("--head-hidden", type=int, default=2048)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--device", default="auto")
    p.add_argument("--data", choices=("memory", "shards"), default="memory",
                   help="random uint8 images in memory, or photo JPEG shards read and augmented by the workers")
    p.add_argument("--augment-on", nargs="+", choices=("workers", "device"), default=["workers"],
                   help="train.augment_on of the shard runs (each measured; in memory the images are not augmented)")
    args = p.parse_args()
    tok = get_tokenizer(args.model)
    n = args.episode * args.episodes
    with tempfile.TemporaryDirectory() as tmp:
        if args.data == "memory":
            data = {"workers": SyntheticPairs(n, args.image_size, tok)}
        else:
            manifest = photo_shards(Path(tmp), n, WORDS)
            data = {on: ImageTextDataset(manifest, train_transform(args.image_size, "protoclip", on), tok)
                    for on in args.augment_on}
        res = {(m, on): run(m, args, ds, Path(tmp) / on, on) for on, ds in data.items() for m in ("clip", "protoclip")}
    dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() and args.device != "cpu" else "cpu"
    print(f"\nepisodic training: {args.model} {args.image_size}px, m={args.episode}, batch {args.batch}, "
          f"K=m/10, {args.episodes} episodes on {dev} (mean over episodes 1..), data: {args.data}, "
          f"{args.workers} workers")
    print(f"{'method':<10} {'augment_on':<10} {'episode s':>10} {'extract':>9} {'k-means':>9} {'pbt':>7} {'train':>9} "
          f"{'data wait s':>12}")
    for (m, on), r in res.items():
        e = r["episode_s"] or 1.0
        print(f"{m:<10} {on:<10} {r['episode_s']:>10.2f} {100 * r['extract'] / e:>8.1f}% "
              f"{100 * r['kmeans'] / e:>8.1f}% {100 * r['pbt'] / e:>6.1f}% {100 * r['train'] / e:>8.1f}% "
              f"{r['data_wait']:>12.3f}")
    for on in data:
        ratio = res["protoclip", on]["episode_s"] / max(res["clip", on]["episode_s"], 1e-9)
        print(f"ProtoCLIP / CLIP time per episode (augment_on: {on}): x{ratio:.2f}  "
              f"(paper, Table IV: 43.1 / 32.0 = x1.35)")

if __name__ == "__main__":
    main()
