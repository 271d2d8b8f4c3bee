"""Two finished (or stopped) `make run` projects side by side, job by job: the wall and CPU seconds of every job
both finished, summed per rule, from Snakemake's own ``benchmarks/*.tsv`` (so two runs that shared a machine
compare on the same jobs even when neither finished). Under ``protoclip forkserver`` a job's work is done by a
fork of the server, which Snakemake's benchmark does not see: its CPU seconds come from the job's log (the line
"ran as a fork of the fork server ... CPU s") and are added to the waiting command's.

    python bench/compare_make_runs.py /path/to/project_A /path/to/project_B
"""
from __future__ import annotations

import argparse
import csv
import re
from collections import defaultdict
from pathlib import Path

import numpy as np


FORK_CPU = re.compile(r"ran as a fork of the fork server \(pid \d+\): ([0-9.]+) CPU s")


def fork_cpu(log: Path) -> float:
    """CPU seconds of the fork that ran the job (its log's last fork line), 0 for a job that ran itself."""
    if not log.exists():
        return 0.0
    found = FORK_CPU.findall(log.read_text(errors="replace"))
    return float(found[-1]) if found else 0.0


def job_seconds(project: Path) -> dict[str, tuple[float, float]]:
    """{job (the benchmark file's stem, e.g. ``train_clip_tiny_s0``): (wall s, cpu_time s)} of every job with a
    benchmark record (its last row: Snakemake writes one per repeat); the CPU seconds include the fork's, from the
    job's log (``logs/<stem>.log``), when a fork server ran it."""
    out = {}
    for f in sorted((project / "benchmarks").glob("*.tsv")):
        rows = list(csv.DictReader(f.open(), delimiter="\t"))
        if rows:
            cpu = float(rows[-1]["cpu_time"]) + fork_cpu(project / "logs" / f"{f.stem}.log")
            out[f.stem] = (float(rows[-1]["s"]), cpu)
    return out


def rule_of(job: str) -> str:
    """The rule a benchmark's job name starts with (``evaluate_<run>_<set>`` -> ``evaluate``)."""
    return job.split("_")[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    args = ap.parse_args()
    a, b = job_seconds(args.a), job_seconds(args.b)
    both = sorted(set(a) & set(b))
    sums: dict[str, np.ndarray] = defaultdict(lambda: np.zeros(5))  # jobs, wall A, wall B, cpu A, cpu B
    for job in both:
        row = np.array([1, a[job][0], b[job][0], a[job][1], b[job][1]])
        sums[rule_of(job)] += row
        sums["all"] += row
    print(f"jobs finished on both sides: {len(both)} (A only {len(set(a) - set(b))}, B only {len(set(b) - set(a))})")
    print(f"{'rule':10s} {'jobs':>4s} {'wall A':>8s} {'wall B':>8s} {'B/A':>5s} {'cpu A':>8s} {'cpu B':>8s} {'B/A':>5s}")
    for key, (n, wa, wb, ca, cb) in sorted(sums.items()):
        print(f"{key:10s} {int(n):4d} {wa:8.0f} {wb:8.0f} {wb / wa:5.2f} {ca:8.0f} {cb:8.0f} {cb / ca:5.2f}")


if __name__ == "__main__":
    main()
