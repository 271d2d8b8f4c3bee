"""What the decoded-image cache (``train.image_cache_mb``) saves a training run's data side.

The run's training dataset as the train stage builds it (``protoclip.train.stage.TrainJob.dataset``: the manifest's
train split, the run's augmentation, its tokenizer) is read item by item in the order of the whole run (every
episode's indices, ``--passes`` times: 2 for a method with an extraction pass, as ProtoCLIP and PCL, 1 for CLIP),
without the model, with the cache off and on, in alternating rounds, at one thread as the DAG's jobs run. The
items of both are compared (the same seed: the same tensors). Needs the offline default prepared
(``snakemake --cores 2 --until prepare`` or ``make run``).

    python bench/bench_image_cache.py                                   # protoclip_tiny_s0, 3 rounds
    python bench/bench_image_cache.py --run clip_tiny_s0 --passes 1
"""
from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

import torch

from protoclip.files.layout import Layout
from protoclip.models import get_tokenizer
from protoclip.project import load_config
from protoclip.registry import method_class
from protoclip.train.episode import episode_size_for, sample_episode
from protoclip.train.schedule import Schedule
from protoclip.data.loading.training_set import resolve_sources
from protoclip.train.stage import TrainJob


def read_run(dataset, order, passes: int, seed: int) -> tuple[float, torch.Tensor]:
    """Seconds to read every item of ``order`` ``passes`` times, and a checksum of the images read."""
    random.seed(seed)
    torch.manual_seed(seed)
    total = torch.zeros((), dtype=torch.float64)
    t0 = time.perf_counter()
    for indices in order:
        for _ in range(passes):
            for i in indices:
                total += dataset[int(i)][0].double().sum()
    return time.perf_counter() - t0, total


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="config/config.yaml")
    ap.add_argument("--run", default="protoclip_tiny_s0")
    ap.add_argument("--passes", type=int, default=2, help="reads of each episode (2: extraction + training)")
    ap.add_argument("--cache-mb", type=int, default=None, help="default: the run's train.image_cache_mb")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    cfg = load_config(args.config)
    tcfg = cfg.run(args.run)
    cache_mb = tcfg.image_cache_mb if args.cache_mb is None else args.cache_mb
    model = method_class(tcfg.method).build_model(tcfg)
    tokenizer = get_tokenizer(tcfg.model, context_length=model.context_length)
    job = TrainJob(tcfg, Layout.from_config(cfg), resolve_sources(tcfg.data, cfg.prepare.offline_sources),
                   cfg.evaluate, cfg.paths, Path(cfg.source))
    M = len(job.dataset(model.image_size, tokenizer))
    m = episode_size_for(tcfg.episode_size, M)
    n_episodes = Schedule.build(base_lr=tcfg.lr, epochs=tcfg.epochs, dataset_size=M, episode_size=m,
                                batch_size=tcfg.batch_size, warmup_episodes=tcfg.warmup_episodes,
                                lock_image_epoch=tcfg.lock_image_epoch, world_size=1,
                                warmup_samples=tcfg.warmup_samples).n_episodes
    order = [sample_episode(M, m, tcfg.seed, e) for e in range(n_episodes)]
    reads = n_episodes * m * args.passes
    print(f"bench_image_cache: run {args.run} ({tcfg.method}), {M} pairs, {n_episodes} episodes of {m}, "
          f"{args.passes} pass(es): {reads} reads a run; cache {cache_mb} MB vs none; {args.rounds} rounds")
    times: dict[str, list[float]] = {"none": [], "cache": []}
    sums = {}
    for r in range(args.rounds):
        for name, mb in (("none", 0), ("cache", cache_mb)) if r % 2 == 0 else (("cache", cache_mb), ("none", 0)):
            tcfg.image_cache_mb = mb  # a fresh dataset each time: the cache starts empty, as in a run
            dataset = job.dataset(model.image_size, tokenizer)
            seconds, total = read_run(dataset, order, args.passes, tcfg.seed)
            times[name].append(seconds)
            sums.setdefault(name, total)
            kept = dataset._images.nbytes / 2**20
            print(f"  round {r}  {name:5s}  {seconds:7.2f} s  ({1e3 * seconds / reads:.3f} ms a read; "
                  f"kept {kept:.1f} MB)")
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"median: none {med['none']:.2f} s, cache {med['cache']:.2f} s: {med['none'] - med['cache']:.2f} s less a "
          f"run ({med['cache'] / med['none']:.2f}x the data side); the same images: {bool(sums['none'] == sums['cache'])}")
    return [{"run": args.run, "reads": reads, **{f"{k}_s": v for k, v in med.items()}}]


if __name__ == "__main__":
    main()
