"""Snakemake's own CPU while jobs wait for cores, under two `--max-jobs-per-timespan` settings.

Snakemake 9's scheduler, whenever the job rate limiter is on (its default `100/1s`), ends each pass of its loop by
starting a `threading.Timer(timespan)` that wakes the loop again. A pass woken by a finished job starts one more such
timer, so while jobs wait for cores the wake-ups add up: one more per second for every finished job, each pass
resetting and re-reading the inputs of every ready job. In `make run` (198 jobs on 2 cores, evaluations queued behind
training) the Snakemake process held 70-80 threads and used 13-20 % of a core late in the run. The longer timespan
`make run` and the gpu profile pass keeps the rate limit's average and wakes the loop ten times less often; Snakemake
waits for the last timer before it exits (at most the timespan).

    python bench/bench_snakemake_reevaluation.py [--jobs 120] [--seconds 1] [--inputs 20]

Prints, per setting: wall, user+sys CPU seconds of Snakemake and its jobs, and the most threads Snakemake held.
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SNAKEFILE = """
N, S, M = {jobs}, {seconds}, {inputs}
rule all:
    input: expand("out/{{i}}.txt", i=range(N))
rule one:
    input: expand("in/{{k}}.txt", k=range(M))
    output: "out/{{i}}.txt"
    shell: "sleep {{S}}; touch {{output}}"
"""


def run(workdir: Path, timespan: str) -> dict:
    """One Snakemake run of the generated workflow on 2 cores; CPU from the children's rusage."""
    for f in (workdir / "out").glob("*"):
        f.unlink()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    cmd = [sys.executable, "-m", "snakemake", "-q", "--cores", "2", "--max-jobs-per-timespan", timespan]
    proc = subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    threads = 0
    while proc.poll() is None:
        try:
            threads = max(threads, len(os.listdir(f"/proc/{proc.pid}/task")))
        except FileNotFoundError:
            pass
        time.sleep(0.5)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise SystemExit(f"snakemake failed with {timespan} (exit {proc.returncode}) in {workdir}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"timespan": timespan, "wall_s": wall, "cpu_s": cpu, "max_threads": threads}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=120, help="jobs, all ready at the start")
    parser.add_argument("--seconds", type=float, default=1.0, help="each job's sleep")
    parser.add_argument("--inputs", type=int, default=20, help="input files per job (re-read by each pass)")
    parser.add_argument("--timespans", nargs="+", default=["100/1s", "1000/10s"],
                        help="Snakemake's default, then make run's setting")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        (workdir / "in").mkdir()
        for k in range(args.inputs):
            (workdir / "in" / f"{k}.txt").write_text(str(k))
        (workdir / "Snakefile").write_text(SNAKEFILE.format(jobs=args.jobs, seconds=args.seconds,
                                                            inputs=args.inputs))
        print(f"{args.jobs} jobs of sleep {args.seconds} s, {args.inputs} inputs each, 2 cores")
        rows = [run(workdir, t) for t in args.timespans]
    for r in rows:
        print(f"  --max-jobs-per-timespan {r['timespan']:>9}: wall {r['wall_s']:6.1f} s  "
              f"CPU {r['cpu_s']:6.1f} s  threads <= {r['max_threads']}")
    print(f"  CPU ratio (last / first): {rows[-1]['cpu_s'] / rows[0]['cpu_s']:.2f}x")


if __name__ == "__main__":
    main()
