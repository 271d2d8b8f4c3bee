"""One trained run's full evaluation on the offline default, before and after centring the linear probe's features.

"Full" = every task the run's paper targets show, on the three offline sets: exactly the evaluation jobs the
DAG gives the run (``protoclip.dag.stages.evaluations``; for a main run such as ``clip_tiny_s0``: zero-shot,
linear, kNN, clustering on Fashion-MNIST and digits, plus retrieval on the held-out pairs). Each variant
evaluates a copy of the run's ``model.pt`` (trained by ``make run``) in a temporary results folder, from scratch
(no cached features), in two forms:

* ``jobs``: the DAG's form, one ``protoclip evaluate --dataset <set>`` process per set, one after the other,
  each with one thread (as Snakemake runs them): the sum of their wall times, process start-up and imports
  (~8-10 s each: torch, open_clip, MLflow, scikit-learn) included;
* ``one process``: ``protoclip evaluate`` on the three sets in one process (the same tasks): start-up once.

Variants (``--repeats`` rounds, interleaved):

* ``before``: the L-BFGS linear probe on the raw features (``evaluate.linear.center: false``, the offline
  default until this change; an earlier result of this script, 10k/5k -> 5k/5k Fashion-MNIST, is in
  ``bench/results/evaluate_cpu2_2026-11-25.txt``);
* ``now``: the config as it is (``config/config.yaml``: features centred, an exact reparametrisation).

    python bench/bench_evaluate.py                        # after `make run`; ~8 min on 2 idle cores
    python bench/bench_evaluate.py --run protoclip_tiny_s0 --repeats 2
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
OFFLINE = ("fashion_mnist", "digits", "heldout_pairs")
BEFORE = {"linear": {"center": False}}  # the L-BFGS probe on raw features, as before (metrics.linear)


def variant_config(tmp: Path, name: str) -> Path:
    """config/config.yaml with absolute paths, results in ``tmp``, and the variant's Fashion-MNIST subsample."""
    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    cfg["paths"]["data_dir"] = str(ROOT / cfg["paths"]["data_dir"])
    cfg["paths"]["results_dir"] = str(tmp / name)
    cfg["paths"]["mlflow_uri"] = f"sqlite:///{tmp / name / 'mlflow.db'}"
    cfg["experiments"] = [str(ROOT / "config" / e) for e in cfg["experiments"]]
    if name == "before":
        cfg["evaluate"].update(BEFORE)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def fresh_run(tmp: Path, name: str, run: str) -> None:
    """The trained model alone in the variant's results folder (no features, no metrics)."""
    src = ROOT / "results" / "runs" / run
    dst = tmp / name / "runs" / run
    shutil.rmtree(dst / "eval", ignore_errors=True)
    dst.mkdir(parents=True, exist_ok=True)
    for f in ("model.pt", "config.yaml"):
        shutil.copy2(src / f, dst / f)


def timed(cmd: list[str]) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", default="clip_tiny_s0", help="a run trained by `make run`")
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    if not (ROOT / "results" / "runs" / args.run / "model.pt").is_file():
        raise SystemExit(f"results/runs/{args.run}/model.pt not found: run `make run` first")
    from protoclip.dag import stages as dag_stages
    from protoclip.project import load_config

    jobs = dag_stages.evaluations(load_config(ROOT / "config" / "config.yaml"))[args.run]
    jobs = {d: t for d, t in jobs.items() if d in OFFLINE}
    exe = [sys.executable, "-m", "protoclip.cli", "evaluate"]
    per_job: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        configs = {name: variant_config(tmp, name) for name in ("before", "now")}
        for _ in range(args.repeats):
            for name, cfg in configs.items():
                fresh_run(tmp, name, args.run)
                for ds, tasks in jobs.items():
                    cmd = exe + ["--config", str(cfg), "--run", args.run, "--dataset", ds]
                    cmd += [a for t in (tasks or []) for a in ("--task", t)]
                    per_job.setdefault((name, ds), []).append(timed(cmd))
                fresh_run(tmp, name, args.run)
                tasks = sorted({t for ts in jobs.values() for t in (ts or [])})
                cmd = exe + ["--config", str(cfg), "--run", args.run] + [a for d in jobs for a in ("--dataset", d)]
                cmd += [a for t in tasks for a in ("--task", t)]
                per_job.setdefault((name, "one process"), []).append(timed(cmd))

    med = {k: statistics.median(v) for k, v in per_job.items()}
    print(f"# python bench/bench_evaluate.py --run {args.run} --repeats {args.repeats}")
    print(f"# {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores, load average at the end "
          f"{os.getloadavg()[0]:.1f}; one process at a time, 1 thread each; median of {args.repeats} round(s)")
    print(f"evaluation of {args.run}: " + "; ".join(f"{d}: {', '.join(t or ['all'])}" for d, t in jobs.items()))
    print(f"{'':28s}{'before (raw probe)':>24s}{'now (centred)':>14s}{'now/before':>12s}")
    for ds in jobs:
        b, n = med[("before", ds)], med[("now", ds)]
        print(f"{'job ' + ds:28s}{b:23.1f}s{n:13.1f}s{n / b:11.2f}x")
    b, n = (sum(med[(v, d)] for d in jobs) for v in ("before", "now"))
    print(f"{'jobs, summed (the DAG)':28s}{b:23.1f}s{n:13.1f}s{n / b:11.2f}x")
    b, n = med[("before", "one process")], med[("now", "one process")]
    print(f"{'one process, 3 sets':28s}{b:23.1f}s{n:13.1f}s{n / b:11.2f}x")
    print(f"aim (issue 12): one run's full evaluation under 60 s; now: {n:.1f} s in one process, "
          f"{sum(med[('now', d)] for d in jobs):.1f} s as the DAG's {len(jobs)} jobs")


if __name__ == "__main__":
    main()
