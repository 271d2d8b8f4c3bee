"""`protoclip evaluate`: every configured task on every configured data set of one trained run.

    protoclip evaluate --config config/config.yaml --run protoclip_tiny_s0 [--task knn] [--dataset digits]
    protoclip collect  --config config/config.yaml --run protoclip_tiny_s0   # -> results/runs/<run>/metrics.json

For each data set of ``evaluate.datasets`` and each of its tasks that applies to it

=========== ============================================ ====================================================
task        features (paper section)                      metric function
=========== ============================================ ====================================================
zeroshot    z^I vs prompt-ensembled z^T (IV-C1, Table VI) metrics.zeroshot.zeroshot_classify
linear      z^I, not normalised (IV-C2, Table VII)        metrics.linear.linear_probe / sgd_linear_probe
knn         z^I, cosine, k=20, T=0.07 (IV-C3, Table VII)  metrics.knn.knn_classifier
retrieval   z^I vs z^T of captions (IV-C4, Table VIII)    metrics.retrieval.retrieval_recall
clustering  z^I of the test split (IV-G3, Table XII)      metrics.clustering.cluster_scores
nemd        h^I (and z^I) of the test split (PAUC)        metrics.nemd.nemd_report
tsne        z^I of the test split (Fig. 8)                metrics.embedding_plots.tsne_plot
temperature caption pairs, the run's similarity; token     metrics.temperature (temperature paper Fig. 1,
            subsets of a multi-token run's zero-shot      Fig. 8, Table 11; evaluate.temperature settings)
=========== ============================================ ====================================================

it writes ``results/runs/<run>/eval/<set>/<task>.json`` (metrics, run, dataset, task, sizes, feature kind,
provenance, and the probe subsample when ``max_train`` / ``max_test`` cut the set's splits) and, for the tasks
that score test examples (zero-shot, linear, kNN, retrieval), ``<task>.examples.npz``: each test image's hit or
each query's rank of its first match, from which those numbers are computed (the claims ledger's bootstrap
reads them, protoclip.records), logs the numbers
into the run's MLflow run as ``eval/<task>/<set>/<metric>``, draws t-SNE plots to
``results/runs/<run>/eval/<set>/tsne.png``, records what each task did in ``eval/<set>/tasks.json`` and prints
a summary table. ``tasks.json`` is written last and lists the sha256 of every metrics file of the folder: it is
the folder's completion marker (protoclip.completion), deleted (with the temp files of killed writes) when an
evaluation of the set starts, so ``collect`` and ``report`` never read a folder killed half-way as complete. The workflow runs one job per (run, set) (``--dataset``); ``protoclip collect`` (or an
evaluation of every set) gathers every metrics file of the run into ``results/runs/<run>/metrics.json``. A
task that does not apply to a set (retrieval without captions, zero-shot without templates, probes without a
train split) is not run. A set that is not configured or not found writes
``{"skipped": "skipped: <set> not found at <path>"}``
into each of its metrics files, so tables show why a cell is empty.
"""
from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from protoclip import completion, records
from protoclip.atomic import clean_stale_temps_of
from protoclip.errors import ConfigError
from protoclip.schema import require_path
from protoclip.evaluate.config import EvalDatasetConfig, EvaluateConfig
from protoclip.evaluate.datasets import (HELDOUT, CaptionSet, EvalSet, LabelledSet, Skipped, load_eval_set,
                                         missing_reason)
from protoclip.evaluate.datasets.wds import dataset_type as wds_dataset_type
from protoclip.layout import Layout
from protoclip.provenance import provenance
from protoclip.tasks import (HEADLINE, NOT_APPLICABLE, NOT_RUN, PROBE_TASKS, SKIPPED, TASKS, TEXT_TASKS,
                             check_tasks)
