"""Where every stage reads and writes: the one place that knows the on-disk layout.

    data/raw/debs/*.deb                 pinned Debian packages (apt-get download)
    data/raw/unpacked/<package>/        dpkg-deb -x of each
    data/prepared/manifest.parquet      image-caption pairs: id, path, caption, source, label, sha256, split
    data/prepared/images/<source>/...   rendered RGB PNGs
    data/prepared/report.json           kept / dropped counts per source and reason
    data/prepared/eval/<name>.npz       offline labelled eval sets (images, labels, split, classnames)
    data/teacher/<teacher>.npz          PCA-reduced teacher features keyed by sample id (+ .json metadata)
    results/runs/<run>/                 config.yaml, train_log.jsonl, model.pt, checkpoints/ (last.pt, mlflow.json)
    results/runs/<run>/eval/<set>/      one evaluation job's outputs (a DVC out of stage evaluate_<run>_<set>):
        <task>.json                     metrics of one task (also logged to the run's MLflow run)
        features.npz                    cached evaluation features
        tsne.png                        t-SNE figure (when the task ran)
        tasks.json                      what each configured task did on this set (ran / skipped / not applicable);
                                        written last: the folder's completion marker (protoclip.completion)
    results/runs/<run>/metrics.json     all of a run's metrics in one file (`protoclip collect`)
    results/tables/, results/figures/   report outputs
"""
from __future__ import annotations

import re
from pathlib import Path


def safe_name(name: str) -> str:
    """A file-name-safe form of a model or teacher name ('sentence-transformers/x' -> 'sentence-transformers__x')."""
    return re.sub(r"[^A-Za-z0-9._-]+", "__", name).strip("_")


class Layout:
    def __init__(self, data_dir: str | Path = "data", results_dir: str | Path = "results"):
        self.data_dir = Path(data_dir)
        self.results_dir = Path(results_dir)

    @classmethod
    def from_config(cls, cfg) -> "Layout":
        return cls(cfg.paths.data_dir, cfg.paths.results_dir)

    # ---- data
    @property
    def debs(self) -> Path:
        return self.data_dir / "raw" / "debs"

    @property
    def unpacked(self) -> Path:
        return self.data_dir / "raw" / "unpacked"

    @property
    def prepared(self) -> Path:
        return self.data_dir / "prepared"

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
        return self.data_dir / "teacher" / f"{safe_name(teacher)}.npz"

    def teacher_meta(self, teacher: str) -> Path:
        return self.teacher_features(teacher).with_suffix(".json")

    # ---- results
    def run_dir(self, run: str) -> Path:
        return self.results_dir / "runs" / run

    def model(self, run: str) -> Path:
        return self.run_dir(run) / "model.pt"

    def checkpoint(self, run: str) -> Path:
        return self.run_dir(run) / "checkpoints" / "last.pt"

    def train_log(self, run: str) -> Path:
        return self.run_dir(run) / "train_log.jsonl"

    def mlflow_run_file(self, run: str) -> Path:
        """The MLflow run id of the training that wrote the checkpoint (kept beside it, resumed with it)."""
        return self.checkpoint(run).parent / "mlflow.json"

    def eval_dir(self, run: str, dataset: str) -> Path:
        """Everything one evaluation job (run, data set) writes."""
        return self.run_dir(run) / "eval" / dataset

    def features(self, run: str, dataset: str) -> Path:
        return self.eval_dir(run, dataset) / "features.npz"

    def tsne_figure(self, run: str, dataset: str) -> Path:
        return self.eval_dir(run, dataset) / "tsne.png"

    def eval_tasks(self, run: str, dataset: str) -> Path:
        return self.eval_dir(run, dataset) / "tasks.json"

    def metrics_summary(self, run: str) -> Path:
        """Every task x data set of a run in one JSON (the DVC metrics file and the Snakemake target)."""
        return self.run_dir(run) / "metrics.json"

    def metrics(self, run: str, task: str, dataset: str) -> Path:
        return self.eval_dir(run, dataset) / f"{task}.json"

    def metrics_files(self, run: str) -> list[tuple[str, str, Path]]:
        """``(task, dataset, path)`` of every metrics file of ``run`` on disk, sorted: only those that the
        completion marker of their folder vouches for; a folder without one (an evaluation killed half-way) or
        with a file changed since is a one-line ``IncompleteOutputError`` naming it (protoclip.completion)."""
        from protoclip.evaluate.config import TASKS

        from protoclip.completion import complete_files

        found = [p for folder in sorted(self.run_dir(run).glob("eval/*/")) if folder.is_dir()
                 for p in complete_files(folder, folder / "tasks.json")]
        found.sort(key=lambda p: (p.stem, p.parent.name))
        return [(p.stem, p.parent.name, p) for p in found if p.stem in TASKS]

    @property
    def tables(self) -> Path:
        return self.results_dir / "tables"

    @property
    def figures(self) -> Path:
        return self.results_dir / "figures"
