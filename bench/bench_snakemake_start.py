"""What a Snakemake start pays for the code fingerprints: a dry run of the paper DAG (``snakemake --configfile
config/paper.yaml -n --forceall``) with the per-file cache of protoclip.dag.code_version (``CACHE``, under
.snakemake/) warm vs removed before the call (every package file parsed: each start before the cache).

The workflow and configs are copied to a temp folder; rounds alternate the two sides; each call's wall and CPU
seconds (the child's) are kept, and both sides' code-fingerprints.yaml are compared.

    python bench/bench_snakemake_start.py --rounds 5 --out bench/results/snakemake_start_cpu2_<date>.txt
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CALL = [sys.executable, "-m", "snakemake", "--configfile", "config/paper.yaml", "-n", "--forceall", "--cores", "4",
        "--resources", "gpu=1", "--quiet", "rules"]


def timed(cwd: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of one dry run in ``cwd``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run(CALL, cwd=cwd, check=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp) / "project"
        project.mkdir()
        for name in ("Snakefile", "workflow", "config"):
            (shutil.copytree if (REPO / name).is_dir() else shutil.copy)(REPO / name, project / name)
        cache = project / ".snakemake" / "protoclip" / "code-digests.json"
        timed(project)  # Snakemake's own first start (its metadata folder), and the cache filled
        sides: dict[str, list[tuple[float, float]]] = {"cache warm": [], "cache removed": []}
        texts = {}
        for _ in range(args.rounds):
            for side, runs in sides.items():
                if side == "cache removed":
                    cache.unlink()
                runs.append(timed(project))
                texts[side] = (project / "code-fingerprints.yaml").read_text()
    lines = [f"$ {' '.join(CALL[1:])}  (in a copy of the workflow; {args.rounds} alternating rounds; "
             f"load average {os.getloadavg()[0]:.1f} at the end)"]
    for side, runs in sides.items():
        walls, cpus = [w for w, _ in runs], [c for _, c in runs]
        lines.append(f"  {side:14s} wall median {statistics.median(walls):.2f} s (min {min(walls):.2f}), "
                     f"CPU median {statistics.median(cpus):.2f} s")
    med = {side: statistics.median(w for w, _ in runs) for side, runs in sides.items()}
    lines.append(f"  ratio warm / removed (wall, median): {med['cache warm'] / med['cache removed']:.2f}x; "
                 f"code-fingerprints.yaml equal: {texts['cache warm'] == texts['cache removed']}")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