from protoclip.tracking import evaluation_run

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- applicability
def static_tasks(name: str, cfg: EvalDatasetConfig) -> list[str]:
    """The configured tasks that can apply to a set of this kind (used for sets that are skipped)."""
    retrieval_only = {"retrieval", "temperature"}
    if cfg.kind in ("coco", "flickr30k") or (cfg.kind == "wds" and cfg.path and wds_dataset_type(
            Path(cfg.path).expanduser()) == "retrieval"):
        possible = retrieval_only
    elif cfg.kind == "offline" and name == HELDOUT:
        possible = set(TASKS)  # coarse labels in words have prompt templates (datasets.HELDOUT_TEMPLATES)
    else:
        possible = set(TASKS) - {"retrieval"}
    return [t for t in cfg.tasks if t in possible]


def image_only_method(spec) -> str | None:
    """The training method of a model if it trained the image tower only (e.g. ``pcl``): its text tower is
    untrained, so zero-shot and retrieval numbers would be chance; None otherwise. ``spec``: the model file's
    ``protoclip.models.EvalSpec`` (written by the method at save time, not read from the project config)."""
    return (spec.method or "unknown method") if spec.image_only else None


def not_applicable(task: str, ds: EvalSet) -> str | None:
    """Why ``task`` does not apply to the loaded set ``ds`` (None: it applies)."""
    labelled = isinstance(ds, LabelledSet)
    if task == "retrieval":
        return None if isinstance(ds, CaptionSet) or (labelled and ds.captions is not None) else "no captions"
    if task == "temperature":  # caption pairs (Fig. 1, 8) and / or a zero-shot set (Table 11's token subsets)
        pairs = isinstance(ds, CaptionSet) or (labelled and ds.captions is not None)
        return None if pairs or (labelled and ds.templates and len(ds.test)) else "no captions or prompt templates"
    if not labelled:
        return "no class labels"
    if task == "zeroshot" and not ds.templates:
        return "no prompt templates"
    if task in ("linear", "knn") and ds.train is None:
        return "no train split"
    if len(ds.test) == 0:
        return "empty test split"
    return None


@dataclass(frozen=True)
class TaskPlan:
    """What one configured task does on one set, decided before any feature is extracted."""
    run: bool  # extract features and run it (it may still find the splits too small: :func:`too_small`)
    reason: str | None = None  # why not: the skip line
    metrics_file: bool = False  # the skip line goes into the task's metrics file (tables show it in its cells)
    status: bool = True  # the skip line goes into tasks.json


def plan_tasks(name: str, ds: EvalSet | Skipped | None, wanted: list[str], image_only: str | None
               ) -> dict[str, TaskPlan]:
    """Run or skip, per task of ``wanted`` on the loaded set ``ds``: the one place that decides it.

    A set whose data is missing (:class:`Skipped`): every task's metrics file and status carry its skip line; a
    probe of a set whose train split is missing (``LabelledSet.train_missing``): the same, with that reason.
    A text-tower task of an image-only run's (``image_only``: its method) that would apply to the set: a
    ``not applicable`` metrics file, so the report's cells read n/a (tasks.json does not list it). A task that
    does not apply to the set (:func:`not_applicable`): a ``not applicable`` status only.
    """
    out: dict[str, TaskPlan] = {}
    for task in wanted:
        if isinstance(ds, Skipped):
            out[task] = TaskPlan(False, ds.reason, metrics_file=True)
        elif task in PROBE_TASKS and isinstance(ds, LabelledSet) and ds.train is None and ds.train_missing:
            out[task] = TaskPlan(False, f"skipped: {name}: {ds.train_missing}", metrics_file=True)
        elif (reason := not_applicable(task, ds)) is not None:
            out[task] = TaskPlan(False, f"{NOT_APPLICABLE}{reason}")
        elif image_only and task in TEXT_TASKS:
            out[task] = TaskPlan(False, f"{NOT_APPLICABLE}image-only method ({image_only}), the text tower is "
                                 "untrained", metrics_file=True, status=False)
        else:
            out[task] = TaskPlan(True)
    return out


