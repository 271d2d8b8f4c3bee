"""The claims ledger's AMI resamples on one process vs split over forked workers (``MutualInfo(workers=...)``).

One synthetic clustering at the offline default's size (Fashion-MNIST's 5,000 test images, 10 classes, 10
k-means clusters that agree with the labels on about half the images), resampled as the ledger resamples it
(2,000 draws from a named stream, in :func:`protoclip.claims.bootstrap._counts`' chunks): the wall seconds of
every chunk's values with ``workers=1`` and with ``--workers``, alternating over rounds, and whether the values
are equal to the bit. On a machine where other jobs hold the cores the split gains nothing: it is for the
report, the DAG's last job, which declares every core of the call.

    python bench/bench_ami_workers.py --workers 2 --rounds 3
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from protoclip.claims.bootstrap import MutualInfo, _counts, _draw, stream


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=5000, help="test images")
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--resamples", type=int, default=2000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    labels = rng.integers(0, args.classes, args.n)
    cluster = np.where(rng.random(args.n) < 0.5, labels, rng.integers(0, args.classes, args.n))
    counts = _counts(_draw(stream(0, "examples/bench"), args.resamples, args.n))
    times: dict[int, list[float]] = {1: [], args.workers: []}
    values = {}
    for _ in range(args.rounds):
        for w in times:
            unit = MutualInfo(cluster, labels, workers=w)
            t0 = time.perf_counter()
            values[w] = np.concatenate([unit.value(c) for c in counts])
            times[w].append(time.perf_counter() - t0)
    print(f"AMI of {args.n} images, {args.classes} classes, {args.resamples} resamples in {len(counts)} chunks; "
          f"{MutualInfo(cluster, labels).emi_terms} EMI terms per resample; {args.rounds} alternating rounds")
    for w, ts in times.items():
        each = ", ".join(f"{t:.2f}" for t in ts)
        print(f"  workers={w}: wall s min {min(ts):.2f} median {statistics.median(ts):.2f}  ({each})")
    ratio = statistics.median(times[args.workers]) / statistics.median(times[1])
    print(f"  ratio (median): {ratio:.2f}x; values equal to the bit: {np.array_equal(values[1], values[args.workers])}")


if __name__ == "__main__":
    main()
