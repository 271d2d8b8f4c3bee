"""The evaluation tasks: their names, the metrics tables show, and what a task did (:class:`TaskStatus`).

The one place that names them. ``protoclip.evaluate`` runs a task by its name (``evaluate.adapters``: one adapter
per task, registered under the name), ``protoclip.files.records`` lists a run's metrics files by it, and the report's
targets and tables read the headline metrics from here.

=========== ================================================ ===================== ===========
task        what it measures (paper)                          headline metrics      text tower
=========== ================================================ ===================== ===========
zeroshot    prompt-ensembled zero-shot (Sec. IV-C1, Table VI) top1, top5            yes
linear      L-BFGS / SGD linear probe (IV-C2, Table VII)       top1                  no
knn         weighted k-NN probe (IV-C3, Table VII)            top1                  no
retrieval   image-text retrieval (IV-C4, Table VIII)          mean_recall, R@1      yes
clustering  k-means ARI / AMI (IV-G3, Table XII)              ari, ami              no
nemd        NEMD, uniformity, spread (PAUC)                   nemd, ...             no
tsne        t-SNE figure (Fig. 8)                             n_points              no
temperature temperature paper Fig. 1 / Fig. 8 / Table 11      equilibrium_scale,... yes
=========== ================================================ ===================== ===========
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

# task -> the metrics its table cells show, the first the headline (collect's summary line); as in the paper
HEADLINE: dict[str, list[str]] = {
    "zeroshot": ["top1", "top5"],  # Table VI
    "linear": ["top1"],  # Table VII
    "knn": ["top1"],  # Table VII
    "retrieval": ["mean_recall", "image_to_text_R@1", "text_to_image_R@1"],  # Table VIII
    "clustering": ["ari", "ami"],  # Table XII
    "nemd": ["nemd", "uniformity", "intra_class_spread"],  # PAUC / methods-spec 3.4
    "tsne": ["n_points"],  # a figure (Fig. 8): no table
    # the temperature study's figure: tau* at ratio 1 (Fig. 1), the pairs (Fig. 1 / 8), the tokens (Table 11)
    "temperature": ["equilibrium_scale", "n_pairs", "tokens"],
}
TASKS: tuple[str, ...] = tuple(HEADLINE)  # every task, in the order summaries list them

# tasks that score text against images: for a run whose method trains the image tower only (PCL) they are
# "not applicable" (its text tower is untrained: the numbers would be chance)
TEXT_TASKS: tuple[str, ...] = ("zeroshot", "retrieval", "temperature")

# tasks that read a labelled set's train split (the probes): only they make a loader build it, and a copy of a set
# without one skips them with the reason
PROBE_TASKS: tuple[str, ...] = ("linear", "knn")

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


__all__ = ["HEADLINE", "TASKS", "TEXT_TASKS", "PROBE_TASKS", "SKIPPED", "STATUS", "NOT_APPLICABLE", "NOT_RUN",
           "TaskStatus", "check_tasks"]