def too_small(task: str, feats: dict[str, np.ndarray]) -> str | None:
    """Why the extracted splits are too small for ``task`` (None: large enough)."""
    if "test_y" not in feats:
        return None
    counts = np.bincount(feats["test_y"])
    if task == "nemd" and (counts >= 2).sum() < 2:
        return "NEMD needs at least 2 classes with >= 2 test images"
    if task == "clustering" and (counts > 0).sum() < 2:
        return "clustering needs at least 2 classes in the test split"
    if task == "tsne" and len(feats["test_y"]) < 3:
        return "t-SNE needs at least 3 test images"
    if task in ("linear", "knn") and len(np.unique(feats["train_y"])) < 2:
        return "the train split has fewer than 2 classes"
    if task == "temperature":
        kind = str(feats.get("similarity", "cosine"))
        if kind not in ("cosine", "product_sphere"):  # nCLIP's -CE is no distance: Eq. 1 / Fig. 8 do not apply
            return f"the {kind} similarity is not a distance"
        tokens = int(feats["subspheres"]) if "subspheres" in feats else 1
        if "caption_image_z" not in feats and not (tokens > 1 and "test_s" in feats):
            return "no caption pairs, and a single-token run has no token subsets"
    return None


# --------------------------------------------------------------------------- tasks
@dataclass
class TaskResult:
    """What a task function returns: the metrics file's ``metrics``, what the task scored (``features``), the
    split sizes (top-level keys of the metrics file), and its per-example arrays (``<task>.examples.npz``,
    protoclip.records.write_examples; empty for a task the ledger cannot resample: NEMD, temperature, ...)."""
    metrics: dict[str, Any]
    features: str
    sizes: dict[str, int]
    examples: dict[str, np.ndarray] = field(default_factory=dict)


# each: (features, labelled set or caption set, evaluate config, figure path) -> TaskResult
TaskFunction = Callable[[dict, EvalSet, EvaluateConfig, Path], TaskResult]
TASK_FUNCS: dict[str, TaskFunction] = {}  # task name (protoclip.tasks) -> the function that runs it


def runs_task(name: str) -> Callable[[TaskFunction], TaskFunction]:
    """Decorator: the function runs evaluation task ``name`` (a name of :data:`protoclip.tasks.TASKS`)."""
    check_tasks([name])

    def deco(fn: TaskFunction) -> TaskFunction:
        TASK_FUNCS[name] = fn
        return fn

    return deco


def _sizes(f: dict[str, np.ndarray], train: bool = False) -> dict[str, int]:
    out = {"n_test": int(len(f["test_y"]))}
    if train:
        out["n_train"] = int(len(f["train_y"]))
    return out


