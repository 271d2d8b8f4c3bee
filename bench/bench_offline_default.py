"""Training throughput of the offline default on the CPU machine, before and after issue 12 (side by side).

The offline default's training jobs run as Snakemake runs them on 2 cores: two one-thread jobs at a time
(Snakemake sets OMP_NUM_THREADS to a rule's ``threads``, 1 here). Each variant below starts two training
processes at once, each with one thread, on the real prepared corpus (``data/prepared``, built by ``make run``),
with the real trainer (:func:`protoclip.train.loop.train`, ``method: clip``, tiny-rn, batch 128), and reads the
time per optimizer step from the episodes' ``time/train`` (episode 0 dropped). Variants:

* ``before``: the settings issue 12 started from: the tiny configs' 64 px, AdamW's default (foreach)
  implementation, 2 DataLoader workers per job;
* ``64 px, fused, 0 workers``: today's optimizer and loading at the old input size;
* ``now``: the offline default today: 32 px (``train.image_size``), ``fused=True`` AdamW, no workers.

Variants run one after the other, ``--repeats`` rounds interleaved; the ratios are what to read.

    python bench/bench_offline_default.py                  # ~5 min on 2 idle cores
    python bench/bench_offline_default.py --repeats 2 --episodes 4
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from pathlib import Path

VARIANTS = {  # name: (image_size, fused AdamW, DataLoader workers)
    "before": (64, False, 2),
    "64 px, fused, 0 workers": (64, True, 0),
    "now": (32, True, 0),
}


def _job(args: dict, variant: str, seed: int, out: str, queue) -> None:
    """One training process (spawned): one thread, the variant's settings; puts seconds per step."""
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    size, fused, workers = VARIANTS[variant]
    if not fused:  # the optimizer before issue 12: AdamW's default implementation
        real = torch.optim.AdamW

        class DefaultAdamW(real):
            def __init__(self, *a, fused=None, **kw):
                super().__init__(*a, **kw)

        torch.optim.AdamW = DefaultAdamW
    from protoclip.data.loading.pairs import ImageTextDataset, load_manifest
    from protoclip.files.layout import Layout
    from protoclip.models import build_model, get_tokenizer
    from protoclip.train.loop import train
    from protoclip.registry import method_class
    from protoclip.train.config import TrainConfig

    cfg = TrainConfig(name="bench", method="clip", model="tiny-rn", image_size=size, teacher=None, head_hidden=512,
                      epochs=args["episodes"] * args["episode_size"] / 4168, episode_size=args["episode_size"],
                      batch_size=128, warmup_episodes=1, lock_image_epoch=None, num_workers=workers, seed=seed)
    data = Layout(Path(args["data"]), Path(out))
    df = load_manifest(data, split="train")
    torch.manual_seed(seed)
    model = build_model(cfg.model, head_hidden=cfg.head_hidden, image_size=size)
    ds = ImageTextDataset(df, method_class("clip").train_transform(cfg, size), get_tokenizer(cfg.model))
    layout = Layout(Path(args["data"]), Path(out))
    train(model, ds, cfg, layout.train_files("bench"))
    recs = [json.loads(line) for line in layout.train_log("bench").read_text().splitlines()]
    eps = [r for r in recs if r.get("kind") == "episode"][1:]
    queue.put(sum(r["time/train"] for r in eps) / sum(r["n_steps"] for r in eps))


def run_pair(args: dict, variant: str, tmp: Path) -> list[float]:
    """Two one-thread training processes at once (as Snakemake's 2 jobs on 2 cores): seconds per step each."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_job, args=(args, variant, s, str(tmp / f"{variant}-{s}"), q)) for s in (0, 1)]
    for p in procs:
        p.start()
    out = [q.get() for _ in procs]
    for p in procs:
        p.join()
        if p.exitcode:
            raise RuntimeError(f"{variant}: a training process failed ({p.exitcode})")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="data", help="data_dir holding prepared/ (make run builds it)")
    p.add_argument("--episodes", type=int, default=3, help="episodes per run (the first is dropped)")
    p.add_argument("--episode-size", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=1, help="interleaved rounds of every variant")
    args = vars(p.parse_args())
    if not (Path(args["data"]) / "prepared" / "manifest.parquet").exists():
        raise SystemExit(f"{args['data']}/prepared/manifest.parquet not found: run `make run` (or prepare) first")
    per_step: dict[str, list[float]] = {v: [] for v in VARIANTS}
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args["repeats"]):
            for v in VARIANTS:
                per_step[v] += run_pair(args, v, Path(tmp) / f"r{r}")
    print(f"# {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores, load average at the end "
          f"{os.getloadavg()[0]:.1f}; {time.time() - t0:.0f} s in all")
    print(f"CLIP training on the offline corpus: tiny-rn, batch 128, 2 one-thread processes at once, "
          f"{args['episodes']} episodes of {args['episode_size']} (first dropped), median over processes/rounds")
    print(f"{'variant':28s} {'s/step':>7s} {'samples/s (2 jobs)':>19s} {'vs before':>9s}")
    base = statistics.median(per_step["before"])
    for v, ts in per_step.items():
        s = statistics.median(ts)
        print(f"{v:28s} {s:7.3f} {2 * 128 / s:19.1f} {base / s:8.2f}x")


if __name__ == "__main__":
    main()
