"""Two finished (or stopped) `make run` projects side by side, job by job: the wall and CPU seconds of every job
both finished, summed per rule, from Snakemake's own ``benchmarks/*.tsv`` (so two runs that shared a machine
compare on the same jobs even when neither finished).

    python bench/compare_make_runs.py /path/to/project_A /path/to/project_B
"""
from __future__ import annotations

import argparse
import csv
from collections import defaultdict
from pathlib import Path


def job_seconds(project: Path) -> dict[str, tuple[float, float]]:
    """{job (the benchmark file's stem): (wall s, cpu_time s)}."""
    out = {}
    for f in sorted((project / "benchmarks").glob("*.tsv")):
        rows = list(csv.DictReader(f.open(), delimiter="\t"))
        if rows:
            out[f.stem] = (float(rows[0]["s"]), float(rows[0]["cpu_time"]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    args = ap.parse_args()
    a, b = job_seconds(args.a), job_seconds(args.b)
    both = sorted(set(a) & set(b))
    sums: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0.0])
    for job in both:
        for key in (job.split("_")[0], "all"):
            s = sums[key]
            s[0] += 1
            s[1], s[2], s[3], s[4] = s[1] + a[job][0], s[2] + b[job][0], s[3] + a[job][1], s[4] + b[job][1]
    print(f"jobs finished on both sides: {len(both)} (A only {len(set(a) - set(b))}, B only {len(set(b) - set(a))})")
    print(f"{'rule':10s} {'jobs':>4s} {'wall A':>8s} {'wall B':>8s} {'B/A':>5s} {'cpu A':>8s} {'cpu B':>8s} {'B/A':>5s}")
    for key, (n, wa, wb, ca, cb) in sorted(sums.items()):
        print(f"{key:10s} {int(n):4d} {wa:8.0f} {wb:8.0f} {wb / wa:5.2f} {ca:8.0f} {cb:8.0f} {cb / ca:5.2f}")


if __name__ == "__main__":
    main()