def _with_labels(hits: dict[str, np.ndarray], f: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per-image hits plus the test labels they were scored against (runs are paired on the same images)."""
    return {**hits, "labels": np.asarray(f["test_y"])}


@runs_task("zeroshot")
def task_zeroshot(f: dict, ds: LabelledSet, cfg: EvaluateConfig, fig: Path) -> TaskResult:
    from protoclip.evaluate.metrics.zeroshot import zeroshot_classify

    if "test_s" in f:  # the method's own similarity as a dot product (evaluate.features.similarity_embeddings)
        m, hits = zeroshot_classify(f["test_s"], f["zeroshot_classifier_s"], f["test_y"], normalize=False,
                                    per_example=True)
        what = f"{str(f['similarity'])} similarity (image vs prompt-ensembled text)"
        if str(f["similarity"]) == "nclip_ce":  # spec 1.7.4: also the image-as-target score p_I . log p_T
            from protoclip.evaluate.features import nclip_image_as_target

            xi, wt = nclip_image_as_target(f["test_s"], f["zeroshot_classifier_s"])
            m["image_as_target"] = zeroshot_classify(xi, wt, f["test_y"], normalize=False)
    else:
        m, hits = zeroshot_classify(f["test_z"], f["zeroshot_classifier"], f["test_y"], per_example=True)
        what = "z_image (L2-normalised) vs prompt-ensembled z_text"
    m["n_classes"], m["n_templates"] = len(ds.classnames), len(ds.templates)
    return TaskResult(m, what, _sizes(f), _with_labels(hits, f))


@runs_task("linear")
def task_linear(f: dict, ds: LabelledSet, cfg: EvaluateConfig, fig: Path) -> TaskResult:
    from protoclip.evaluate.metrics.linear import linear_probe, sgd_linear_probe

    args = (f["train_z"], f["train_y"], f["test_z"], f["test_y"])
    if len(f["train_y"]) > cfg.linear_sgd_above:  # paper: SGD for ImageNet, L-BFGS for the small sets
        m, hits = sgd_linear_probe(*args, seed=cfg.seed, num_classes=len(ds.classnames), per_example=True)
        m["solver"] = "sgd"
    else:
        m, hits = linear_probe(*args, seed=cfg.seed, max_iter=cfg.linear_max_iter, center=cfg.linear_center,
                               per_example=True)
        m.update(solver="lbfgs", centred=cfg.linear_center)
    return TaskResult(m, "z_image (not normalised)", _sizes(f, train=True), _with_labels(hits, f))


@runs_task("knn")
def task_knn(f: dict, ds: LabelledSet, cfg: EvaluateConfig, fig: Path) -> TaskResult:
    from protoclip.evaluate.metrics.knn import knn_classifier

    m, hits = knn_classifier(f["train_z"], f["train_y"], f["test_z"], f["test_y"], k=cfg.knn_k,
                             T=cfg.knn_temperature, num_classes=len(ds.classnames), per_example=True)
    m["k"], m["T"] = cfg.knn_k, cfg.knn_temperature
    return TaskResult(m, "z_image (L2-normalised, cosine)", _sizes(f, train=True), _with_labels(hits, f))


@runs_task("retrieval")
def task_retrieval(f: dict, ds: EvalSet, cfg: EvaluateConfig, fig: Path) -> TaskResult:
    from protoclip.evaluate.metrics.retrieval import retrieval_recall

    if "caption_image_s" in f:  # the method's own similarity (evaluate.features.similarity_embeddings)
        m, ranks = retrieval_recall(f["caption_image_s"], f["caption_text_s"], f["caption_text_to_image"],
                                    normalize=False, per_example=True)
        what = f"{str(f['similarity'])} similarity"
    else:
        m, ranks = retrieval_recall(f["caption_image_z"], f["caption_text_z"], f["caption_text_to_image"],
                                    per_example=True)
        what = "z_image vs z_text (L2-normalised, dot product)"
    sizes = {"n_images": int(len(f["caption_image_z"])), "n_texts": int(len(f["caption_text_z"]))}
    return TaskResult(m, what, sizes, {**ranks, "text_to_image": np.asarray(f["caption_text_to_image"])})


@runs_task("clustering")
def task_clustering(f: dict, ds: LabelledSet, cfg: EvaluateConfig, fig: Path) -> TaskResult:
    from protoclip.evaluate.metrics.clustering import cluster_scores

    m, assign = cluster_scores(f["test_z"], f["test_y"], seed=cfg.seed, per_example=True)
    return TaskResult(m, "z_image (L2-normalised)", _sizes(f), _with_labels(assign, f))


@runs_task("nemd")
def task_nemd(f: dict, ds: LabelledSet, cfg: EvaluateConfig, fig: Path) -> TaskResult:
    from protoclip.evaluate.metrics.nemd import nemd_report

    # methods-spec 3.4: NEMD on h^I (the prototype space) and on z^I separately; h^I is the headline
    m = nemd_report(f["test_h"], f["test_y"], seed=cfg.seed, max_pairs=cfg.nemd_max_pairs)
    m["z_image"] = nemd_report(f["test_z"], f["test_y"], seed=cfg.seed, max_pairs=cfg.nemd_max_pairs)
    return TaskResult(m, "h_image (projection head g^I); z_image under 'z_image'", _sizes(f))


@runs_task("tsne")
def task_tsne(f: dict, ds: LabelledSet, cfg: EvaluateConfig, fig: Path) -> TaskResult:
    from protoclip.evaluate.metrics.embedding_plots import tsne_plot

    m = tsne_plot(f["test_z"], f["test_y"], ds.classnames, fig, seed=cfg.seed, max_points=cfg.tsne_max_points,
                  title=f"{ds.name}: t-SNE of z_image")
    m["figure"] = str(fig)
    return TaskResult(m, "z_image (L2-normalised)", _sizes(f))


@runs_task("temperature")
def task_temperature(f: dict, ds: EvalSet, cfg: EvaluateConfig, fig: Path) -> TaskResult:
    from protoclip.evaluate.metrics import temperature as tm

    t, kind = cfg.temperature, str(f.get("similarity", "cosine"))  # cosine / product_sphere (too_small)
    m: dict[str, Any] = {}
    sizes: dict[str, int] = {}
    what = []
    if "caption_image_z" in f:
        # one positive pair per image: its first caption; the run's similarity as a dot product
        t2i = np.asarray(f["caption_text_to_image"])
        images, first_text = np.unique(t2i, return_index=True)
        if kind == "cosine":
            img = f["caption_image_z"] / np.linalg.norm(f["caption_image_z"], axis=1, keepdims=True)
            txt = f["caption_text_z"] / np.linalg.norm(f["caption_text_z"], axis=1, keepdims=True)
        else:
            img, txt = f["caption_image_s"], f["caption_text_s"]
        img, txt = img[images], txt[first_text]
        from protoclip.devices import resolve_device

        m.update(tm.equilibrium_sweep(img, txt, t.scales(), t.batch_sizes, t.shuffle_shares, seed=cfg.seed,
                                      device=resolve_device(cfg.device)))
        m["histograms"] = tm.distance_histograms(img, txt, t.histogram_bins, t.histogram_max_points, seed=cfg.seed)
        sizes["n_pairs"] = int(len(images))
        what.append(f"caption pairs (first caption per image), {kind} similarity")
    tokens = int(f["subspheres"]) if "subspheres" in f else 1
    if kind == "product_sphere" and tokens > 1 and "test_s" in f:
        m["tokens"] = tokens
        m["token_subsets"] = tm.token_subset_zeroshot(f["test_s"], f["zeroshot_classifier_s"], f["test_y"], tokens,
                                                      t.token_subsets, t.token_draws, seed=cfg.seed)
        sizes["n_test"] = int(len(f["test_y"]))
        what.append(f"token subsets of the {tokens} tokens (zero-shot, prompt-averaged)")
    return TaskResult(m, "; ".join(what), sizes)


assert set(TASK_FUNCS) == set(TASKS), "every task of protoclip.tasks has its function here"


# --------------------------------------------------------------------------- summary
def summary_table(summary: dict[str, dict[str, Any]]) -> str:
    """Compact text table: one line per (set, task) with the headline number or the skip line."""
    rows = [("dataset", "task", "result")]
    cells = sorted(((ds, task, m) for task, per_set in summary.items() for ds, m in per_set.items()),
                   key=lambda c: (c[0], c[1]))
    for ds, task, m in cells:
        if (line := records.skip_line(m)) is not None:
            cell = line
        else:
            key = HEADLINE[task][0] if task in HEADLINE else ""
            value = m.get(key)
            cell = f"{key} = {value:.4g}" if isinstance(value, (int, float)) else "-"
        rows.append((ds, task, cell))
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    return "\n".join(f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]}" for r in rows)


def mlflow_key(key: str) -> str:
    """MLflow metric names allow only [A-Za-z0-9_-. :/]: 'R@1' -> 'R_at_1', anything else -> '_'."""
    return re.sub(r"[^A-Za-z0-9_\-. :/]", "_", key.replace("@", "_at_"))


def _numbers(metrics: dict[str, Any], prefix: str) -> dict[str, float]:
    """Numeric leaves of ``metrics`` as ``{prefix + key: value}`` (nested dicts joined with '/')."""
    out: dict[str, float] = {}
    for k, v in metrics.items():
        if isinstance(v, dict):
            out.update(_numbers(v, f"{prefix}{k}/"))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[mlflow_key(f"{prefix}{k}")] = float(v)
    return out


# --------------------------------------------------------------------------- stage
def _still_valid(old_marker: dict | None, folder: Path, model_sha256: str) -> list[Path]:
    """Metrics files (and their per-example files) of an earlier complete evaluation of this folder that stay
    valid beside this one's (an evaluation of some tasks only, ``--task``): intact since and of the same model."""
    intact = completion.vouched(old_marker, folder)
    keep = [folder / name for name in intact if name.endswith(".json")
            and completion.read_record(folder / name).get("model_sha256") == model_sha256]
    kept_tasks = {p.stem for p in keep}
    return keep + [folder / name for name in intact if name.endswith(".examples.npz")
                   and name.removesuffix(".examples.npz") in kept_tasks]


def run_collect(cfg, run: str) -> Path:
    """Gather every metrics file of ``run`` into ``results/runs/<run>/metrics.json`` and print the summary.

    A configured set with no evaluation folder because its data is missing (the workflow gives no job to a
    set whose path does not exist) appears as ``{"skipped": "skipped: <set> not found at <path>"}`` under each
    of its tasks. A set whose data exists but that no paper target of this run shows (so no job evaluated it)
    is simply absent.
    """
    layout = Layout.from_config(cfg)
    clean_stale_temps_of([layout.metrics_summary(run)])  # a killed collect's half-written metrics.json
    summary = records.run_results(layout, run)
    for name, ds_cfg in cfg.evaluate.datasets.items():
        reason = missing_reason(name, ds_cfg, layout)
        if not layout.eval_dir(run, name).is_dir() and reason is not None:
            for task in static_tasks(name, ds_cfg):
                summary.setdefault(task, {})[name] = {SKIPPED: reason}
    out = records.write_summary(layout.metrics_summary(run), summary)
    print(f"evaluate {run}:\n{summary_table(summary)}")
    return out


def _requested(cfg, tasks: list[str] | None, datasets: list[str] | None) -> tuple[list[str], list[str]]:
    """(tasks, data sets) of an evaluation request, checked against the task names and the configured sets."""
    tasks = list(tasks or TASKS)
    try:
        check_tasks(tasks)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    names = list(datasets or cfg.evaluate.datasets)
    bad = [d for d in names if d not in cfg.evaluate.datasets]
    if bad:
        raise ConfigError(f"{cfg.source}: data set '{bad[0]}' is not under evaluate.datasets "
                          f"(configured: {', '.join(cfg.evaluate.datasets) or 'none'})")
    return tasks, names


@dataclass
class SetEvaluation:
    """One run's evaluation on its sets: the model, what every set shares, and the one MLflow run."""
    ecfg: EvaluateConfig
    layout: Layout
    run: str
    extractor: Any  # protoclip.evaluate.features.FeatureExtractor of the run's model
    tracker: Any  # protoclip.tracking.Tracker
    provenance: dict = field(default_factory=dict)

    @property
    def model_sha256(self) -> str:
        return self.extractor.model_sha256

    def evaluate(self, name: str, tasks: list[str]) -> list[Path]:
        """Every task of ``tasks`` that applies to set ``name``; returns the metrics files written. The folder
        is incomplete (no tasks.json) from its start until the marker is written last."""
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
            if not plan.run:
                metrics_files += self._skip(name, task, plan, status)
        runnable = [task for task, plan in plans.items() if plan.run]
        feats = self.extractor.features(self.layout.features(self.run, name), ds,
                                        work=self.layout.eval_progress(self.run, name)) if runnable else {}
        for task in runnable:
            if (reason := too_small(task, feats)) is not None:
                log.warning("%s: %s not run (%s)", name, task, reason)
                status[task] = f"{NOT_RUN}{reason}"
                continue
            metrics_file, examples_file = self._run_task(name, task, feats, ds)
            metrics_files.append(metrics_file)
            other_files += [examples_file] if examples_file else []
            status[task] = "ran"
        kept = _still_valid(old_marker, folder, self.model_sha256)
        records.write_tasks(self.layout.eval_tasks(self.run, name), self.run, name, status, self.model_sha256,
                            getattr(ds, "subsample", None), files=metrics_files + other_files + kept)
        return metrics_files

    def _skip(self, name: str, task: str, plan: TaskPlan, status: dict[str, str]) -> list[Path]:
        """Record why ``task`` does not run on set ``name`` (tasks.json and / or its metrics file)."""
        log.info("%s: %s not run (%s)", name, task, plan.reason)
        if plan.status:
            status[task] = plan.reason
        if not plan.metrics_file:
            return []
        return [records.write_skip(self.layout.metrics(self.run, task, name), self.run, name, task, plan.reason)]

    def _run_task(self, name: str, task: str, feats: dict, ds: EvalSet) -> tuple[Path, Path | None]:
        """Run ``task`` on set ``name``: its metrics file and per-example file (None: it keeps none)."""
        fig = self.layout.tsne_figure(self.run, name)
        log.info("%s: %s", name, task)
        result = TASK_FUNCS[task](feats, ds, self.ecfg, fig)
        record = {"run": self.run, "dataset": name, "task": task, "metrics": result.metrics, **result.sizes,
                  "features": result.features, "model_sha256": self.model_sha256, "source": ds.source,
                  "provenance": self.provenance}
        if task != "retrieval" and getattr(ds, "subsample", None) is not None:
            record["subsample"] = ds.subsample  # the fixed probe subsample (datasets.subsample_set)
        examples = None
        if result.examples:
            examples = records.write_examples(self.layout.examples(self.run, task, name), result.examples)
        metrics_file = records.write_metrics(self.layout.metrics(self.run, task, name), record)
        self.tracker.log_metrics(_numbers(result.metrics, f"eval/{task}/{name}/"))
        if task == "tsne":
            self.tracker.log_artifact(fig, f"figures/{name}")
        return metrics_file, examples


def run_evaluate(cfg, run: str, tasks: list[str] | None = None, datasets: list[str] | None = None,
                 targets: list[str] | None = None) -> list[Path]:
    """Evaluate ``run`` on the configured sets; returns the metrics files written.

    Without ``datasets`` (every configured set) it also writes ``metrics.json`` (:func:`run_collect`); the
    workflow's per-set jobs leave that to its ``collect`` job. ``targets``: table targets (MLflow tags).
    """
    ecfg: EvaluateConfig = cfg.evaluate
    tasks, names = _requested(cfg, tasks, datasets)
    layout = Layout.from_config(cfg)
    model_path = require_path(layout.model(run), f"evaluate run '{run}'")
    from protoclip.evaluate.features import FeatureExtractor  # torch + open_clip: not needed by `collect`

    extractor = FeatureExtractor(model_path, ecfg.device, ecfg.batch_size, ecfg.num_workers, ecfg.extract_chunk_batches)
    written: list[Path] = []
    with evaluation_run(cfg, run, extractor.model_sha256, targets) as tracker:
        tracker.log_params({"evaluate": {"seed": ecfg.seed, "knn_k": ecfg.knn_k,
                                         "knn_temperature": ecfg.knn_temperature}})
        job = SetEvaluation(ecfg, layout, run, extractor, tracker, provenance(ecfg.seed))
        for name in names:
            written += job.evaluate(name, tasks)
        if datasets is None:
            written.append(run_collect(cfg, run))
            tracker.log_artifact(layout.metrics_summary(run), "metrics")
    return written
