"""`protoclip report`: tables and figures regenerated from the runs' results, never edited by hand.

    protoclip report --config config/config.yaml

Our numbers come from each run's ``metrics.json`` (`collect`; :class:`protoclip.report.values.Results`). Then the
tables and figures go to a ``report`` MLflow run and each claim to a ``claims`` run (protoclip.tracking).
"""
from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

import pandas as pd

from protoclip.claims.engine import ClaimEngine
from protoclip.files.atomic import atomic_path, clean_stale_temps, write_text
from protoclip.files.layout import Layout
from protoclip.jobs.launch import rank_threads
from protoclip.report.dvc_plots import write_plot_data
from protoclip.report.figures import write_figure
from protoclip.report.ledger_table import log_ledger, run_ledger
from protoclip.report.paper_tables import write_table
from protoclip.report.paper_targets import ReportProject
from protoclip.report.summary_figures import write_summary_figures
from protoclip.report.tables import collect_metrics, rst_escape, table_tasks, task_table, train_losses
from protoclip.report.values import Results
from protoclip.tracking import claims_run, log_report

log = logging.getLogger(__name__)


def job_cpus(env: dict | None = None) -> int:
    """The CPUs this report may use: the job's threads (Snakemake exports ``OMP_NUM_THREADS`` = the rule's
    threads), else every CPU this process may run on; read as a one-rank job's threads are."""
    threads = rank_threads(os.environ if env is None else env, 1).get("OMP_NUM_THREADS")
    return int(threads) if threads else len(os.sched_getaffinity(0))


def run_report(cfg: ReportProject) -> Path:
    """Every declared paper target (tables: :mod:`~protoclip.report.paper_tables`, figures:
    :mod:`~protoclip.report.figures`) with its caption ``results/report/<id>.rst``, the claims ledger, the generic
    tables, the data of dvc.yaml's ``plots:``, the summary figures, and ``results/tables/index.md`` (returned):
    the skipped data sets and runs once at the top, then every target and the ledger."""
    layout = Layout.from_config(cfg)
    for folder in (layout.tables, layout.figures, layout.report_dir):
        clean_stale_temps(folder)  # the report job is these folders' only writer: a killed run's temp files
    runs = cfg.run_names()
    results = Results(cfg)
    long = collect_metrics(results, runs)
    # the stage's DVC outputs exist even when a config declares no target (dvc commit needs every out)
    for folder in (layout.tables, layout.figures, layout.report_dir):
        folder.mkdir(parents=True, exist_ok=True)
    lines = ["# Results", "", f"Config: `{cfg.source}`. Runs: {', '.join(runs)}. Regenerate with "
             "`protoclip report`. Paper numbers: transcribed in `protoclip/report/paper_numbers.yaml` (table, "
             "section and line of the paper text cited there); ours: from the result files of the runs named in "
             "each table.", ""]
    skipped = results.skipped()
    if skipped:
        lines += ["## Skipped data sets (listed once; their cells read '-' or use the stand-in named in each "
                  "caption)", ""] + [f"- {line}" for line in skipped.values()] + [""]
    absent = results.skipped_runs()
    if absent:
        lines += ["## Skipped runs (their training data is absent: no job ran; their cells read 'skipped')", ""]
        lines += [f"- {run}: {why}" for run, why in absent.items()] + [""]
    engine = ClaimEngine(cfg, results, job_cpus())  # intervals of the difference rows and the claims ledger
    cells = []  # every target cell, ours and the paper's (targets_long.csv)
    for target in cfg.paper_targets():
        if target.kind == "table":
            md, caption, recs = write_table(cfg, results, target, engine)
            cells += recs
            lines += [f"## {target.id}", "", caption, "", md, ""]
        else:
            png, caption = write_figure(cfg, results, target)
            lines += [f"## {target.id}", "", caption, "", f"![{target.id}](../figures/{png.name})", ""]
        write_text(layout.caption(target.id), rst_escape(caption) + "\n")
    rows, files = run_ledger(cfg, results, engine)  # the claims ledger (protoclip.report.ledger_table)
    lines += ["## Claims ledger", "", files.md.read_text().strip(), "",
              f"![claims](../figures/{files.png.name})", ""]
    with atomic_path(layout.targets_long) as tmp:  # every target cell, ours and the paper's
        pd.DataFrame(cells).to_csv(tmp, index=False)
    with atomic_path(layout.metrics_long) as tmp:
        long.to_csv(tmp, index=False)  # every headline value and skip line, machine-readable
    lines += ["## Every task and run (generic tables)", ""]
    for task in table_tasks():
        table, _ = task_table(long, task)
        if table.empty:
            continue
        with atomic_path(layout.task_table(task, ".csv")) as tmp:
            table.to_csv(tmp)
        md = table.reset_index().to_markdown(index=False)
        write_text(layout.task_table(task, ".md"), md + "\n")
        with atomic_path(layout.task_table(task, ".tex")) as tmp:
            table.to_latex(tmp)
        lines += [f"### {task}", "", md, ""]
    losses = train_losses(layout, runs)
    with atomic_path(layout.train_losses) as tmp:
        losses.to_csv(tmp, index=False)
    write_plot_data(layout, runs, losses, cells)  # dvc.yaml `plots:` (protoclip.report.dvc_plots)
    # ours against the paper, Table VI's differences, the training curves (protoclip.report.summary_figures)
    summary = write_summary_figures(cfg, results, cells, losses)
    lines += ["## Summary figures", ""]
    for name, (png, caption) in summary.items():
        write_text(layout.caption(name), rst_escape(caption) + "\n")
        lines += [f"### {name}", "", caption, "", f"![{name}](../figures/{png.name})", ""]
    index = write_text(layout.report_index, "\n".join(lines) + "\n")
    log.info("report: %d targets, index %s", len(cfg.paper_targets()), index)
    return index


def log_to_mlflow(cfg: ReportProject) -> None:
    """The report's tables and figures as artifacts of a ``report`` MLflow run; each claim into a ``claims`` run."""
    log_report(cfg.paths)
    with claims_run(cfg.paths) as tracker:
        log_ledger(cfg, tracker)


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    """The stage reads only ``--config``."""


def main(args: argparse.Namespace) -> int:
    run_report(args.cfg)
    Layout.from_config(args.cfg).figures.mkdir(parents=True, exist_ok=True)  # an output even with no figure
    log_to_mlflow(args.cfg)
    return 0
