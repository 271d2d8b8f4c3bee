"""The result files' formats, written and read only here: metrics files, tasks.json, metrics.json, train log.

* ``results/runs/<run>/eval/<set>/<task>.json``: one evaluation task's record. A task that ran has
  ``metrics`` (plus run, dataset, task, sizes, feature kind, provenance); a task that did not has
  ``skipped``, a one-line reason: ``skipped: <set> not found at <path>`` (the set's data is missing) or
  ``not applicable: <why>`` (:data:`NOT_APPLICABLE`, e.g. zero-shot of an image-only run). Read back with
  :func:`read_metrics`, "not run" has one shape: ``{"skipped": line}``; a file that does not exist reads None.
* ``results/runs/<run>/eval/<set>/tasks.json``: what each configured task did on the set (``ran``,
  a skip line, ``not applicable: ...`` or ``not run: ...``), the model's sha256 and the probe subsample.
* ``results/runs/<run>/metrics.json``: ``{task: {set: metrics or {"skipped": line}}}`` of the whole run
  (``protoclip collect``; the DVC metrics file).
* ``results/runs/<run>/train_log.jsonl``: one JSON object per line, appended as training goes. Kinds:
  ``start`` (config + provenance, once per (re)start), ``step`` (loss terms, temperatures, LRs of one
  optimizer step), ``episode`` (cluster statistics and the phase times ``time/extract``, ``time/kmeans``,
  ``time/pbt``, ``time/train`` of one episode), ``early_stop``. On resume the log is cut back to what the
  checkpoint covers, atomically, so a resumed run's log equals an uninterrupted run's.

    log = TrainLog(path); log.append({"kind": "step", "step": 0, "loss": 1.2})
    read_train_log(path, kind="episode")
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from protoclip.atomic import write_json, write_text
from protoclip.evaluate.config import NOT_APPLICABLE, TASKS

# task -> its metrics shown in tables, the first the headline (collect's summary line); as in the paper's tables
HEADLINE: dict[str, list[str]] = {
    "zeroshot": ["top1", "top5"],  # Table VI
    "linear": ["top1"],  # Table VII
    "knn": ["top1"],  # Table VII
    "retrieval": ["mean_recall", "image_to_text_R@1", "text_to_image_R@1"],  # Table VIII
    "clustering": ["ari", "ami"],  # Table XII
    "nemd": ["nemd", "uniformity", "intra_class_spread"],  # PAUC / methods-spec 3.4
    "tsne": ["n_points"],  # a figure (Fig. 8): no table
}
SKIPPED = "skipped"  # the key of a task that did not run, in metrics files and metrics.json


# --------------------------------------------------------------------------- metrics files
def write_metrics(path: Path, record: dict[str, Any]) -> Path:
    """A task that ran: ``record`` holds ``metrics`` and its context (evaluate.stage builds it)."""
    return write_json(path, record)


def write_skip(path: Path, run: str, dataset: str, task: str, reason: str) -> Path:
    """A task that did not run on the set: its one-line reason."""
    return write_json(path, {"run": run, "dataset": dataset, "task": task, SKIPPED: reason})


def _result(data: dict) -> dict:
    return {SKIPPED: data[SKIPPED]} if SKIPPED in data else data.get("metrics", {})


def read_metrics(path: Path) -> dict | None:
    """The metrics dict of a task file, ``{"skipped": line}`` when it did not run, None when there is no file."""
    path = Path(path)
    return _result(json.loads(path.read_text())) if path.exists() else None


def skip_line(result: dict | None) -> str | None:
    """The reason of a result that did not run (None: it ran, or there is no result)."""
    return result.get(SKIPPED) if isinstance(result, dict) else None


def is_not_applicable(line: str) -> bool:
    """A skip line that says the task does not apply to the run or set (cells read n/a), not missing data."""
    return line.startswith(NOT_APPLICABLE)


def metrics_files(layout, run: str) -> list[tuple[str, str, Path]]:
    """``(task, dataset, path)`` of every metrics file of ``run`` on disk, sorted by task then set."""
    found = sorted(layout.run_dir(run).glob("eval/*/*.json"), key=lambda p: (p.stem, p.parent.name))
    return [(p.stem, p.parent.name, p) for p in found if p.stem in TASKS]


def run_results(layout, run: str) -> dict[str, dict[str, dict]]:
    """{task: {set: metrics or {"skipped": line}}} from every metrics file of ``run``."""
    out: dict[str, dict[str, dict]] = {}
    for task, dataset, path in metrics_files(layout, run):
        out.setdefault(task, {})[dataset] = read_metrics(path)
    return out


# --------------------------------------------------------------------------- metrics.json, tasks.json
def write_summary(path: Path, summary: dict[str, dict[str, dict]]) -> Path:
    return write_json(path, summary)


def read_summary(path: Path) -> dict[str, dict[str, dict]]:
    """A run's metrics.json ({} when there is none)."""
    path = Path(path)
    return json.loads(path.read_text()) if path.exists() else {}


def write_tasks(path: Path, run: str, dataset: str, status: dict[str, str], model_sha256: str,
                subsample: dict | None = None) -> Path:
    record: dict[str, Any] = {"run": run, "dataset": dataset, "tasks": status, "model_sha256": model_sha256}
    if subsample is not None:
        record["subsample"] = subsample
    return write_json(path, record)


# --------------------------------------------------------------------------- train_log.jsonl
def _clean(value: Any) -> Any:
    """JSON has no NaN/Inf: write them as strings so the line stays valid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    return value


class TrainLog:
    """Appends records to a run's ``train_log.jsonl`` (one line each, flushed)."""

    def __init__(self, path: str | Path, enabled: bool = True):
        self.path = Path(path)
        self.enabled = enabled  # False on non-zero DDP ranks

    def append(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps(_clean(record), sort_keys=True) + "\n")
            f.flush()

    def truncate_to(self, episode: int, step: int) -> None:
        """Keep only records a checkpoint at (next ``episode``, global ``step``) covers."""
        if not self.enabled or not self.path.exists():
            return
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # a line cut by the kill
                continue
            kind = rec.get("kind")
            if (kind == "step" and rec["step"] >= step) or (kind == "episode" and rec["episode"] >= episode):
                continue
            kept.append(line)
        write_text(self.path, "".join(k + "\n" for k in kept))

    def reset(self) -> None:
        if self.enabled and self.path.exists():
            self.path.unlink()


def read_train_log(path: str | Path, kind: str | None = None) -> list[dict[str, Any]]:
    """Records of a ``train_log.jsonl`` (only those of ``kind`` when given; [] when there is no file)."""
    path = Path(path)
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        if kind is None or rec.get("kind") == kind:
            out.append(rec)
    return out
