"""`protoclip collect`: a run's results in one file, ``results/runs/<run>/metrics.json`` (also the run's DVC metrics
file): what the report reads.

    protoclip collect --config config/config.yaml --run protoclip_tiny
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from protoclip.files import records
from protoclip.files.atomic import clean_stale_temps_of
from protoclip.evaluate.config import EvalDatasetConfig, EvaluateProject
from protoclip.evaluate.datasets import missing_reason
from protoclip.evaluate.plan import static_tasks
from protoclip.files.layout import Layout
from protoclip.tasks import TASKS, TaskStatus


def summary_table(summary: dict[str, dict[str, Any]]) -> str:
    """Compact text table: one line per (set, task) with the headline number or the skip line."""
    rows = [("dataset", "task", "result")]
    cells = sorted(((ds, task, m) for task, per_set in summary.items() for ds, m in per_set.items()),
                   key=lambda c: (c[0], c[1]))
    for ds, task, m in cells:
        if (line := records.skip_line(m)) is not None:
            cell = line
        else:
            key = TASKS[task].metrics[0] if task in TASKS else ""
            value = m.get(key)
            cell = f"{key} = {value:.4g}" if isinstance(value, (int, float)) else "-"
        rows.append((ds, task, cell))
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    return "\n".join(f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]}" for r in rows)


def run_collect(cfg: EvaluateProject, run: str) -> Path:
    """The stage's entry: ``run``'s ``metrics.json`` from the run's evaluation folders and the configured sets
    (the layout and ``evaluate.datasets``, all that :func:`collect` reads of the config)."""
    return collect(Layout.from_config(cfg), run, cfg.evaluate.datasets)


def collect(layout: Layout, run: str, datasets: dict[str, EvalDatasetConfig]) -> Path:
    """Write ``run``'s ``metrics.json`` and print the summary. It holds ``{task: {set: metrics or {"skipped": line,
    "status": ...}}}`` from every evaluation folder of the run that its completion marker vouches for
    (:func:`protoclip.files.records.run_results`; a folder killed half-way stops collect with one line naming it),
    plus the skip status of each configured set whose data is missing (the workflow gives such a set no evaluation
    job). A set of ``datasets`` whose data exists but that no paper target of this run shows (so no job evaluated
    it) is simply absent."""
    clean_stale_temps_of([layout.metrics_summary(run)])  # a killed collect's half-written metrics.json
    summary = records.run_results(layout, run)
    for name, ds_cfg in datasets.items():
        reason = missing_reason(name, ds_cfg, layout)
        if not layout.eval_dir(run, name).is_dir() and reason is not None:
            for task in static_tasks(name, ds_cfg):
                summary.setdefault(task, {})[name] = records.skip_result(TaskStatus(TaskStatus.MISSING, reason))
    out = records.write_summary(layout.metrics_summary(run), summary)
    print(f"evaluate {run}:\n{summary_table(summary)}")
    return out


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.add_argument("--run", required=True)


def main(args: argparse.Namespace) -> int:
    run_collect(args.cfg, args.run)
    return 0
