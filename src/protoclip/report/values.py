"""Numbers behind the paper targets: the paper's (transcribed, package data) and ours (metrics files, logs).

Never mixes the two: paper values come only from :func:`paper_numbers`, ours only from result files, read through
:mod:`protoclip.files.records` (their formats live there).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path

import numpy as np
import yaml

from protoclip.files import records
from protoclip.files.records import PHASES
from protoclip.files.layout import Layout
from protoclip.report.paper_targets import ColumnConfig, ReportProject, TargetConfig
from protoclip.tasks import TASKS, TaskStatus



class PaperNumber(float):
    """A transcribed paper number that keeps its printed text (``41.30``, ``27.2``, ``+0.8``) for the tables."""
    text: str

    def __new__(cls, value: float, text: str) -> "PaperNumber":
        obj = super().__new__(cls, value)
        obj.text = text
        return obj


class _PaperLoader(yaml.SafeLoader):
    """YAML floats as :class:`PaperNumber` (value and literal): a float loses "41.30" -> 41.3."""


_PaperLoader.add_constructor("tag:yaml.org,2002:float", lambda loader, node: PaperNumber(
    loader.construct_yaml_float(node), loader.construct_scalar(node)))


@lru_cache(maxsize=1)
def _paper_file() -> dict:
    text = resources.files("protoclip.report").joinpath("paper_numbers.yaml").read_text("utf-8")
    return yaml.load(text, Loader=_PaperLoader)  # noqa: S506 - a SafeLoader subclass


def paper_numbers(key: str | None) -> dict:
    """The transcribed entry ``key`` of ``paper_numbers.yaml`` (table / figure; ``{}`` when None or absent): cite,
    where, rows / values, text."""
    if key is None:
        return {}
    return dict(_paper_file().get(key) or {})


def paper_value(entry: dict, row: str | None, column: str):
    """The paper's number (or string such as ``"16 (21.5)"``) of (row, column), or None."""
    if row is None:
        return None
    rows = entry.get("rows") or entry.get("values") or {}
    return (rows.get(row) or {}).get(column)


