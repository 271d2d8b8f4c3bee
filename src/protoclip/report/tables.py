"""The report's generic tables: every task's metrics (:attr:`protoclip.tasks.Task.metrics`) per data set and run,
and the training losses, beside the paper tables; written by the report stage (:mod:`protoclip.report.stage`).
"""
from __future__ import annotations

import logging
import re

import pandas as pd

from protoclip.files import records
from protoclip.files.layout import Layout
from protoclip.report.values import Results
from protoclip.tasks import TASKS, task_names

log = logging.getLogger(__name__)

def table_tasks() -> tuple[str, ...]:
    """The tasks with a generic table: every task but those whose output is a figure (t-SNE)."""
    return task_names(lambda t: not t.figure)


def table_metrics(task: str) -> tuple[str, ...]:
    """The metrics ``task``'s generic table shows (first = headline); none for a figure or an unknown task."""
    return TASKS[task].metrics if task in table_tasks() else ()


def collect_metrics(results: Results, runs: list[str]) -> pd.DataFrame:
    """Long table: run, task, dataset, metric, value (float) or note (skipped line), of every evaluated set
    (``results/tables/metrics_long.csv``)."""
    rows = []
    for run in runs:
        found = sorted((task, dataset) for task, per_set in results.summary(run).items() for dataset in per_set)
        for task, dataset in found:
            if (result := results.metrics(run, task, dataset)) is None:  # a set with no evaluation folder
                continue
            if (line := records.skip_line(result)) is not None:
                rows.append({"run": run, "task": task, "dataset": dataset, "metric": "skipped",
                             "value": float("nan"), "note": line})
                continue
            for metric in table_metrics(task):
                value = result.get(metric)
                if isinstance(value, (int, float)):
                    rows.append({"run": run, "task": task, "dataset": dataset, "metric": metric,
                                 "value": float(value), "note": ""})
    return pd.DataFrame(rows, columns=["run", "task", "dataset", "metric", "value", "note"])


def task_table(long: pd.DataFrame, task: str) -> tuple[pd.DataFrame, list[str]]:
    """One task as rows (dataset, metric) x columns (runs), plus the skip lines of its missing sets
    (``results/tables/<task>.{csv,md,tex}``).

    Values are formatted to 4 significant digits; skipped sets have no row (the index lists them once).
    """
    skipped = sorted(set(long.loc[(long.task == task) & (long.metric == "skipped"), "note"]))
    sub = long[(long.task == task) & (long.metric != "skipped")]  # skipped sets: listed once in the index
    if sub.empty:
        return pd.DataFrame(), []
    rank = {m: i for i, m in enumerate(table_metrics(task))}
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
    """run, step, loss (total) of every logged training step, from each run's ``train_log.jsonl``
    (``results/tables/train_loss.csv``, drawn by :mod:`protoclip.report.summary_figures`)."""
    rows = [{"run": run, "step": rec["step"], "loss": rec["loss"]} for run in runs
            for rec in records.read_train_log(layout.train_log(run), kind="step") if "loss" in rec and "step" in rec]
    return pd.DataFrame(rows, columns=["run", "step", "loss"])


def rst_escape(text: str) -> str:
    """Plain text as one reStructuredText paragraph (markup characters escaped)."""
    return re.sub(r"([\\`*|_<>\[\]])", r"\\\1", " ".join(text.split()))
