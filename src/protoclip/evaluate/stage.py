"""`protoclip evaluate`: every configured task on every configured data set of one run: its trained ``model.pt``,
or the released open_clip checkpoint its ``pretrained`` section names (evaluated as released, no training job).

    protoclip evaluate --config config/config.yaml --run protoclip_tiny_s0 [--task knn] [--dataset digits]
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from protoclip.files import completion, records

from protoclip.jobs import launch
from protoclip.errors import ConfigError
from protoclip.evaluate.adapters import SetInput, adapter_of
from protoclip.evaluate.collect import run_collect
from protoclip.evaluate.config import EvaluateConfig, EvaluateProject
from protoclip.evaluate.datasets import EvalSet, Skipped, load_eval_set
from protoclip.evaluate.plan import TaskPlan, image_only_method, plan_tasks, static_tasks, too_small
from protoclip.files.layout import Layout
from protoclip.files.provenance import provenance
from protoclip.config.strict import require_path
from protoclip.tasks import TASKS, TaskStatus, check_tasks
from protoclip.tracking import evaluation_run

log = logging.getLogger(__name__)


def mlflow_key(key: str) -> str:
    """MLflow metric names allow only [A-Za-z0-9_-. :/]: 'R@1' -> 'R_at_1', anything else -> '_'."""
    return re.sub(r"[^A-Za-z0-9_\-. :/]", "_", key.replace("@", "_at_"))


def metric_numbers(metrics: dict[str, Any], prefix: str, nested: bool = True,
                   skip: tuple[str, ...] = ()) -> dict[str, float]:
    """Numeric entries of ``metrics`` as MLflow metrics ``{prefix + key: value}``: with ``nested``, nested dicts'
    leaves too (keys joined with '/'); top-level keys in ``skip`` left out."""
    out: dict[str, float] = {}
    for k, v in metrics.items():
        if k in skip:
            continue
        if isinstance(v, dict):
            if nested:
                out.update(metric_numbers(v, f"{prefix}{k}/"))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[mlflow_key(f"{prefix}{k}")] = float(v)
    return out


def _still_valid(old_marker: dict | None, folder: Path, model_sha256: str) -> list[Path]:
    """Metrics files (and their per-example files) of an earlier complete evaluation of this folder that stay
    valid beside this one's (an evaluation of some tasks only, ``--task``): intact since and of the same model."""
    intact = completion.vouched(old_marker, folder)
    keep = [folder / name for name in intact if name.endswith(".json")
            and completion.read_record(folder / name).get("model_sha256") == model_sha256]
    kept_tasks = {p.stem for p in keep}
    return keep + [folder / name for name in intact if name.endswith(".examples.npz")
                   and name.removesuffix(".examples.npz") in kept_tasks]


def _requested(tasks: list[str] | None, datasets: list[str] | None, configured: list[str],
               source: str) -> tuple[list[str], list[str]]:
    """(tasks, data sets) of an evaluation request, checked against the task names and the ``configured`` sets
    (evaluate.datasets of the config file ``source``)."""
    tasks = list(tasks or TASKS)
    try:
        check_tasks(tasks)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    names = list(datasets or configured)
    bad = [d for d in names if d not in configured]
    if bad:
        raise ConfigError(f"{source}: data set '{bad[0]}' is not under evaluate.datasets "
                          f"(configured: {', '.join(configured) or 'none'})")
    return tasks, names


