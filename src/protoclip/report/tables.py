"""`protoclip report`: tables and figures regenerated from metrics files, never edited by hand.

    protoclip report --config config/config.yaml

Writes every declared paper target (``target:`` blocks of the experiment files, see
:mod:`protoclip.report.config`): ``results/tables/<id>.{csv,md,tex,html}`` with our numbers and the paper's
side by side (:mod:`protoclip.report.paper_tables`), ``results/figures/<id>.png``
(:mod:`protoclip.report.figures`), each with its caption ``results/report/<id>.rst`` (the Snakemake report's
caption), the claims ledger ``results/tables/claims.{md,csv,tex,html,json}`` with its forest plot
``results/figures/claims.png`` (:mod:`protoclip.report.claims`), and ``results/tables/index.md`` listing the
skipped data sets once at the top, then every target and the ledger.

Also, per task, the generic ``results/tables/<task>.{csv,md,tex}`` (rows: data set x headline metric;
columns: runs; skipped sets left out, they are listed in the index), all values with their skip lines in
``results/tables/metrics_long.csv``, ``results/tables/train_loss.csv`` from each run's ``train_log.jsonl``, the
data of dvc.yaml's ``plots:`` (:mod:`protoclip.report.dvc_plots`), and the summary figures with their captions
(:mod:`protoclip.report.summary_figures`: ours against the paper, Table VI's per-set differences, the training
curves per target).
"""
from __future__ import annotations

import logging
import re
from pathlib import Path

import pandas as pd

from protoclip import records
from protoclip.atomic import atomic_path, clean_stale_temps, write_text
from protoclip.layout import Layout
from protoclip.tasks import HEADLINE

log = logging.getLogger(__name__)

# task -> metrics shown in its generic table (first = headline): every task but t-SNE, whose output is a figure
TABLE_METRICS = {task: metrics for task, metrics in HEADLINE.items() if task != "tsne"}


def collect_metrics(layout: Layout, runs: list[str]) -> pd.DataFrame:
    """Long table: run, task, dataset, metric, value (float) or note (skipped line)."""
    rows = []
    for run in runs:
        for task, dataset, path in records.metrics_files(layout, run):
            result = records.read_metrics(path)
            if (line := records.skip_line(result)) is not None:
                rows.append({"run": run, "task": task, "dataset": dataset, "metric": "skipped",
                             "value": float("nan"), "note": line})
                continue
            for metric in TABLE_METRICS.get(task, []):
                value = result.get(metric)
                if isinstance(value, (int, float)):
                    rows.append({"run": run, "task": task, "dataset": dataset, "metric": metric,
                                 "value": float(value), "note": ""})
    return pd.DataFrame(rows, columns=["run", "task", "dataset", "metric", "value", "note"])


def task_table(long: pd.DataFrame, task: str) -> tuple[pd.DataFrame, list[str]]:
    """One task as rows (dataset, metric) x columns (runs), plus the skip lines of its missing sets.

    Values are formatted to 4 significant digits; skipped sets have no row (the index lists them once).
    """
    skipped = sorted(set(long.loc[(long.task == task) & (long.metric == "skipped"), "note"]))
    sub = long[(long.task == task) & (long.metric != "skipped")]  # skipped sets: listed once in the index
    if sub.empty:
        return pd.DataFrame(), []
    rank = {m: i for i, m in enumerate(TABLE_METRICS[task])}
    cells: dict[tuple[str, str], dict[str, str]] = {}
    for r in sub.itertuples():
        metric = r.metric
        cells.setdefault((r.dataset, metric), {})[r.run] = f"{r.value:.4g}"
    index = sorted(cells, key=lambda dm: (dm[0], rank.get(dm[1], 99)))
    runs = list(dict.fromkeys(sub.run))
    table = pd.DataFrame([[cells[i].get(run, "") for run in runs] for i in index], columns=runs,
                         index=pd.MultiIndex.from_tuples(index, names=["dataset", "metric"]))
    return table, skipped


def train_losses(layout: Layout, runs: list[str]) -> pd.DataFrame:
    """run, step, loss (total) of every logged training step."""
    rows = [{"run": run, "step": rec["step"], "loss": rec["loss"]} for run in runs
            for rec in records.read_train_log(layout.train_log(run), kind="step") if "loss" in rec and "step" in rec]
    return pd.DataFrame(rows, columns=["run", "step", "loss"])


def rst_escape(text: str) -> str:
    """Plain text as one reStructuredText paragraph (markup characters escaped)."""
    return re.sub(r"([\\`*|_<>\[\]])", r"\\\1", " ".join(text.split()))


def run_report(cfg) -> Path:
    from protoclip.report.claims import ClaimEngine, run_ledger
    from protoclip.report.dvc_plots import write_plot_data
    from protoclip.report.figures import write_figure
    from protoclip.report.paper_tables import write_table
    from protoclip.report.summary_figures import write_summary_figures
    from protoclip.report.values import Results

    layout = Layout.from_config(cfg)
    for folder in (layout.tables, layout.figures, layout.report_dir):
        clean_stale_temps(folder)  # the report job is these folders' only writer: a killed run's temp files
    runs = cfg.run_names()
    long = collect_metrics(layout, runs)  # a skipped run has no files: nothing to collect
    # the stage's DVC outputs exist even when a config declares no target (dvc commit needs every out)
    for folder in (layout.tables, layout.figures, layout.report_dir):
        folder.mkdir(parents=True, exist_ok=True)
    results = Results(cfg)
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
    engine = ClaimEngine(cfg, results)  # intervals of the difference rows and the claims ledger
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
    rows, files = run_ledger(cfg, results, engine)  # the claims ledger (protoclip.report.claims)
    lines += ["## Claims ledger", "", files["md"].read_text().strip(), "",
              f"![claims](../figures/{files['png'].name})", ""]
    with atomic_path(layout.targets_long) as tmp:  # every target cell, ours and the paper's
        pd.DataFrame(cells).to_csv(tmp, index=False)
    with atomic_path(layout.metrics_long) as tmp:
        long.to_csv(tmp, index=False)  # every headline value and skip line, machine-readable
    lines += ["## Every task and run (generic tables)", ""]
    for task in TABLE_METRICS:
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
