"""The result files' formats, written and read only here: a task's metrics and per-example results, the evaluation
folder's ``tasks.json`` marker, a run's ``metrics.json``, the claims ledger's ``claims.json`` and the train log.

What each file holds: docs/architecture.md, "Records".
"""
from __future__ import annotations

import io
import json
import math
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from protoclip.files import completion
from protoclip.files.atomic import atomic_path, write_json, write_text
from protoclip.tasks import SKIPPED, STATUS, TASKS, TaskStatus



# --------------------------------------------------------------------------- metrics files
def write_metrics(path: Path, record: dict[str, Any]) -> Path:
    """A task that ran: ``record`` holds ``metrics`` and its context (evaluate.stage builds it)."""
    return write_json(path, record)


def write_skip(path: Path, run: str, dataset: str, task: str, status: TaskStatus) -> Path:
    """A task that did not run on the set: its status, and the status's one line."""
    return write_json(path, {"run": run, "dataset": dataset, "task": task, **skip_result(status)})


def skip_result(status: TaskStatus) -> dict[str, Any]:
    """The result of a task that did not run, as metrics files and metrics.json hold it."""
    return {SKIPPED: status.line, STATUS: status.record()}


def _result(data: dict, path: Path) -> dict:
    if SKIPPED not in data:
        return data.get("metrics", {})
    if not isinstance(data.get(STATUS), dict):
        raise completion.RecordError(f"{path}: a skipped task without its status; run its evaluation again")
    return {SKIPPED: data[SKIPPED], STATUS: data[STATUS]}


def read_metrics(path: Path) -> dict | None:
    """The metrics dict of a task file, ``{"skipped": line}`` when it did not run, None when there is no file;
    a file that is not a JSON object (0 bytes, cut, binary) stops with one line naming it. This reads one file:
    list a run's files with :func:`metrics_files` / :func:`run_results`, which require the completion marker."""
    path = Path(path)
    return _result(completion.read_record(path), path) if path.exists() else None


def skip_line(result: dict | None) -> str | None:
    """The reason of a result that did not run (None: it ran, or there is no result)."""
    return result.get(SKIPPED) if isinstance(result, dict) else None


def status_of(result: dict | None) -> TaskStatus | None:
    """The status of a result that did not run, as a value (None: it ran, or there is no result)."""
    if not isinstance(result, dict) or SKIPPED not in result:
        return None
    return TaskStatus.from_record(result[STATUS])


def _vouched(layout, run: str, dataset: str) -> list[Path]:
    """The task files of one evaluation folder that its completion marker vouches for."""
    files = completion.complete_files(layout.eval_dir(run, dataset), layout.eval_tasks(run, dataset))
    return [p for p in files if p.suffix == ".json" and p.stem in TASKS]


# --------------------------------------------------------------------------- per-example results
_EPOCH = (1980, 1, 1, 0, 0, 0)  # the zip entries' fixed time: the same arrays give the same bytes


def write_examples(path: Path, arrays: dict[str, np.ndarray]) -> Path:
    """A task's per-example arrays as an .npz (``np.load`` reads it), byte-deterministic (np.savez stamps each
    zip entry with the current time: a re-evaluation with identical results would change the file for DVC).

    They are what the metrics are computed from (hit per test image, rank of each query's first match, each
    image's cluster, with the ``labels``), so the claims ledger bootstraps them without extracting features again.
    """
    with atomic_path(path) as tmp, zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name in sorted(arrays):
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(arrays[name]), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, buf.getvalue())
    return Path(path)