@dataclass
class SetEvaluation:
    """One run's evaluation on its sets: the model, what every set shares, and the one MLflow run. Each metrics
    file records ``provenance`` (this process's code and packages, and the evaluation's seed)."""
    ecfg: EvaluateConfig
    layout: Layout
    run: str
    extractor: Any  # protoclip.evaluate.features.FeatureExtractor of the run's model
    tracker: Any  # protoclip.tracking.Tracker
    provenance: dict = field(init=False)

    def __post_init__(self) -> None:
        self.provenance = provenance(self.ecfg.seed)

    @property
    def model_sha256(self) -> str:
        return self.extractor.model_sha256

    def evaluate(self, name: str, tasks: list[str]) -> list[Path]:
        """Every task of ``tasks`` that applies to set ``name``; returns the metrics files written.

        Plans the tasks (:mod:`protoclip.evaluate.plan`), extracts the set's features once
        (:mod:`protoclip.evaluate.features`, cached), runs each task's adapter (:mod:`protoclip.evaluate.tasks`) and
        writes ``results/runs/<run>/eval/<set>/<task>.json`` (plus ``<task>.examples.npz`` for a task that keeps
        per-example results, which the claims ledger resamples), logging the numbers to the run's MLflow run as
        ``eval/<task>/<set>/<metric>``. A task that does not run has a :class:`protoclip.tasks.TaskStatus`, which its
        metrics file carries where a table cell must say why. The folder is incomplete (no tasks.json) from its
        start until ``tasks.json``, its completion marker (:mod:`protoclip.files.completion`), is written last, so
        that a folder killed half-way is never read as complete."""
        folder = self.layout.eval_dir(self.run, name)
        folder.mkdir(parents=True, exist_ok=True)  # the job's output: present even when no task runs
        old_marker = completion.start(folder, self.layout.eval_tasks(self.run, name))
        ds_cfg = self.ecfg.datasets[name]
        wanted = [t for t in static_tasks(name, ds_cfg) if t in tasks]
        ds = load_eval_set(name, ds_cfg, self.layout, seed=self.ecfg.seed, tasks=wanted) if wanted else None
        if isinstance(ds, Skipped):
            log.warning(ds.reason)
        status: dict[str, str] = {}
        metrics_files: list[Path] = []
        other_files: list[Path] = []  # vouched for by the marker too: per-example results
        plans = plan_tasks(name, ds, wanted, image_only_method(self.extractor.spec))
        for task, plan in plans.items():
            if not plan.runs:
                metrics_files += self._skip(name, task, plan, status)
        runnable = [task for task, plan in plans.items() if plan.runs]
        feats = self.extractor.features(self.layout.features(self.run, name), ds,
                                        work=self.layout.eval_progress(self.run, name)) if runnable else {}
        x = SetInput(feats, ds, self.ecfg, self.layout.tsne_figure(self.run, name), self.extractor.similarity,
                     self.extractor, run=self.run)
        for task in runnable:
            if (small := too_small(task, feats, x.similarity)) is not None:
                log.warning("%s: %s not run (%s)", name, task, small.reason)
                status[task] = small.line
                continue
            metrics_file, examples_file = self._run_task(name, task, x)
            metrics_files.append(metrics_file)
            other_files += [examples_file] if examples_file else []
            status[task] = TaskStatus.RAN
        kept = _still_valid(old_marker, folder, self.model_sha256)
        records.write_tasks(self.layout.eval_tasks(self.run, name), self.run, name, status, self.model_sha256,
                            getattr(ds, "subsample", None), files=metrics_files + other_files + kept)
        return metrics_files

    def _skip(self, name: str, task: str, plan: TaskPlan, status: dict[str, str]) -> list[Path]:
        """Record why ``task`` does not run on set ``name`` (tasks.json and / or its metrics file)."""
        log.info("%s: %s not run (%s)", name, task, plan.status.line)
        if plan.in_marker:
            status[task] = plan.status.line
        if not plan.metrics_file:
            return []
        return [records.write_skip(self.layout.metrics(self.run, task, name), self.run, name, task, plan.status)]

    def _run_task(self, name: str, task: str, x: SetInput) -> tuple[Path, Path | None]:
        """Run ``task`` on set ``name``: its metrics file and per-example file (None: it keeps none)."""
        log.info("%s: %s", name, task)
        result = adapter_of(task)(x)
        ds: EvalSet = x.ds
        record = {"run": self.run, "dataset": name, "task": task, "metrics": result.metrics, **result.sizes,
                  "features": result.features, "model_sha256": self.model_sha256, "source": ds.source,
                  "provenance": self.provenance}
        if TASKS[task].labels and getattr(ds, "subsample", None) is not None:
            record["subsample"] = ds.subsample  # the fixed probe subsample (datasets.subsample_set)
        examples = None
        if result.examples:
            examples = records.write_examples(self.layout.examples(self.run, task, name), result.examples)
        metrics_file = records.write_metrics(self.layout.metrics(self.run, task, name), record)
        self.tracker.log_metrics(metric_numbers(result.metrics, f"eval/{task}/{name}/"))
        if TASKS[task].figure:
            self.tracker.log_artifact(x.figure, f"figures/{name}")
        return metrics_file, examples


