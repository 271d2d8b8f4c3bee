"""File times in DAG order: after ``dvc commit`` rewrote outputs, each stage's newer than its inputs'.

``dvc commit`` moves each changed output into its cache and copies it back with a new file time, in its own
order. Snakemake always reruns a job whose input is newer than its output (whatever ``--rerun-triggers``
says), so without this the next ``snakemake`` would rerun the stages downstream of a recommitted one.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from protoclip.dag.stages import Stage


def restamp(stage_list: list[Stage]) -> None:
    """Set the file times of the stages' Snakemake targets in DAG order (each stage's newer than the last's)."""
    now = time.time()
    for i, st in enumerate(stage_list):
        t = now - (len(stage_list) - i) * 0.01
        # Snakemake counts a job's benchmark file among its outputs' times (workflow/rules: benchmarks/<stage>.tsv)
        for p in [Path(o.path) for o in st.targets.values()] + [Path(st.benchmark)]:
            files = [p] + (sorted(p.rglob("*")) if p.is_dir() else [])
            for f in files:
                if f.exists():
                    os.utime(f, (t, t))