@dataclass
class Cell:
    """Our value of one (row, column): mean and std over the row's seeds."""
    mean: float | None = None
    std: float | None = None
    n: int = 0  # seeds (runs) with a value
    text: str | None = None  # non-numeric cells (epochs column)
    note: str = ""  # why empty

    def fmt(self, digits: int = 2) -> str:
        if self.text is not None:
            return self.text
        if self.mean is None:
            return self.note or "-"
        if self.n > 1:
            return f"{self.mean:.{digits}f} ± {self.std:.{digits}f} ({self.n} seeds)"
        return f"{self.mean:.{digits}f} (1 seed)"


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof=1; 0 for one value)."""
    arr = np.asarray(values, dtype=np.float64)
    return float(arr.mean()), float(arr.std(ddof=1)) if len(arr) > 1 else 0.0


@dataclass
class Results:
    """Our result files of a configured project, read lazily: each run's ``metrics.json`` (what `collect` wrote,
    checked against the evaluation folders' completion markers: :func:`protoclip.files.records.collected_results`)
    and ``train_log.jsonl``; gives a target cell as mean, std and number of seeds over a run group (``seeds:``
    runs), plus the data sets used."""
    cfg: ReportProject
    layout: Layout = field(init=False)
    _cache: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self.layout = Layout.from_config(self.cfg)

    # ---- results (what `collect` wrote: protoclip.files.records.collected_results)
    def summary(self, run: str) -> dict[str, dict[str, dict]]:
        """``{task: {set: result}}`` of ``run``, the skip status of its sets whose data is missing included."""
        if ("run", run) not in self._cache:
            self._cache[("run", run)] = records.collected_results(self.layout, run)
        return self._cache[("run", run)]

    def metrics(self, run: str, task: str, dataset: str) -> dict | None:
        """The metrics dict of an evaluated set, its ``{"skipped": line, "status": ...}``, or None (not
        evaluated: a set with no evaluation folder has no cell value, its skip line is in :meth:`skipped`)."""
        if not self.layout.eval_dir(run, dataset).is_dir():
            return None
        return (self.summary(run).get(task) or {}).get(dataset)

    def value(self, run: str, task: str, dataset: str, metric: str) -> float | None:
        m = self.metrics(run, task, dataset)
        if not m or records.skip_line(m) is not None:
            return None
        v = m.get(metric)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    def has_all(self, runs: list[str], task: str, datasets: list[str], metric: str) -> bool:
        return bool(runs) and bool(datasets) and all(
            self.value(r, task, d, metric) is not None for r in runs for d in datasets)

    def column_sets(self, target: TargetConfig, column: ColumnConfig) -> tuple[list[str], str]:
        """(data sets used, mapping note) of a column: the paper's sets where some run has them all, else the
        stand-ins. The note reads ``ImageNet -> fashion_mnist`` style (empty when the paper's sets are used)."""
        runs = [r for base in target.runs() for r in self.cfg.run_group(base)]
        if column.datasets and any(self.has_all([r], column.task, column.datasets, column.metric) for r in runs):
            return column.datasets, ""
        if column.offline:
            paper = " + ".join(column.datasets) or "(none)"
            return column.offline, f"{column.label}: {paper} -> {' + '.join(column.offline)}"
        return column.datasets, ""

    def cell(self, base: str, column: ColumnConfig, datasets: list[str]) -> Cell:
        """Mean over ``datasets`` per seed run, then mean ± std over the run group ``base``."""
        runs = self.cfg.run_group(base)
        if not runs:
            return Cell(note="not configured")
        per_run = []
        for r in runs:
            vals = [self.value(r, column.task, d, column.metric) for d in datasets]
            if vals and all(v is not None for v in vals):
                per_run.append(float(np.mean(vals)))
        if not per_run:
            if (absent := self.skipped_run(runs)) is not None:
                return Cell(note=absent)
            why = {status for r in runs for d in datasets
                   if (status := records.status_of(self.metrics(r, column.task, d))) is not None}
            if why and all(status.state == TaskStatus.NOT_APPLICABLE for status in why):
                return Cell(note=f"n/a: {min(why, key=lambda status: status.line).reason}")
            return Cell(note="no result")
        m, s = mean_std(per_run)
        return Cell(mean=m, std=s, n=len(per_run))

    def skipped_runs(self) -> dict[str, str]:
        """{run: reason} of the runs skipped because their training data is absent (they had no job)."""
        if "runs_without_data" not in self._cache:
            self._cache["runs_without_data"] = self.cfg.runs_without_data()
        return self._cache["runs_without_data"]

    def skipped_run(self, runs: list[str]) -> str | None:
        """``skipped: <run>'s training data is absent`` when every run of a row was skipped so, else None (the
        report's index says which files are missing)."""
        absent = self.skipped_runs()
        if runs and all(r in absent for r in runs):
            return f"skipped: {runs[0]}'s training data is absent"
        return None

    def skipped(self) -> dict[str, str]:
        """{data set: skip line} over every run's metrics files (listed once in the index)."""
        out: dict[str, str] = {}
        for run in self.cfg.run_names():
            for per_set in self.summary(run).values():
                for dataset, m in per_set.items():
                    status = records.status_of(m)
                    if status is not None and status.state != TaskStatus.NOT_APPLICABLE:
                        out.setdefault(dataset, status.line)
        return dict(sorted(out.items()))

    def chance(self, task: str, datasets: list[str], runs: list[str]) -> dict[str, float]:
        """{set: chance level of ``task``'s headline} (its ``Task.chance``, from the first of ``runs`` whose
        metrics file states it: zero-shot's 100 / classes)."""
        rule, out = TASKS[task].chance, {}
        for d in datasets:
            for r in runs:
                m = self.metrics(r, task, d)
                if m and rule is not None and (level := rule(m)) is not None:
                    out[d] = level
                    break
        return out

    # ---- train logs
    def phase_times(self, run: str) -> dict[str, float] | None:
        return phase_times(self.layout.train_log(run))

    def epoch_cell(self, base: str, reference: str) -> Cell:
        """``E (Rel.)``: the run's epochs and its measured training time in units of one epoch of ``reference``
        (paper Table IV: "relative epoch" = absolute training time / time of one standard CLIP epoch)."""
        runs = self.cfg.run_group(base)
        if not runs:
            return Cell(note="not configured")
        epochs = self.cfg.run(runs[0]).epochs
        if self.cfg.run(runs[0]).pretrained.enabled:  # evaluated as released: its training time is not ours to measure
            return Cell(text=f"{epochs:g} (released checkpoint)")
        ref_runs = self.cfg.run_group(reference)
        ref = [t["total"] / self.cfg.run(r).epochs for r in ref_runs if (t := self.phase_times(r))]
        mine = [t["total"] for r in runs if (t := self.phase_times(r))]
        ep = f"{epochs:g}"
        if not mine and (absent := self.skipped_run(runs)) is not None:
            return Cell(text=f"{ep} ({absent})", note=absent)
        if not ref or not mine:
            return Cell(text=f"{ep} (no train log)")
        rel = [m / float(np.mean(ref)) for m in mine]
        m, s = mean_std(rel)
        return Cell(text=f"{ep} ({m:.1f})" if len(rel) == 1 else f"{ep} ({m:.1f} ± {s:.1f})", mean=m, std=s,
                    n=len(rel))


def phase_times(log_path: Path) -> dict[str, float] | None:
    """Seconds per episode phase summed over a run's episodes (``time/extract``, ``time/kmeans``, ``time/pbt``,
    ``time/train`` of the ``episode`` records), plus ``total`` and ``episodes``; None without a log.

    A resumed run may repeat an episode record: the last record of each episode counts.
    """
    per_episode = {int(rec["episode"]): rec for rec in records.read_train_log(log_path, kind="episode")}
    if not per_episode:
        return None
    out = {s: sum(float(r.get(f"time/{s}", 0.0)) for r in per_episode.values()) for s in PHASES}
    out["total"] = sum(out[s] for s in PHASES)
    out["episodes"] = float(len(per_episode))
    return out if math.isfinite(out["total"]) else None


__all__ = ["PaperNumber", "paper_numbers", "paper_value", "Cell", "Results", "phase_times", "mean_std",
           "PHASES"]