def read_examples(layout, run: str, task: str, dataset: str) -> dict[str, np.ndarray] | None:
    """The per-example arrays of ``task`` on ``dataset`` that the folder's completion marker vouches for; None
    when it lists none (the task keeps none, or the folder was evaluated before they were kept). A folder
    killed half-way, or a file changed since, stops with one line naming it (as for metrics files)."""
    path = layout.examples(run, task, dataset)
    if not layout.eval_dir(run, dataset).is_dir():
        return None
    if path not in completion.complete_files(path.parent, layout.eval_tasks(run, dataset), pattern="*.npz"):
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError, zipfile.BadZipFile) as err:
        raise completion.RecordError(f"{path}: not a readable .npz ({type(err).__name__}: {err}); "
                                     "run its evaluation again") from None


def metrics_files(layout, run: str) -> list[tuple[str, str, Path]]:
    """``(task, dataset, path)`` of every metrics file of ``run`` that its folder's completion marker vouches for,
    sorted by task then set; a folder without a marker (killed half-way) or with a changed file: one-line error."""
    sets = sorted(p.name for p in layout.run_dir(run).glob("eval/*/") if p.is_dir())
    found = sorted((p for d in sets for p in _vouched(layout, run, d)), key=lambda p: (p.stem, p.parent.name))
    return [(p.stem, p.parent.name, p) for p in found]


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
    """A run's metrics.json ({} when there is none; a broken file: one line naming it)."""
    path = Path(path)
    return completion.read_record(path) if path.exists() else {}


def collected_results(layout, run: str) -> dict[str, dict[str, dict]]:
    """What `collect` wrote for ``run`` (its metrics.json), the one source of the report's numbers and skip lines;
    {} for a run with no evaluation folder. The evaluation folders it summarises are checked first: each complete
    and intact (its marker), each vouched metrics file listed; else one line naming the folder, the file or
    metrics.json (run `protoclip collect`)."""
    path = layout.metrics_summary(run)
    vouched = metrics_files(layout, run)  # a killed or changed evaluation folder: one line naming it
    if not path.exists():
        if vouched:
            raise completion.IncompleteOutputError(f"{path}: missing beside run {run}'s evaluation folders; run "
                                                   f"`protoclip collect --run {run}`")
        return {}
    summary = read_summary(path)
    for task, dataset, _ in vouched:
        if dataset not in (summary.get(task) or {}):
            raise completion.IncompleteOutputError(f"{path}: older than {layout.eval_dir(run, dataset)} (no {task} "
                                                   f"result); run `protoclip collect --run {run}`")
    return summary


def write_tasks(path: Path, run: str, dataset: str, status: dict[str, str], model_sha256: str,
                subsample: dict | None = None, files: list[Path] = ()) -> Path:
    """The folder's completion marker, written last: ``status`` (what each configured task did),
    ``model_sha256`` and the probe ``subsample``, plus the sha256 of each metrics file in ``files``
    (the evaluation must have called ``completion.start`` on the folder before writing any of them)."""
    record: dict[str, Any] = {"run": run, "dataset": dataset, "tasks": status, "model_sha256": model_sha256}
    if subsample is not None:
        record["subsample"] = subsample
    return completion.finish(path, record, files)


# --------------------------------------------------------------------------- claims.json
def write_claims(path: Path, claims: dict[str, dict[str, Any]]) -> Path:
    """The ledger's numbers and verdicts, ``{claim id: {"ours", "ci_low", "ci_high", "paper", "verdict"}}``
    (non-finite numbers as null: JSON has no NaN)."""
    clean = {cid: {k: (v if not isinstance(v, float) or math.isfinite(v) else None) for k, v in c.items()}
             for cid, c in claims.items()}
    return write_json(path, clean)


def read_claims(path: Path) -> dict[str, dict[str, Any]]:
    return completion.read_record(Path(path))


# --------------------------------------------------------------------------- train_log.jsonl
PHASES = ("extract", "kmeans", "pbt", "train")  # the episode phases an episode record times, as time/<phase>


