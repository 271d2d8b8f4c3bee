"""Paper targets (tables and figures) declared as data: the ``target:`` block of an experiment file.

Declared as data so that one block serves the offline default and ``config/paper.yaml`` alike (each config fills a
row with the run it has), and the DAG plans every evaluation a table needs from it. The format, with an example:
config/experiments/README.md.
"""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from protoclip.evaluate.config import EvaluateConfig
from protoclip.config.protocols import Project
from protoclip.evaluate.tasks.clustering import TASK as CLUSTERING
from protoclip.tasks import TASKS as EVAL_TASKS

SPECIAL_TASKS = ("epochs",)  # computed from train logs, not metrics files


@dataclass
class ColumnConfig:
    label: str  # the paper's column header ("ImageNet zero-shot")
    task: str  # an evaluation task (zeroshot, linear, ...) or "epochs"
    metric: str = "top1"  # key of the task's metrics dict (top1, top5, mean_recall, ari, ami, ...)
    datasets: list[str] = field(default_factory=list)  # the paper's data sets; several -> their mean
    offline: list[str] = field(default_factory=list)  # stand-ins when the paper's sets have no results
    paper: str | None = None  # column key in the paper numbers (default: label)

    def validate(self) -> None:
        if self.task not in (*EVAL_TASKS, *SPECIAL_TASKS):
            raise ValueError(f"column '{self.label}': unknown task '{self.task}' "
                             f"(known: {', '.join((*EVAL_TASKS, *SPECIAL_TASKS))})")
        if self.task in EVAL_TASKS and not (self.datasets or self.offline):
            raise ValueError(f"column '{self.label}': needs `datasets` and/or `offline`")

    @property
    def paper_key(self) -> str:
        return self.paper or self.label


def first_configured(cfg: Project, names: str | list[str] | None) -> str | None:
    """The first of ``names`` that ``cfg`` configures (a run or a seeds group); else the first name, or None.

    A row names its run in the paper configuration and, after it, the offline default's (``[t4_clip_32ep,
    clip_tiny]``): each config fills the row with the run it has.
    """
    if names is None:
        return None
    names = [names] if isinstance(names, str) else list(names)
    return next((n for n in names if cfg.run_group(n)), names[0] if names else None)


@dataclass
class RowConfig:
    label: str  # the paper's row label ("ProtoCLIP w/o RoBERTa")
    # run (base name) whose numbers fill the row, or candidates (the first configured one is used);
    # null: a paper-only row
    run: str | list[str] | None = None
    paper: str | None = None  # row key in the paper numbers (default: label); "-" = the paper has no such row
    x: float | None = None  # figures: the row's x value (subset fraction, episode size, ...)

    @property
    def paper_key(self) -> str | None:
        return None if self.paper == "-" else (self.paper or self.label)


@dataclass
class TargetConfig:
    """One ``target:`` block (config/experiments/README.md), validated by :mod:`protoclip.config.strict` when the
    config loads. ``cfg.paper_targets()`` lists them resolved (each row naming the run it uses there); what the DAG
    plans from them (the files ``protoclip report`` writes, the evaluations each run needs) is in
    :mod:`protoclip.dag.stages` (``target_outputs``, ``evaluation_requests``)."""

    id: str  # table_III, fig_6a, ...: output file stem
    kind: Literal["table", "figure"]
    caption: str  # the paper's caption (ours adds the data, config and column mapping)
    rows: list[RowConfig] = field(default_factory=list)
    columns: list[ColumnConfig] = field(default_factory=list)
    paper: str | None = None  # key in paper_numbers.yaml (default: id); "-" = no paper numbers
    # figures: bars (one bar per row, first column), scaling (x = row.x, log axis), tsne (first two rows'
    # runs side by side on the same points of `tsne_dataset`), time_split (stacked phase times per row),
    # temperature (the rows' learned logit scale, equilibrium statistic and gradient norm over training)
    plot: Literal["table", "bars", "scaling", "tsne", "time_split", "temperature"] = "table"
    xlabel: str = ""  # figure x-axis label
    reference_run: str | list[str] | None = None  # "epochs" column: Rel. in units of this run's epoch time
    tsne_dataset: list[str] = field(default_factory=list)  # tsne: paper set, then stand-ins (first with features)
    tsne_max_points: int = 1000  # tsne: seeded subsample, the same points for both runs

    def validate(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_]+", self.id):
            raise ValueError(f"target id '{self.id}' must be letters, digits and '_' (it names files)")
        if self.kind == "table" and self.plot != "table":
            raise ValueError(f"target {self.id}: a table has plot 'table', got '{self.plot}'")
        if self.kind == "figure" and self.plot == "table":
            raise ValueError(f"target {self.id}: a figure needs plot bars|scaling|tsne|time_split|temperature")
        if self.plot in ("bars", "scaling", "table") and not self.columns:
            raise ValueError(f"target {self.id}: needs at least one column")
        if self.plot == "scaling" and any(r.x is None for r in self.rows if r.run):
            raise ValueError(f"target {self.id}: every run row of a scaling figure needs `x`")
        if self.plot == "tsne" and (len([r for r in self.rows if r.run]) != 2 or not self.tsne_dataset):
            raise ValueError(f"target {self.id}: a t-SNE figure needs two run rows and `tsne_dataset`")
        if any(c.task == "epochs" for c in self.columns) and not self.reference_run:
            raise ValueError(f"target {self.id}: an 'epochs' column needs `reference_run`")

    @property
    def paper_key(self) -> str | None:
        return None if self.paper == "-" else (self.paper or self.id)

    def resolved(self, cfg: Project) -> "TargetConfig":
        """A copy whose rows and reference name the one run each uses in ``cfg`` (see first_configured)."""
        out = copy.deepcopy(self)
        for row in out.rows:
            row.run = first_configured(cfg, row.run)
        out.reference_run = first_configured(cfg, out.reference_run)
        return out

    def runs(self) -> list[str]:
        """Base run names of a resolved target (rows, then the reference run)."""
        names = [r.run for r in self.rows if r.run]
        if self.reference_run:
            names.append(self.reference_run)
        return list(dict.fromkeys(names))

    def runs_configured(self, cfg: Project) -> bool:
        """Whether at least one row of this resolved target has a configured run."""
        return any(cfg.run_group(r.run) for r in self.rows if r.run)

    def requests(self) -> dict[str, set[str]]:
        """{dataset: tasks} each of the target's runs needs evaluated."""
        out: dict[str, set[str]] = {}
        for c in self.columns:
            if c.task in EVAL_TASKS:
                for d in c.datasets + c.offline:
                    out.setdefault(d, set()).add(c.task)
        if self.plot == "tsne":  # features only: t-SNE is computed by the report on the cached features
            for d in self.tsne_dataset:
                out.setdefault(d, set()).add(CLUSTERING.name)  # the figure's titles print its ARI / AMI
        return out


@runtime_checkable
class ReportProject(Project, Protocol):
    """The project config as the report reads it (protoclip.project.ProjectConfig; see protoclip.config.protocols)."""

    @property
    def evaluate(self) -> EvaluateConfig: ...

    def paper_targets(self) -> list[TargetConfig]: ...
    def runs_without_data(self) -> dict[str, str]: ...

__all__ = ["ReportProject", "ColumnConfig", "RowConfig", "TargetConfig", "SPECIAL_TASKS", "first_configured"]
