"""What the fsyncs of an atomic write cost: ``atomic_path`` durable (fsync of the file before the rename, of the
folder after it) vs the same write without them, side by side, interleaved, on the project's own disk.

Sizes stand for what the stages write: 1 KiB (a metrics / JSON file), 8 KiB (a rendered 64 px image of prepare),
1 MiB (a features / eval file), 64 MiB (a tiny-rn checkpoint with its optimizer state). Per size: ``--rounds``
rounds, each writing ``n`` files durable and ``n`` plain in alternating order; the median per-write time of
each is printed with the difference.

    python bench/bench_fsync.py                       # in a temp folder under ./results (the outputs' disk)
    python bench/bench_fsync.py --dir /scratch/x      # another file system
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from protoclip.files.atomic import atomic_path

SIZES = [(1 << 10, 200), (8 << 10, 200), (1 << 20, 40), (64 << 20, 3)]  # (bytes, writes a round)


def write(folder: Path, i: int, data: bytes, durable: bool) -> float:
    t0 = time.perf_counter()
    with atomic_path(folder / f"f{i % 8}.bin", durable=durable) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="results", help="parent of the temp folder written in (default: results)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-fsync-") as tmp:
        folder = Path(tmp)
        print(f"folder {folder} ({os.statvfs(folder).f_bsize} B blocks), {args.rounds} rounds, median per write")
        print(f"{'size':>9} {'writes':>7} {'plain ms':>9} {'durable ms':>11} {'added ms':>9} {'ratio':>6}")
        for size, n in SIZES:
            data = os.urandom(size)
            times: dict[bool, list[float]] = {True: [], False: []}
            for r in range(args.rounds):
                for durable in ((True, False) if r % 2 else (False, True)):  # alternate which goes first
                    times[durable] += [write(folder, i, data, durable) for i in range(n)]
            plain, durable = statistics.median(times[False]) * 1e3, statistics.median(times[True]) * 1e3
            rows.append({"bytes": size, "writes": n * args.rounds, "plain_ms": plain, "durable_ms": durable})
            label = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
            print(f"{label:>9} {n * args.rounds:>7} {plain:>9.3f} {durable:>11.3f} {durable - plain:>9.3f} "
                  f"{durable / plain:>6.2f}")
    return rows


if __name__ == "__main__":
    main()