def _clean(value: Any) -> Any:
    """JSON has no NaN/Inf: write them as strings so the line stays valid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    return value


RESTART_KINDS = ("start", "resume")  # records of a (re)start of the training process, not of training


def covered(record: dict[str, Any], episode: int, step: int) -> bool:
    """Whether a checkpoint taken before episode ``episode`` and global step ``step`` covers ``record``: steps
    before ``step``, episode-level records before ``episode``, (re)starts at or before ``episode``."""
    kind = record.get("kind")
    if kind == "step":
        return record["step"] < step
    if kind in RESTART_KINDS:
        return record.get("episode", 0) <= episode
    return "episode" not in record or record["episode"] < episode


class TrainLog:
    """A run's train log: each record appended to ``work`` (kept beside the checkpoint), then to ``path`` (the
    workflow's output, readable as training goes). ``work=None``: ``path`` alone. Disabled on non-zero DDP ranks.

    A training from scratch calls :meth:`begin`, a resumed one :meth:`resume_at`; the trainer calls
    :meth:`publish` at the end, so that ``path`` is ``work``'s copy whatever happened to it meanwhile. Records go
    to ``work`` first because Snakemake deletes a failed job's outputs; cut back on resume to what the checkpoint
    covers, a resumed run's log equals an uninterrupted run's but for ``time/*`` and its ``resume`` records.

        log = TrainLog(path); log.append({"kind": "step", "step": 0, "loss": 1.2})
    """

    def __init__(self, path: str | Path, work: str | Path | None = None, enabled: bool = True):
        self.path = Path(path)
        self.work = Path(work) if work is not None else None
        self.enabled = enabled  # False on non-zero DDP ranks

    def _files(self) -> list[Path]:
        return [self.work, self.path] if self.work is not None else [self.path]

    def begin(self) -> None:
        """A training from scratch: no record of an earlier training stays."""
        if self.enabled:
            for path in self._files():
                path.unlink(missing_ok=True)

    def append(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        line = json.dumps(_clean(record), sort_keys=True) + "\n"
        for path in self._files():
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a") as f:
                f.write(line)
                f.flush()

    def resume_at(self, episode: int, step: int) -> int:
        """Keep only the records a checkpoint at (next ``episode``, global ``step``) covers (:func:`covered`),
        then publish; returns how many records were kept. Reads ``work``, or ``path`` when there is no ``work``
        (a checkpoint older than it); a line cut by a kill is dropped."""
        if not self.enabled:
            return 0
        source = next((p for p in self._files() if p.exists()), None)
        kept = []
        for line in source.read_text().splitlines() if source is not None else []:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # a line cut by the kill
                continue
            if isinstance(rec, dict) and covered(rec, episode, step):
                kept.append(line)
        write_text(self._files()[0], "".join(k + "\n" for k in kept))
        self.publish()
        return len(kept)

    def publish(self) -> None:
        """Make ``path`` a copy of ``work`` (atomically): the log as the checkpoint's side has it."""
        if self.enabled and self.work is not None and self.work.exists():
            write_text(self.path, self.work.read_text())


def read_train_log(path: str | Path, kind: str | None = None) -> list[dict[str, Any]]:
    """Records of a ``train_log.jsonl`` (only those of ``kind`` when given; [] when there is no file): one JSON
    object per line, kinds ``start``, ``resume``, ``step``, ``episode`` (with the phase times ``time/*``),
    ``early_stop``."""
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


def episode_times(log_path: str | Path) -> dict[str, np.ndarray] | None:
    """Seconds of each episode phase per episode, ``{phase: [episodes]}`` plus ``total`` (their sum), in episode
    order; None without a log. A resumed run may repeat an episode record: the last record of each episode
    counts. The claims ledger resamples these (the cost claims, protoclip.claims.engine)."""
    per_episode = {int(rec["episode"]): rec for rec in read_train_log(log_path, kind="episode")}
    if not per_episode:
        return None
    recs = [per_episode[e] for e in sorted(per_episode)]
    out = {s: np.array([float(r.get(f"time/{s}", 0.0)) for r in recs]) for s in PHASES}
    out["total"] = sum(out[s] for s in PHASES)
    return out
