"""MLflow logging, kept out of the core modules: stages receive a :class:`Tracker` and call plain methods.

One MLflow run per training run, found again by its ``protoclip.run`` tag, so that `evaluate` logs
its metrics into the same MLflow run that `train` created. A local SQLite store is the default
(``paths.mlflow_uri``); open the UI with ``mlflow ui --backend-store-uri sqlite:///results/mlflow.db``.
"""
from __future__ import annotations

import logging
import math
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

log = logging.getLogger(__name__)


class Tracker:
    """No-op base: the interface the stages use. :class:`MlflowTracker` logs for real."""

    def log_params(self, params: dict[str, Any]) -> None: ...

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None: ...

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None: ...

    def set_tags(self, tags: dict[str, str]) -> None: ...


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


class MlflowTracker(Tracker):
    def __init__(self, mlflow_module, run_id: str):
        self._mlflow = mlflow_module
        self.run_id = run_id
        self._client = mlflow_module.tracking.MlflowClient()

    def log_params(self, params: dict[str, Any]) -> None:
        flat = {k: str(v)[:6000] for k, v in _flatten(params).items()}
        existing = self._client.get_run(self.run_id).data.params
        new = {k: v for k, v in flat.items() if k not in existing}  # params are immutable in MLflow
        if new:
            self._mlflow.log_params(new)

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        clean = {k: float(v) for k, v in _flatten(metrics).items()
                 if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))}
        if clean:
            self._mlflow.log_metrics(clean, step=step)

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        self._mlflow.log_artifact(str(path), artifact_path=artifact_path)

    def set_tags(self, tags: dict[str, str]) -> None:
        self._mlflow.set_tags(tags)


@contextmanager
def tracked_run(cfg, run_name: str, stage: str) -> Iterator[Tracker]:
    """Open (or re-open) the MLflow run of ``run_name``; yields a no-op Tracker if MLflow is unusable."""
    try:
        import mlflow
    except ImportError:  # pragma: no cover - mlflow is a declared dependency
        log.warning("mlflow not importable: metrics are written to files only")
        yield Tracker()
        return
    uri = cfg.paths.mlflow_uri
    if uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(cfg.paths.mlflow_experiment)
    found = mlflow.search_runs(filter_string=f"tags.`protoclip.run` = '{run_name}'", max_results=1,
                               order_by=["start_time DESC"], output_format="list")
    run_id = found[0].info.run_id if found else None
    with mlflow.start_run(run_id=run_id, run_name=None if run_id else run_name) as active:
        mlflow.set_tags({"protoclip.run": run_name, f"protoclip.stage.{stage}": "started"})
        yield MlflowTracker(mlflow, active.info.run_id)
        mlflow.set_tags({f"protoclip.stage.{stage}": "finished"})
