"""The evaluation tasks: each task's properties (:class:`Task`, the registry :data:`TASKS`) and what a task did on
a set (:class:`TaskStatus`). A task is one module of :mod:`protoclip.evaluate.tasks` that declares its :class:`Task`
with :func:`register` (each module's docstring says what it measures and where the paper prints it); the modules are
imported with this one (:func:`load_tasks`), so adding a task edits no other file: the plan, the loaders, validation
while training, collect, the report's tables and the claims ledger read a task's properties here, never a list of
task names of their own.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Any, Callable, ClassVar


@dataclass(frozen=True)
class Task:
    """One evaluation task: what it reads of a set, what its tables show, how the ledger resamples it, where it
    may run, its settings and rules. ``adapter`` runs it (``SetInput -> TaskResult``,
    :mod:`protoclip.evaluate.tasks.base`): the function itself (a task module's, which imports its metric code
    inside it) or a ``"module:function"`` path, imported when the task first runs
    (:func:`protoclip.evaluate.adapters.adapter_of`)."""

    name: str
    metrics: tuple[str, ...]  # the metrics its table cells show, the first the headline (collect's summary line)
    adapter: str | Callable[..., Any]
    labels: bool = True  # reads a labelled test split (class labels)
    templates: bool = False  # reads the set's prompt templates
    probe: bool = False  # reads the labelled train split: only probes make a loader build it
    captions: bool = False  # reads caption pairs (a caption set, or a labelled set's captions)
    any_input: bool = False  # runs on whichever of its inputs the set has (captions, or labels with templates)
    # scores text against images: "not applicable" to a run whose method trains the image tower only (PCL),
    # whose text tower is untrained (the numbers would be chance)
    text: bool = False
    figure: bool = False  # draws a figure (SetInput.figure, logged with the run): no generic table
    # the per-example arrays it keeps (<task>.examples.npz), what the ledger resamples: "hits" (a hit per test
    # image: top1 / top5 are their means), "ranks" (a first-match rank per query), "clusters" (a k-means
    # assignment per image); "": none, its number is no mean over test examples
    examples: str = ""
    score: bool = False  # its metrics are scores on their own scale (ARI, AMI, NEMD), not percentages
    validation: bool = False  # validation while training may run it (train.validation.tasks)
    order: float = 1000.0  # where summaries and tables list it (TASKS is kept in this order; a plug-in: last)
    # its settings: the dataclass of its own config section ``evaluate.<name>`` (read as ``cfg.evaluate.<name>``,
    # built strictly like every section); None: it has none
    settings: type | None = None
    # its minimum-data rule on the extracted features of a labelled set: ``(SetFeatures, Similarity) -> why it
    # cannot run`` (a TaskStatus.TOO_SMALL reason) or None (protoclip.evaluate.plan.too_small)
    too_small: Callable[[Any, Any], str | None] | None = None
    # its chance level, from a metrics file's ``metrics``: the headline's value a random scorer gets (the tables'
    # captions state it), None when the file does not say; no function: the task states none
    chance: Callable[[dict], float | None] | None = None
    title: str = ""  # how captions name it ("Zero-shot chance level")
    digits: int = 2  # decimals of its numbers in the paper tables
    # the settings a run's evaluation logs as MLflow params: ``(its settings section, run name) -> {key: value}``
    params: Callable[[Any, str], dict] | None = None


TASKS: dict[str, Task] = {}  # every registered task, in ``order`` (the order summaries list them)
TASKS_PACKAGE = "protoclip.evaluate.tasks"  # every module of it is a task module (or the tasks' shared base)


def register(task: Task) -> Task:
    """Add ``task`` to :data:`TASKS` (a task module's declaration, or a test's toy task), in ``order``."""
    if task.name in TASKS:
        raise ValueError(f"evaluation task {task.name!r} is already registered")
    if not task.name.isidentifier() or task.name == "tasks":  # it names files beside an evaluation's tasks.json
        raise ValueError(f"evaluation task name {task.name!r}: letters, digits and '_', and not 'tasks'")
    ordered = sorted([*TASKS.values(), task], key=lambda t: t.order)  # stable: equal orders keep registration's
    TASKS.clear()
    TASKS.update((t.name, t) for t in ordered)
    return task


def unregister(name: str) -> None:
    TASKS.pop(name)


def load_tasks() -> None:
    """Import every module of :data:`TASKS_PACKAGE` (each registers its task as it is imported).

    Found, not listed, so that a task is one file. The task modules import at their top only what is light
    (dataclasses, this module, :mod:`protoclip.evaluate.protocols`): the config loader imports this module, and
    the adapters import numpy's metric code and torch only when they run."""
    package = importlib.import_module(TASKS_PACKAGE)
    for info in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{TASKS_PACKAGE}.{info.name}")


