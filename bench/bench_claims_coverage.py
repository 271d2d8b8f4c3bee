"""Coverage of the claims ledger's intervals by simulation with a known truth: seed noise, example noise, both, at
1, 2, 3 and 5 seeds a side; beside it the two-level percentile bootstrap the ledger used before (seeds resampled
with replacement, then examples).

The simulation is protoclip.claims.coverage (the model and its true difference are in its docstring); each cell
runs the ledger's own code: protoclip.claims.bootstrap's draws, protoclip.claims.intervals' interval. Target: 93-97 %
for a nominal 95 % at 2, 3 and 5 seeds a side; one seed a side shows what an examples-only interval covers.

    python bench/bench_claims_coverage.py                      # ~10 min on 2 shared cores
    python bench/bench_claims_coverage.py --reps 500 --out -   # a quick look, nothing written
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import subprocess
import time
from pathlib import Path

from protoclip.claims.coverage import NOISES, coverage, truth

ROOT = Path(__file__).resolve().parents[1]
SEEDS = (1, 2, 3, 5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=2000, help="simulated experiments per cell (ledger's interval)")
    ap.add_argument("--reps-before", type=int, default=500, help="per cell for the percentile bootstrap")
    ap.add_argument("--examples", type=int, default=300, help="test examples per simulated set")
    ap.add_argument("--resamples", type=int, default=400, help="bootstrap resamples per interval")
    ap.add_argument("--out", default=None, help="result file stem ('-': print only); default "
                    "bench/results/claims_coverage_cpu<N>_<date>")
    args = ap.parse_args()
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True,
                            text=True, check=False).stdout.strip()
    load0 = os.getloadavg()[0]
    t0 = time.time()
    table = {}
    for noise in NOISES:
        for seeds in SEEDS:
            for method, reps in (("ledger", args.reps), ("percentile", args.reps_before)):
                table[(noise, seeds, method)] = coverage(noise, seeds, reps, method=method,
                                                         n_examples=args.examples, n_resamples=args.resamples)
            print(f"  {noise:9s} {seeds} seeds: ledger {table[(noise, seeds, 'ledger')]:.3f}  "
                  f"percentile {table[(noise, seeds, 'percentile')]:.3f}", flush=True)
    seconds = time.time() - t0
    se = math.sqrt(0.95 * 0.05 / args.reps)
    lines = [f"# bench/bench_claims_coverage.py --reps {args.reps} --reps-before {args.reps_before} --examples "
             f"{args.examples} --resamples {args.resamples}, commit {commit}, "
             f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%dT%H:%MZ}; {os.cpu_count()} CPUs, load average "
             f"{load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end; {seconds:.0f} s",
             ("Coverage of nominal 95 % intervals of a - b (share of simulated experiments whose interval holds the "
              f"true difference; Monte-Carlo sd at {args.reps} draws: {100 * se:.1f} points). True differences: "
              + ", ".join(f"{n} {truth(n):+.3f}" for n in NOISES) + " points."),
             "", "| noise | seeds a side | ledger (t-corrected seeds + examples) | before (two-level percentile) |",
             "|---|---|---|---|"]
    for noise in NOISES:
        for seeds in SEEDS:
            ok = "" if seeds == 1 or 0.93 <= table[(noise, seeds, "ledger")] <= 0.97 else " (outside 93-97)"
            lines.append(f"| {noise} | {seeds} | {100 * table[(noise, seeds, 'ledger')]:.1f} %{ok} | "
                         f"{100 * table[(noise, seeds, 'percentile')]:.1f} % |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out != "-":
        stem = Path(args.out) if args.out else ROOT / "bench" / "results" / (
            f"claims_coverage_cpu{os.cpu_count()}_{dt.date.today():%Y-%m-%d}")
        stem.with_suffix(".txt").write_text(text)
        stem.with_suffix(".json").write_text(json.dumps(
            {"reps": args.reps, "reps_before": args.reps_before, "examples": args.examples,
             "resamples": args.resamples, "commit": commit, "seconds": round(seconds, 1),
             "cells": [{"noise": n, "seeds": s, "method": m, "coverage": c} for (n, s, m), c in table.items()]},
            indent=1) + "\n")


if __name__ == "__main__":
    main()