def task_params(ecfg: EvaluateConfig, run: str) -> dict[str, Any]:
    """The task settings a run's evaluation logs as MLflow params (each task's ``params``, from its section)."""
    return {key: value for task in TASKS.values() if task.params is not None
            for key, value in task.params(ecfg.sections.get(task.name), run).items()}


def run_evaluate(cfg: EvaluateProject, run: str, tasks: list[str] | None = None, datasets: list[str] | None = None,
                 targets: list[str] | None = None) -> list[Path]:
    """Evaluate ``run`` on the configured sets (``datasets``: some of them); returns the metrics files written.
    ``targets``: table targets (MLflow tags). The run's ``metrics.json`` is ``collect``'s, a stage of its own."""
    ecfg: EvaluateConfig = cfg.evaluate
    try:  # e.g. a run two patterns of the linear protocol's runs match stops here, before any run is scored
        warnings = ecfg.check_runs(cfg.run_names())
    except ValueError as err:
        raise ConfigError(f"{cfg.source}: {err}") from None
    for warning in warnings:  # an overlay without some experiment files leaves their patterns unmatched
        log.warning("%s of %s", warning, cfg.source)
    tasks, names = _requested(tasks, datasets, list(ecfg.datasets), cfg.source)
    params = {"evaluate": {"seed": ecfg.seed, **task_params(ecfg, run)}}
    layout = Layout.from_config(cfg)
    pretrained = cfg.run(run).pretrained
    extractor = _extractor(ecfg, pretrained, layout.model(run), run)
    written: list[Path] = []
    targets = cfg.run_targets(run) if targets is None else targets
    with evaluation_run(cfg.paths, run, extractor.model_sha256, targets) as tracker:
        tracker.log_params(params)
        if pretrained.enabled:  # what a trained run's MLflow run says of its training, this says of its checkpoint
            from protoclip.models.pretrained import source_label  # heavy: open_clip, only for a released checkpoint

            tracker.log_params({"pretrained": {"model": pretrained.model, "tag": pretrained.tag}})
            tracker.set_tags({"protoclip.pretrained": source_label(pretrained.model, pretrained.tag)})
        job = SetEvaluation(ecfg, layout, run, extractor, tracker)
        for name in names:
            written += job.evaluate(name, tasks)
    return written


def _extractor(ecfg: EvaluateConfig, pretrained: Any, model: Path, run: str):
    """The features of ``run``'s model: its ``model`` file, or the released checkpoint its ``pretrained`` section
    (train.config.PretrainedConfig) names (no training job: protoclip.models.pretrained); on the evaluation
    section's device, batch size, workers and chunk size."""
    from protoclip.evaluate.features import FeatureExtractor, PretrainedFeatures  # heavy: torch, not needed by collect

    sizes = (ecfg.device, ecfg.batch_size, ecfg.num_workers, ecfg.extract_chunk_batches)
    if pretrained.enabled:
        return PretrainedFeatures(pretrained.model, pretrained.tag, *sizes)
    return FeatureExtractor(require_path(model, f"evaluate run '{run}'"), *sizes)


# --------------------------------------------------------------------------- `protoclip evaluate`
def add_arguments(p, name: str) -> None:
    p.add_argument("--run", required=True)
    p.add_argument("--task", action="append", help="task(s) to run (default: every configured task)")
    p.add_argument("--dataset", action="append", help="data set(s) to run (default: every configured set)")


def main(args) -> int:
    """Take the run's GPU slots (before CUDA starts), then evaluate. The workflow runs one job per (run, set)
    (``--dataset``); an evaluation of every set (no ``--dataset``) also writes the run's ``metrics.json``, as the
    workflow's ``collect`` job does after its per-set jobs."""
    cfg = args.cfg
    with launch.place(cfg.gpus, launch.evaluate_gpus(cfg, args.run), who=f"evaluate {args.run}"):
        run_evaluate(cfg, args.run, tasks=args.task, datasets=args.dataset)
    if args.dataset is None:
        run_collect(cfg, args.run)
    return 0