def task_sections() -> dict[str, type]:
    """{task name: the dataclass of its ``evaluate.<name>`` section} of every task that has settings."""
    return {name: t.settings for name, t in TASKS.items() if t.settings is not None}


def task_names(where: Callable[[Task], bool] = lambda t: True) -> tuple[str, ...]:
    """The names of the tasks with a property, in table order: ``task_names(lambda t: t.probe)``."""
    return tuple(name for name, t in TASKS.items() if where(t))


# the key of a task that did not run, in metrics files and metrics.json: its one line (TaskStatus.line)
SKIPPED = "skipped"
STATUS = "status"  # beside it: the TaskStatus as a value ({"state", "reason", "detail"}), read back by the report
NOT_APPLICABLE = "not applicable: "
NOT_RUN = "not run: "


@dataclass(frozen=True)
class TaskStatus:
    """What a task did on a set: it ran, or why not, as a value (the report reads ``state`` and ``reason``)."""

    RAN: ClassVar[str] = "ran"
    MISSING: ClassVar[str] = "missing"  # the set's data (or the split the task reads) is not there
    NOT_APPLICABLE: ClassVar[str] = "not_applicable"  # the task does not apply to the run or the set: cells read n/a
    TOO_SMALL: ClassVar[str] = "too_small"  # the extracted splits are too small for the task

    state: str
    reason: str = ""  # one clause: "no captions", "image-only method (pcl)"; a missing set's whole skip line
    detail: str = ""  # what follows the reason in the line ("the text tower is untrained")

    def __post_init__(self) -> None:
        if self.state not in (self.RAN, self.MISSING, self.NOT_APPLICABLE, self.TOO_SMALL):
            raise ValueError(f"unknown task state {self.state!r}")

    @property
    def ran(self) -> bool:
        return self.state == self.RAN

    @property
    def line(self) -> str:
        """The one line that metrics files, tasks.json and the tables show."""
        if self.state in (self.RAN, self.MISSING):
            return self.reason or self.state
        prefix = NOT_APPLICABLE if self.state == self.NOT_APPLICABLE else NOT_RUN
        return prefix + self.reason + (f", {self.detail}" if self.detail else "")

    def record(self) -> dict[str, str]:
        return {"state": self.state, "reason": self.reason, "detail": self.detail}

    @classmethod
    def from_record(cls, record: dict[str, str]) -> "TaskStatus":
        return cls(record["state"], record.get("reason", ""), record.get("detail", ""))


def check_tasks(names, where: str = "") -> None:
    """Raise ValueError naming the first of ``names`` that is not a task."""
    unknown = [t for t in names if t not in TASKS]
    if unknown:
        raise ValueError(f"{where}unknown evaluation task '{unknown[0]}' (known: {', '.join(TASKS)})")


# the task modules register themselves here; at the bottom, since they import Task and register from this module
# (the task package is above this module: imported by name, as the method registry imports its methods)
load_tasks()

__all__ = ["TASKS", "TASKS_PACKAGE", "Task", "register", "unregister", "load_tasks", "task_sections", "task_names",
           "SKIPPED", "STATUS", "NOT_APPLICABLE", "NOT_RUN",
           "TaskStatus", "check_tasks"]
