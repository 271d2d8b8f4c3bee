"""Where every stage reads and writes: the one place that knows the on-disk layout (no path is built elsewhere).

It imports nothing of the project, so every layer may use it. The tree of files: docs/config.md, "Where every file
lives"; their formats: :mod:`protoclip.files.records`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable
from urllib.parse import urlsplit


def safe_name(name: str) -> str:
    """A file-name-safe form of a model or teacher name ('sentence-transformers/x' -> 'sentence-transformers__x')."""
    return re.sub(r"[^A-Za-z0-9._-]+", "__", name).strip("_")


@dataclass(frozen=True)
class TrainFiles:
    """The files one training run writes, as the trainer (protoclip.train.loop) needs them: no layout, paths only.

    ``log`` is the workflow's output; ``log_work`` the same records kept beside the checkpoint, which a
    scheduler that deletes a failed job's outputs (Snakemake does) leaves in place for the resume.
    """

    config: Path  # config.yaml
    log: Path  # train_log.jsonl
    log_work: Path  # checkpoints/train_log.jsonl
    checkpoint: Path  # checkpoints/last.pt


@dataclass(frozen=True)
class ClaimsFiles:
    """The claims ledger's files by name (protoclip.report.ledger_table writes them): the tables
    ``tables/claims.{md,csv,tex,html}``, the numbers and verdicts for DVC's metrics ``tables/claims.json``, the
    forest plot ``figures/claims.png`` and its caption ``report/claims.rst``. Iterating gives them in that order
    (every one a workflow output)."""

    md: Path
    csv: Path
    tex: Path
    html: Path
    json: Path
    png: Path
    rst: Path

    def __iter__(self):
        return iter(tuple(getattr(self, f.name) for f in fields(self)))

    def artifacts(self) -> tuple[Path, ...]:
        """The files logged to MLflow with the claims run (the caption is the Snakemake report's only)."""
        return self.md, self.csv, self.tex, self.html, self.json, self.png


# The config's `paths:` section: where the stages read and write, and the MLflow store
@dataclass
class PathsConfig:
    data_dir: Path = Path("data")  # raw Debian packages, prepared data, teacher cache
    results_dir: Path = Path("results")  # runs, metrics, tables, figures
    # MLflow tracking store; a local SQLite file by default (open with `mlflow ui --backend-store-uri <this>`);
    # on a cluster a tracking server, http://host:port (docs/mlflow.md, "MLflow on a cluster")
    mlflow_uri: str = "sqlite:///results/mlflow.db"
    mlflow_experiment: str = "protoclip-repro"
    # each training run registered as a version of the MLflow model named after the run: copy (or true) logs one
    # copy of its weights (its open_clip export where open_clip can represent the model, else model.pt) as the
    # version's files; reference stores none (the version names model.pt by path and sha256); false registers nothing
    mlflow_log_models: bool | Literal["copy", "reference"] = True
    # MLflow's system metrics (CPU, memory, disk, network; GPU with nvidia-ml-py, the gpu extra) in training runs
    mlflow_system_metrics: bool = True
    # a finished run's checkpoints/last.pt (weights, optimizer moments, RNG: ~3x model.pt), its resume point; false
    # removes it once model.pt is written, for a project short of disk (model.pt and the logs stay)
    keep_finished_checkpoints: bool = True

    @property
    def mlflow_model_mode(self) -> Literal["copy", "reference"] | None:
        """How a training run's model goes to MLflow: ``mlflow_log_models`` with true read as 'copy', None for false."""
        if self.mlflow_log_models is True:
            return "copy"
        return self.mlflow_log_models or None

    def validate(self) -> None:
        # the config is a tracked file: credentials go to MLflow's own environment variables instead
        if urlsplit(self.mlflow_uri).password is not None:
            raise ValueError("mlflow_uri holds a password; give the URI alone and pass the credentials in the "
                             "jobs' environment: MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD")


@runtime_checkable
class HasPaths(Protocol):
    """Any config with a ``paths`` section (protoclip.project.ProjectConfig)."""

    @property
    def paths(self) -> PathsConfig: ...


class Layout:
    """Every path under ``paths.data_dir`` and ``paths.results_dir`` (the tree: docs/config.md, "Where every file
    lives")."""

    def __init__(self, data_dir: str | Path = "data", results_dir: str | Path = "results"):
        self.data_dir = Path(data_dir)
        self.results_dir = Path(results_dir)

    @classmethod
    def from_config(cls, cfg: HasPaths) -> "Layout":
        return cls.from_paths(cfg.paths)

    @classmethod
    def from_paths(cls, paths: PathsConfig) -> "Layout":
        """The layout of a ``paths:`` section alone (a part handed that section, not the whole config)."""
        return cls(paths.data_dir, paths.results_dir)

    # ---- data
    @property
    def debs(self) -> Path:
        return self.data_dir / "raw" / "debs"

    @property
    def unpacked(self) -> Path:
        return self.data_dir / "raw" / "unpacked"

    @property
    def deb_hashes(self) -> Path:
        """The sha256 recorded for each package that differed from its pin (protoclip.data.corpus.debs)."""
        return self.debs / "hashes.json"

    def deb(self, filename: str) -> Path:
        return self.debs / filename

    def unpacked_package(self, name: str) -> Path:
        return self.unpacked / name

    @property
    def prepared(self) -> Path:
        return self.data_dir / "prepared"

    @property
    def prepared_images(self) -> Path:
        """Root of the rendered offline images (a pair's image is ``<root>/<its id>.png``)."""
        return self.prepared / "images"

    def source_images(self, source: str) -> Path:
        return self.prepared_images / source

    @property
    def prepare_fingerprint(self) -> Path:
        return self.prepared / "fingerprint.json"

    @property
    def scratch(self) -> Path:
        """Where stages spill temporary files beside the data (large, and removed when the stage ends)."""
        return self.data_dir / "tmp"

    @property
    def prepare_scratch(self) -> Path:
        """Spill files of a running prepare (candidate pairs, de-duplication keys); removed when it ends."""
        return self.scratch / "prepare"

    @property
    def manifest(self) -> Path:
        return self.prepared / "manifest.parquet"

    @property
    def prepare_report(self) -> Path:
        return self.prepared / "report.json"

    def eval_set(self, name: str) -> Path:
        return self.prepared / "eval" / f"{name}.npz"

    def prepared_files(self, eval_sets: list[str]) -> dict[str, Path]:
        """What ``prepare`` writes and later stages read: the manifest, its report, one npz per offline eval set
        (the prepare stage's up-to-date check and the workflow's outputs / collect's deps)."""
        return {"manifest": self.manifest, "report": self.prepare_report,
                **{f"eval_{name}": self.eval_set(name) for name in eval_sets}}

    def teacher_features(self, teacher: str) -> Path:
        return self.teacher_cache(safe_name(teacher))

    def teacher_meta(self, teacher: str) -> Path:
        return self.teacher_cache_meta(safe_name(teacher))

    def teacher_cache(self, stem: str) -> Path:
        """The features file by its file stem (the workflow's ``{teacher}`` wildcard: a safe name)."""
        return self.data_dir / "teacher" / f"{stem}.npz"

    def teacher_cache_meta(self, stem: str) -> Path:
        return self.teacher_cache(stem).with_suffix(".json")

    def teacher_partial(self, name: str) -> Path:
        """A teacher run's work in progress (encoded chunks, fitted PCA), ``name`` saying which run it belongs to."""
        return self.data_dir / "teacher" / ".partial" / name

    # ---- results
    def run_dir(self, run: str) -> Path:
        return self.results_dir / "runs" / run

    def run_config(self, run: str) -> Path:
        """The complete training config the run was trained with (written at its start)."""
        return self.run_dir(run) / "config.yaml"

    def model(self, run: str) -> Path:
        return self.run_dir(run) / "model.pt"

    def checkpoint(self, run: str) -> Path:
        return self.run_dir(run) / "checkpoints" / "last.pt"

    def train_log(self, run: str) -> Path:
        return self.run_dir(run) / "train_log.jsonl"

    def train_log_work(self, run: str) -> Path:
        """The train log the checkpoint continues (``train_log.jsonl`` is published from it)."""
        return self.checkpoint(run).parent / "train_log.jsonl"

    def train_lock(self, run: str) -> Path:
        """Held (flock) by the process training the run, so that two never write it at once (protoclip.jobs.run_lock)."""
        return self.checkpoint(run).parent / "train.lock"

    def train_files(self, run: str) -> TrainFiles:
        return TrainFiles(self.run_config(run), self.train_log(run), self.train_log_work(run), self.checkpoint(run))

    def mlflow_run_file(self, run: str) -> Path:
        """The MLflow run id of the training that wrote the checkpoint (kept beside it, resumed with it)."""
        return self.checkpoint(run).parent / "mlflow.json"

    def eval_dir(self, run: str, dataset: str) -> Path:
        """Everything one evaluation job (run, data set) writes."""
        return self.run_dir(run) / "eval" / dataset

    def features(self, run: str, dataset: str) -> Path:
        """The set's cached evaluation features: outside the job's output folder (a rerun finds them)."""
        return self.run_dir(run) / "features" / f"{dataset}.npz"

    def eval_progress(self, run: str, dataset: str) -> Path:
        """An evaluation's feature extraction in progress (resumable chunks), beside the training checkpoints."""
        return self.checkpoint(run).parent / "eval" / dataset

    def tsne_figure(self, run: str, dataset: str) -> Path:
        return self.eval_dir(run, dataset) / "tsne.png"

    def eval_tasks(self, run: str, dataset: str) -> Path:
        return self.eval_dir(run, dataset) / "tasks.json"

    def metrics_summary(self, run: str) -> Path:
        """Every task x data set of a run in one JSON (the DVC metrics file and the Snakemake target)."""
        return self.run_dir(run) / "metrics.json"

    def metrics(self, run: str, task: str, dataset: str) -> Path:
        return self.eval_dir(run, dataset) / f"{task}.json"

    def examples(self, run: str, task: str, dataset: str) -> Path:
        """A task's per-example results beside its metrics file (protoclip.files.records.write_examples)."""
        return self.eval_dir(run, dataset) / f"{task}.examples.npz"

    @property
    def tables(self) -> Path:
        return self.results_dir / "tables"

    @property
    def figures(self) -> Path:
        return self.results_dir / "figures"

    @property
    def report_dir(self) -> Path:
        """The targets' captions (reStructuredText, read by ``snakemake --report``)."""
        return self.results_dir / "report"

    @property
    def report_index(self) -> Path:
        return self.tables / "index.md"

    def target_files(self, target_id: str, kind: str) -> list[Path]:
        """A paper target's files: a table's ``tables/<id>.{csv,md,tex,html}``, a figure's ``figures/<id>.png``."""
        if kind == "table":
            return [(self.tables / target_id).with_suffix(s) for s in (".csv", ".md", ".tex", ".html")]
        return [self.figures / f"{target_id}.png"]

    def claims_files(self) -> ClaimsFiles:
        """The claims ledger's files by name (:class:`ClaimsFiles`)."""
        table = self.tables / "claims"
        return ClaimsFiles(md=table.with_suffix(".md"), csv=table.with_suffix(".csv"), tex=table.with_suffix(".tex"),
                           html=table.with_suffix(".html"), json=table.with_suffix(".json"),
                           png=self.figures / "claims.png", rst=self.caption("claims"))

    @property
    def targets_long(self) -> Path:
        """Every target cell, ours and the paper's, one row each (protoclip report)."""
        return self.tables / "targets_long.csv"

    @property
    def metrics_long(self) -> Path:
        """Every run's headline value or skip line per (task, set), one row each (protoclip report)."""
        return self.tables / "metrics_long.csv"

    def task_table(self, task: str, suffix: str) -> Path:
        """The generic table of one evaluation task over every run: ``tables/<task>.{csv,md,tex}``."""
        return self.tables / f"{task}{suffix}"

    @property
    def train_losses(self) -> Path:
        """Every run's training loss per step (protoclip report)."""
        return self.tables / "train_loss.csv"

    @property
    def train_curves(self) -> Path:
        return self.figures / "train_curves.png"

    def toy_files(self) -> dict[str, Path]:
        """PAUC's NEMD toy experiment (protoclip toy-nemd): its figure, table (csv) and table (markdown)."""
        d = self.results_dir / "toy"
        return {"figure": d / "fig_pauc_toy.png", "csv": d / "pauc_toy.csv", "md": d / "pauc_toy.md"}

    def loss_curve(self, run: str) -> Path:
        """A run's training loss against step, as DVC plot data (protoclip.report.dvc_plots)."""
        return self.tables / "plots" / "train_loss" / f"{run}.csv"

    def target_plot_data(self, target_id: str) -> Path:
        """A paper table's numbers (ours, the paper's) as DVC plot data (protoclip.report.dvc_plots)."""
        return self.tables / "plots" / f"{target_id}.csv"

    def export_dir(self, run: str) -> Path:
        """A run exported as an open_clip ``local-dir:`` folder (protoclip.models.export_openclip)."""
        return self.results_dir / "export" / run

    def caption(self, target_id: str) -> Path:
        """A paper target's caption as reStructuredText (the Snakemake report's caption of its file)."""
        return self.report_dir / f"{target_id}.rst"
