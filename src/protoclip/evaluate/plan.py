"""Which evaluation tasks run on a set, and why the others do not: decided here, as :class:`TaskStatus` values.

Two decisions, both here: before any feature is extracted (:func:`plan_tasks`: the set's data, the task's
inputs, the run's method) and after (:func:`too_small`: the extracted splits). A task that does not run has a
status whose ``line`` goes into tasks.json and, where a table cell must say why, into its metrics file; the report
reads the status itself back (``state``, ``reason``), never the words of the line.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from protoclip.evaluate.config import EvalDatasetConfig
from protoclip.evaluate.datasets import HELDOUT, CaptionSet, EvalSet, LabelledSet, Skipped
from protoclip.evaluate.datasets.wds import dataset_type as wds_dataset_type
from protoclip.evaluate.set_features import SetFeatures
from protoclip.similarity import Similarity
from protoclip.tasks import TASKS, TaskStatus, task_names


def static_tasks(name: str, cfg: EvalDatasetConfig) -> list[str]:
    """The configured tasks that can apply to a set of this kind (used for sets that are skipped): a caption set's
    the tasks that read captions, a labelled set's those that read labels, the held-out pairs' every task."""
    if cfg.kind in ("coco", "flickr30k") or (cfg.kind == "wds" and cfg.path and wds_dataset_type(
            Path(cfg.path).expanduser()) == "retrieval"):
        possible = set(task_names(lambda t: t.captions))
    elif cfg.kind == "offline" and name == HELDOUT:
        possible = set(TASKS)  # coarse labels in words have prompt templates (datasets.HELDOUT_TEMPLATES)
    else:
        possible = set(task_names(lambda t: t.labels))
    return [t for t in cfg.tasks if t in possible]


def image_only_method(spec) -> str | None:
    """The training method of a model if it trained the image tower only (e.g. ``pcl``): its text tower is
    untrained, so zero-shot and retrieval numbers would be chance; None otherwise. ``spec``: the model file's
    ``protoclip.models.EvalSpec`` (written by the method at save time, not read from the project config)."""
    return (spec.method or "unknown method") if spec.image_only else None


def not_applicable(task: str, ds: EvalSet) -> str | None:
    """Why ``task`` does not apply to the loaded set ``ds`` (None: it applies), from what the task reads
    (:class:`protoclip.tasks.Task`): caption pairs, a labelled test split, prompt templates, a train split."""
    t = TASKS[task]
    labelled = isinstance(ds, LabelledSet)
    pairs = isinstance(ds, CaptionSet) or (labelled and ds.captions is not None)
    if t.any_input:  # e.g. temperature: caption pairs (Fig. 1, 8) and / or a zero-shot set (Table 11)
        if (t.captions and pairs) or (t.labels and labelled and (ds.templates or not t.templates) and len(ds.test)):
            return None
        wanted = (["captions"] if t.captions else []) + (["prompt templates"] if t.templates else
                                                         ["class labels"] if t.labels else [])
        return "no " + " or ".join(wanted)
    if t.captions and not pairs:
        return "no captions"
    if not t.labels:
        return None
    if not labelled:
        return "no class labels"
    if t.templates and not ds.templates:
        return "no prompt templates"
    if t.probe and ds.train is None:
        return "no train split"
    if len(ds.test) == 0:
        return "empty test split"
    return None


@dataclass(frozen=True)
class TaskPlan:
    """What one configured task does on one set, decided before any feature is extracted."""
    status: TaskStatus  # RAN: extract features and run it (:func:`too_small` may still stop it)
    metrics_file: bool = False  # the status goes into the task's metrics file (tables show it in its cells)
    in_marker: bool = True  # the status goes into tasks.json

    @property
    def runs(self) -> bool:
        return self.status.ran


RUNS = TaskPlan(TaskStatus(TaskStatus.RAN))


def plan_tasks(name: str, ds: EvalSet | Skipped | None, wanted: list[str], image_only: str | None
               ) -> dict[str, TaskPlan]:
    """Run or skip, per task of ``wanted`` on the loaded set ``ds``.

    A set whose data is missing (:class:`Skipped`): every task's metrics file and status carry its skip line; a
    probe of a set whose train split is missing (``LabelledSet.train_missing``): the same, with that reason.
    A text-tower task of an image-only run's (``image_only``: its method) that would apply to the set: a
    not-applicable metrics file, so the report's cells read n/a (tasks.json does not list it). A task that
    does not apply to the set (:func:`not_applicable`): a not-applicable status only.
    """
    out: dict[str, TaskPlan] = {}
    for task in wanted:
        if isinstance(ds, Skipped):
            out[task] = TaskPlan(TaskStatus(TaskStatus.MISSING, ds.reason), metrics_file=True)
        elif TASKS[task].probe and isinstance(ds, LabelledSet) and ds.train is None and ds.train_missing:
            out[task] = TaskPlan(TaskStatus(TaskStatus.MISSING, f"skipped: {name}: {ds.train_missing}"),
                                 metrics_file=True)
        elif (reason := not_applicable(task, ds)) is not None:
            out[task] = TaskPlan(TaskStatus(TaskStatus.NOT_APPLICABLE, reason))
        elif image_only and TASKS[task].text:
            out[task] = TaskPlan(TaskStatus(TaskStatus.NOT_APPLICABLE, f"image-only method ({image_only})",
                                            "the text tower is untrained"), metrics_file=True, in_marker=False)
        else:
            out[task] = RUNS
    return out


def too_small(task: str, feats: SetFeatures, similarity: Similarity) -> TaskStatus | None:
    """Why the extracted splits of a labelled set are too small for ``task``, or its inputs unfit (None: it runs):
    a probe's train split needs 2 classes; the rest is the task's own minimum-data rule (``Task.too_small``)."""
    if not feats.labelled:
        return None
    t = TASKS[task]
    reason = None
    if t.probe and len(np.unique(feats.train_y)) < 2:
        reason = "the train split has fewer than 2 classes"
    elif t.too_small is not None:
        reason = t.too_small(feats, similarity)
    return TaskStatus(TaskStatus.TOO_SMALL, reason) if reason else None


__all__ = ["RUNS", "TaskPlan", "image_only_method", "not_applicable", "plan_tasks", "static_tasks", "too_small"]
