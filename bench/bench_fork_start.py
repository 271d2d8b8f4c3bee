"""What a job forked from `protoclip forkserver` still pays at its start: the imports its first MLflow client needs.

Each round starts two fresh interpreters, each importing one preload list as the server does: the server's
(``protoclip.jobs.forkserver.PRELOAD``) and that list without MLflow's SQLite store modules and the others added
with them (``WITHOUT``: the server's list before 1943e55, but for the collect stage added later). Each then opens an
MLflow client on one SQLite store, as every train and evaluate job does, and prints the CPU and wall seconds of
that step alone (the preload is the server's, paid once per workflow). Rounds alternate the two lists. Also timed:
importing ``protoclip.cli``, the command that hands a job to the server (it runs once per job before the fork).

    python bench/bench_fork_start.py            # 3 rounds
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from protoclip.jobs.forkserver import PRELOAD

STORE = ("mlflow.store.", "sqlalchemy", "mlflow.tracing.processor", "sklearn.cluster", "protoclip.evaluate.metrics")
WITHOUT = tuple(m for m in PRELOAD if not m.startswith(STORE))

JOB = """
import importlib, sys, time
for m in sys.argv[2].split(","):
    importlib.import_module(m)
import mlflow
mlflow.set_tracking_uri("sqlite:///" + sys.argv[1])
c, w = time.process_time(), time.perf_counter()
mlflow.tracking.MlflowClient().get_experiment_by_name("bench")
print(time.process_time() - c, time.perf_counter() - w)
"""

CLIENT = """
import time; c, w = time.process_time(), time.perf_counter()
import protoclip.cli
print(time.process_time() - c, time.perf_counter() - w)
"""


def once(code: str, *args: str) -> tuple[float, float]:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True)
    cpu, wall = map(float, out.stdout.split()[-2:])
    return cpu, wall


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "mlflow.db")
        once(JOB, db, ",".join(PRELOAD))  # the store's tables created once, as the workflow's first job does
        times: dict[str, list[tuple[float, float]]] = {"server's PRELOAD": [], "WITHOUT the store": []}
        for r in range(args.rounds):
            for name, mods in (("server's PRELOAD", PRELOAD), ("WITHOUT the store", WITHOUT))[::1 - 2 * (r % 2)]:
                times[name].append(once(JOB, db, ",".join(mods)))
        client = [once(CLIENT) for _ in range(args.rounds)]
    print(f"opening the MLflow client in a forked job, {args.rounds} rounds (CPU s / wall s, median):")
    for name, t in times.items():
        print(f"  {name:22s} {statistics.median(c for c, _ in t):6.3f} / {statistics.median(w for _, w in t):6.3f}"
              f"   rounds: {', '.join(f'{w:.3f}' for _, w in t)}")
    print(f"importing protoclip.cli (the command before each fork): "
          f"{statistics.median(c for c, _ in client):.3f} / {statistics.median(w for _, w in client):.3f}")


if __name__ == "__main__":
    main()
