"""The claims ledger's cost at the offline default's sizes: seconds per claim, and the report with and without it.

`make run`'s ledger times itself (``results/tables/claims.csv``, column ``seconds``); this script measures the
same code on results shaped exactly like the offline default's, without training anything: the shipped
``config/config.yaml`` (every target, every run, 3 seeds on the main rows, the 24 claims of config/claims.yaml),
metrics files and per-example results at the offline sizes (Fashion-MNIST's 5,000 test images, digits' 540,
the held-out pairs' 434 images and captions) with synthetic hits, and train logs of 4 episodes per epoch. The
verdicts are meaningless; the cost depends on the sizes only (resampling draws, not values).

Interleaved rounds, one process:

* ``report``: ``protoclip report``'s ``run_report`` as shipped (tables with the difference rows' intervals,
  figures, the ledger);
* ``no ledger``: the same with ``claims.files: []`` and no intervals in the tables (the report before issue 29).

    python bench/bench_claims.py                 # ~2 min on 2 idle cores
    python bench/bench_claims.py --repeats 3 --resamples 2000
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
SIZES = {"fashion_mnist": 5000, "digits": 540, "heldout_pairs": 434}  # test images of the offline sets
EPISODES_PER_EPOCH = 4  # 4,168 training pairs in episodes of 1024


def build(root: Path, resamples: int):
    """The shipped config in ``root`` with synthetic results of every evaluation the DAG would run."""
    from protoclip.files import records
    from protoclip.files.completion import finish
    from protoclip.project import load_config
    from protoclip.dag.stages import evaluation_requests
    from protoclip.files.layout import Layout
    from protoclip.tasks import TaskStatus

    shutil.copytree(ROOT / "config", root / "config")
    cfg_file = root / "config" / "config.yaml"
    data = yaml.safe_load(cfg_file.read_text())
    data["paths"].update(results_dir=str(root / "results"), data_dir=str(root / "data"),
                         mlflow_uri=f"sqlite:///{root}/mlflow.db")
    data["claims"]["resamples"] = resamples
    cfg_file.write_text(yaml.safe_dump(data, sort_keys=False))
    cfg = load_config(cfg_file)
    lay = Layout.from_config(cfg)
    rng = np.random.default_rng(0)
    for run, sets in evaluation_requests(cfg).items():
        for dataset, tasks in sets.items():
            folder = lay.eval_dir(run, dataset)
            folder.mkdir(parents=True, exist_ok=True)
            files = []
            for task in tasks:
                path = lay.metrics(run, task, dataset)
                if dataset not in SIZES:
                    files.append(records.write_skip(path, run, dataset, task, TaskStatus(
                        TaskStatus.MISSING, f"skipped: {dataset} not found")))
                    continue
                n = SIZES[dataset]
                if task == "retrieval":
                    ranks = {"image_to_text_rank": rng.integers(0, 60, n), "text_to_image_rank": rng.integers(0, 60, n)}
                    m = {f"{d}_R@{k}": 100.0 * int((ranks[f"{d}_rank"] < k).sum()) / n
                         for d in ("image_to_text", "text_to_image") for k in (1, 5, 10)}
                    m["mean_recall"] = float(np.mean(list(m.values())))
                    ex = {**ranks, "text_to_image": np.arange(n)}
                elif task in ("zeroshot", "linear", "knn"):
                    hits = {"top1": rng.random(n) < 0.6, "top5": rng.random(n) < 0.9}
                    m = {k: (100.0 * float(h.mean()) if task == "linear" else 100.0 * int(h.sum()) / n)
                         for k, h in hits.items()}
                    ex = {**hits, "labels": np.arange(n) % 10}
                else:
                    m, ex = {"ari": 0.2, "ami": 0.3, "nemd": 1.0, "uniformity": -2.0, "intra_class_spread": 0.5}, None
                files.append(records.write_metrics(path, {"run": run, "dataset": dataset, "task": task,
                                                          "metrics": m}))
                if ex is not None:
                    files.append(records.write_examples(lay.examples(run, task, dataset), ex))
            finish(lay.eval_tasks(run, dataset), {"tasks": {t: "ran" for t in tasks}}, files)
        records.write_summary(lay.metrics_summary(run), records.run_results(lay, run))  # as `collect` does
    for run in cfg.run_names():
        n = int(round(EPISODES_PER_EPOCH * cfg.run(run).epochs)) or 1
        proto = cfg.run(run).method != "clip"
        recs = [{"kind": "episode", "episode": e, "time/extract": 20.0 * proto * (1 + 0.1 * rng.random()),
                 "time/kmeans": 0.2 * proto, "time/pbt": 0.01 * proto, "time/train": 70.0 * (1 + 0.1 * rng.random())}
                for e in range(n)]
        lay.train_log(run).parent.mkdir(parents=True, exist_ok=True)
        lay.train_log(run).write_text("".join(json.dumps(r) + "\n" for r in recs))
    return cfg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--resamples", type=int, default=2000)
    args = ap.parse_args()
    os.environ.setdefault("MPLBACKEND", "Agg")
    from protoclip.report.stage import run_report

    root = Path(tempfile.mkdtemp(prefix="bench_claims_"))
    try:
        cfg = build(root, args.resamples)
        bare = load_bare(cfg)
        times: dict[str, list[float]] = {"report": [], "no ledger": []}
        for _ in range(args.repeats):
            for name, c in (("no ledger", bare), ("report", cfg)):
                t0 = time.perf_counter()
                if name == "report":
                    run_report(c)
                else:
                    with no_intervals():
                        run_report(c)
                times[name].append(time.perf_counter() - t0)
        import pandas as pd

        ledger = pd.read_csv(root / "results" / "tables" / "claims.csv")
        computed = ledger[ledger["verdict"] != "not run"]
        load = os.getloadavg()[0]
        print(f"bench_claims: offline default sizes {SIZES}, {args.resamples} resamples, {args.repeats} rounds "
              f"interleaved; load average at the end {load:.1f} on {os.cpu_count()} CPUs")
        for name, ts in times.items():
            print(f"  {name:10s} run_report: median {statistics.median(ts):6.1f} s  ({', '.join(f'{t:.1f}' for t in ts)})")
        print(f"  ledger: {len(ledger)} claims, {len(computed)} with an interval; seconds per claim (last round):")
        for r in ledger.itertuples():
            print(f"    {r.id:24s} {r.seconds:6.2f} s  {r.verdict}")
        print(f"  claims with an interval: total {computed['seconds'].sum():.1f} s, median "
              f"{computed['seconds'].median():.2f} s, max {computed['seconds'].max():.2f} s; "
              f"not run: total {ledger[ledger['verdict'] == 'not run']['seconds'].sum():.2f} s")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def load_bare(cfg):
    """The same project without claims (the tables' intervals are switched off by :func:`no_intervals`)."""
    import copy

    bare = copy.copy(cfg)
    bare.claims = copy.copy(cfg.claims)
    bare.claims.files = []
    bare._claims = []
    return bare


class no_intervals:
    """Within the block, difference rows get no interval (the report before the ledger)."""

    def __enter__(self):
        from protoclip.claims.engine import ClaimEngine
        from protoclip.claims.rows import NotRun

        def refuse(*_a, **_k):
            raise NotRun("switched off")

        self.saved = ClaimEngine.column_interval
        ClaimEngine.column_interval = refuse

    def __exit__(self, *exc):
        from protoclip.claims.engine import ClaimEngine

        ClaimEngine.column_interval = self.saved


if __name__ == "__main__":
    sys.exit(main())
