"""MLflow logging, kept out of the core modules: stages receive a :class:`Tracker` and call plain methods.

Which MLflow run a stage logs into (never found by name alone): docs/mlflow.md, "Which MLflow run a stage logs
into". Where the runs go (``paths.mlflow_uri``): a local SQLite file by default, which holds for the concurrent jobs
of one machine; on a cluster an MLflow tracking server, the jobs' credentials from MLflow's own environment
variables, never from the config (docs/mlflow.md, "MLflow on a cluster").
"""
from __future__ import annotations

import json
import logging
import math
import os
import re
import tempfile
import time
from contextlib import contextmanager
import fcntl
from pathlib import Path
from typing import Any, Callable, Iterator

from protoclip.files.layout import Layout, PathsConfig

log = logging.getLogger(__name__)
# the store's error when a concurrent job inserted the same dataset first (SQLite's and PostgreSQL's wording)
_DUPLICATE_DATASET = re.compile(r"UNIQUE constraint failed: datasets\.|duplicate key value violates unique "
                                r"constraint \S*datasets")

MODEL_ARTIFACTS = "model"  # artifact folder of a training run's weights, the source of its registered versions
REFERENCE_MODEL_TYPE = "protoclip-model-pt"  # model_type of the external LoggedModel a reference version points to
# MLflow 3 UI: experiments of this kind open on the runs table (mlflow/server/js: ExperimentKind enum)
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}


class Tracker:
    """No-op base: the interface the stages use. :class:`MlflowTracker` logs for real."""

    run_id: str | None = None

    def log_params(self, params: dict[str, Any]) -> None: ...

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None: ...

    def log_curves(self, rows: list[tuple[int, int, dict[str, float]]]) -> None:
        """Log many steps' metrics at once: ``rows`` of (step, timestamp in ms, {key: value})."""

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None: ...

    def set_tags(self, tags: dict[str, str]) -> None: ...

    def log_dataset(self, frame, name: str, digest: str | None = None, source: str | None = None,
                    context: str = "training") -> None: ...

    def log_model(self, folder: str | Path, name: str, tags: dict[str, str], description: str = "") -> str | None:
        """Log ``folder`` as the run's ``model`` artifacts and register them as a new version of model ``name``
        tagged ``tags``; returns the version (None: nothing logged)."""
        return None

    def register_reference(self, name: str, tags: dict[str, str], description: str = "") -> str | None:
        """Register a new version of model ``name`` tagged ``tags`` that holds no copy of the weights (they stay
        where ``tags`` say); returns the version (None: nothing registered)."""
        return None


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _finite(metrics: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of ``metrics`` (nested dicts flattened to ``a.b`` keys), as floats."""
    return {k: float(v) for k, v in _flatten(metrics).items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))}


def target_tags(targets: list[str] | None) -> dict[str, str]:
    """Tags marking the table / figure targets a run belongs to: ``protoclip.target.<t> = 1`` each (filter the
    runs table with ``tags.`protoclip.target.table_V` = '1'``) and ``protoclip.targets`` = the sorted list."""
    targets = sorted(set(targets or []))
    tags = {f"protoclip.target.{t}": "1" for t in targets}
    if targets:
        tags["protoclip.targets"] = ",".join(targets)
    return tags


class MlflowTracker(Tracker):
    def __init__(self, mlflow_module, run_id: str):
        self._mlflow = mlflow_module
        self.run_id = run_id
        self._client = mlflow_module.tracking.MlflowClient()

    def log_params(self, params: dict[str, Any]) -> None:
        flat = {k: str(v)[:6000] for k, v in _flatten(params).items()}
        existing = self._client.get_run(self.run_id).data.params
        changed = sorted(k for k, v in flat.items() if k in existing and existing[k] != v)
        if changed:  # params are immutable in MLflow: a resumed run keeps its config (the loop checks that)
            log.warning("MLflow run %s already has other values for %s: kept", self.run_id, ", ".join(changed[:5]))
        new = {k: v for k, v in flat.items() if k not in existing}
        if new:
            self._mlflow.log_params(new)

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        clean = _finite(metrics)
        if clean:
            self._mlflow.log_metrics(clean, step=step)

    def log_curves(self, rows: list[tuple[int, int, dict[str, float]]]) -> None:
        """One ``MlflowClient.log_batch`` call for all rows: it sends them in requests of up to 1000 values
        (MLflow's batch limit), so an episode of curves costs a few requests instead of one per step and key.
        Non-finite values are left out (an fp16 overflow step's gradient norm), as in :meth:`log_metrics`."""
        metric = self._mlflow.entities.Metric
        batch = [metric(key=k, value=v, timestamp=ts, step=step) for step, ts, m in rows
                 for k, v in _finite(m).items()]
        if batch:
            self._client.log_batch(self.run_id, metrics=batch)

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        if Path(path).is_dir():
            self._mlflow.log_artifacts(str(path), artifact_path=artifact_path)
        elif Path(path).exists():
            self._mlflow.log_artifact(str(path), artifact_path=artifact_path)

    def set_tags(self, tags: dict[str, str]) -> None:
        self._mlflow.set_tags(tags)

    def log_dataset(self, frame, name: str, digest: str | None = None, source: str | None = None,
                    context: str = "training") -> None:
        """``mlflow.log_input`` of a pandas frame (e.g. the run's manifest rows) under ``name``."""
        import mlflow.data  # heavy: mlflow, only when tracking is on

        ds = mlflow.data.from_pandas(frame, source=source, name=name, digest=digest)
        for attempt in range(3):
            try:
                self._mlflow.log_input(ds, context=context)
                return
            except self._mlflow.exceptions.MlflowException as e:
                # two jobs logging the same dataset (one manifest) at once: MLflow's store looks the dataset up,
                # then inserts it, so the later insert breaks the unique (experiment, name, digest) key; a retry
                # finds the row the other job wrote and only links this run to it
                if attempt == 2 or not _DUPLICATE_DATASET.search(str(e)):
                    raise
                time.sleep(0.2 * (attempt + 1))

    def log_model(self, folder: str | Path, name: str, tags: dict[str, str], description: str = "") -> str | None:
        """The folder as artifacts ``model/`` of this run, and a version of registered model ``name`` whose
        source is ``runs:/<run id>/model`` (so ``models:/<name>/<version>`` downloads that folder)."""
        self._mlflow.log_artifacts(str(folder), artifact_path=MODEL_ARTIFACTS)
        self._registered_model(name, description)
        version = self._client.create_model_version(name, f"runs:/{self.run_id}/{MODEL_ARTIFACTS}", run_id=self.run_id,
                                                    tags=tags, description=description or None)
        return str(version.version)

    def register_reference(self, name: str, tags: dict[str, str], description: str = "") -> str | None:
        """An MLflow external LoggedModel of this run (``mlflow.create_external_model``: its artifacts live outside
        MLflow, which stores only a small ``MLmodel`` stub marking it external), tagged ``tags``, registered as a
        version of model ``name`` whose source is ``models:/<model id>``: the version's page and tags are there,
        downloading it gives the stub, no weights."""
        experiment_id = self._client.get_run(self.run_id).info.experiment_id
        model = self._mlflow.create_external_model(name=logged_model_name(name), source_run_id=self.run_id,
                                                   tags=tags, model_type=REFERENCE_MODEL_TYPE,
                                                   experiment_id=experiment_id)
        self._registered_model(name, description)
        version = self._client.create_model_version(name, f"models:/{model.model_id}", run_id=self.run_id, tags=tags,
                                                    description=description or None, model_id=model.model_id)
        return str(version.version)

    def _registered_model(self, name: str, description: str) -> None:
        try:
            self._client.create_registered_model(name, description=description or None)
        except self._mlflow.exceptions.MlflowException as err:  # a retrained run: a new version of its model
            if err.error_code not in ("RESOURCE_ALREADY_EXISTS", "ALREADY_EXISTS"):
                raise


def logged_model_name(name: str) -> str:
    """``name`` as MLflow accepts it for a LoggedModel, which refuses ``/ : . % " '`` (a registered model's name
    may hold them: runs such as ``f7_clip_subset_0.5`` keep their own name there): each replaced by ``_``."""
    return re.sub(r"[/:.%\"']", "_", name)


@contextmanager
def _file_lock(path: Path | None) -> Iterator[None]:
    """An exclusive advisory lock on ``path`` (POSIX flock) for the block; no-op for None."""
    if path is None:
        yield
        return

    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _mlflow(paths: PathsConfig):
    """The configured mlflow module (tracking URI set, experiment created with its kind tag), or None."""
    try:
        import mlflow  # heavy: mlflow, only when tracking is on
    except ImportError:  # pragma: no cover - mlflow is a declared dependency
        log.warning("mlflow not importable: metrics are written to files only")
        return None
    uri = paths.mlflow_uri
    lock_path = artifacts = None
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///"):])
        db.parent.mkdir(parents=True, exist_ok=True)
        lock_path = db.with_name(db.name + ".lock")
        # MLflow's default artifact root of a database store is ./mlruns under the first job's working folder:
        # beside the database instead, so that a store's runs and their artifacts stay together
        artifacts = (db.parent.resolve() / "mlartifacts").as_uri()
    mlflow.set_tracking_uri(uri)
    # Parallel Snakemake jobs open a fresh SQLite store at the same moment; MLflow's schema creation is not safe
    # against that ("index ... already exists"), so the first connection and the experiment are made under a lock
    with _file_lock(lock_path):
        client = _client(mlflow, sqlite=lock_path is not None)
        exp = client.get_experiment_by_name(paths.mlflow_experiment)
        if exp is None:
            exp_id = _create_experiment(mlflow, client, paths.mlflow_experiment, artifacts)
        else:
            exp_id = exp.experiment_id
            for k, v in EXPERIMENT_KIND.items():
                if exp.tags.get(k) != v:
                    client.set_experiment_tag(exp_id, k, v)
    mlflow.set_experiment(experiment_id=exp_id)
    return mlflow


def _client(mlflow, sqlite: bool, wait_s: float = 300.0):
    """The MLflow client, its store opened. On SQLite, opening reads the schema on a connection of SQLite's default
    5 s busy timeout (MLflow's own sessions wait 20 s), so on a busy machine a job whose write holds the store
    longer stops this one with "database is locked": it is retried, with a warning, for up to ``wait_s``."""
    import sqlalchemy.exc  # heavy: sqlalchemy, only when tracking is on

    delay, end = 0.5, time.monotonic() + wait_s
    while True:
        try:
            return mlflow.tracking.MlflowClient()
        except sqlalchemy.exc.OperationalError as err:
            if not sqlite or "database is locked" not in str(err) or time.monotonic() > end:
                raise
            log.warning("the MLflow store %s is locked by another job: retrying in %.1f s", mlflow.get_tracking_uri(),
                        delay)
            time.sleep(delay)
            delay = min(2 * delay, 10.0)


def _create_experiment(mlflow, client, name: str, artifact_location: str | None = None) -> str:
    """Create the experiment, or take the one a concurrent job created first: a tracking server has no file lock,
    so the first jobs on a new server race to create it and all but one get RESOURCE_ALREADY_EXISTS.
    ``artifact_location``: None = the store's default (a tracking server's artifact root)."""
    try:
        return client.create_experiment(name, artifact_location=artifact_location, tags=EXPERIMENT_KIND)
    except mlflow.exceptions.MlflowException as err:
        exp = client.get_experiment_by_name(name) if err.error_code == "RESOURCE_ALREADY_EXISTS" else None
        if exp is None:
            raise
        return exp.experiment_id


def _exists(mlflow, run_id: str | None) -> bool:
    if not run_id:
        return False
    try:
        return mlflow.tracking.MlflowClient().get_run(run_id).info.lifecycle_stage == "active"
    except Exception:  # noqa: BLE001 - unknown id in this store (another machine's file)
        return False


@contextmanager
def _open(mlflow, run_id: str | None, run_name: str, tags: dict[str, str], system_metrics: bool = False
          ) -> Iterator[Tracker]:
    with mlflow.start_run(run_id=run_id, run_name=None if run_id else run_name,
                          log_system_metrics=system_metrics) as active:
        mlflow.set_tags(tags)
        yield MlflowTracker(mlflow, active.info.run_id)


def read_run_id(path: Path) -> str | None:
    try:
        return json.loads(Path(path).read_text()).get("run_id")
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def system_metrics(paths: PathsConfig) -> bool:
    """Whether a training run records MLflow's system metrics (``paths.mlflow_system_metrics``; they need psutil,
    GPU ones pynvml, which MLflow reports missing itself)."""
    if not paths.mlflow_system_metrics:
        return False
    try:
        import psutil  # optional: psutil, only for MLflow's system metrics  # noqa: F401
    except ImportError:
        log.warning("psutil is not installed: no MLflow system metrics (pip install psutil)")
        return False
    return True


@contextmanager
def training_run(paths: PathsConfig, run_name: str, resume_id_file: Path | None, targets: list[str]
                 ) -> Iterator[Tracker]:
    """A new MLflow run for a training from scratch (``resume_id_file`` None), or the MLflow run whose id
    ``resume_id_file`` holds (a resumed training; a new run if that id is unknown to this store), in the store
    ``paths`` names. ``targets``: the run's paper targets (tags; the config's ``run_targets(run)``)."""
    mlflow = _mlflow(paths)
    if mlflow is None:
        yield Tracker()
        return
    run_id = read_run_id(resume_id_file) if resume_id_file is not None else None
    if run_id and not _exists(mlflow, run_id):
        log.warning("MLflow run %s of %s is not in %s: logging into a new run", run_id, run_name,
                    paths.mlflow_uri)
        run_id = None
    tags = {"protoclip.run": run_name, "protoclip.kind": "train", **target_tags(targets)}
    with _open(mlflow, run_id, run_name, tags, system_metrics=system_metrics(paths)) as tracker:
        tracker.set_tags({"protoclip.stage.train": "started"})
        yield tracker
        tracker.set_tags({"protoclip.stage.train": "finished"})



# --------------------------------------------------------------------------- a training run's model version
def register_model(tracker: Tracker, mode: str | None, model_path: Path, run: str, tags: dict[str, str],
                   config_file: Path, export: Callable[[Path, Path], str]) -> str | None:
    """The run's model as a version of the MLflow model named after the run (``paths.mlflow_log_models``):
    ``copy`` holds one copy of the weights (:func:`log_model`), ``reference`` none (:func:`register_model_reference`),
    None nothing. ``config_file``: the config the run was trained from (named in a reference's description);
    ``export``: as for :func:`log_model`. Returns the version, None where nothing was registered."""
    if not tracker.run_id:
        return None
    if mode == "copy":
        return log_model(tracker, model_path, run, tags, export)
    if mode == "reference":
        return register_model_reference(tracker, model_path, run, tags, config_file=project_path(config_file))
    return None


def log_model(tracker: Tracker, model_path: Path, run: str, tags: dict[str, str],
              export: Callable[[Path, Path], str]) -> str | None:
    """One copy of the run's weights as the MLflow run's ``model`` artifacts, registered as a version of the model
    named after the run. ``export(model_path, folder)`` writes the version's files into ``folder`` and says what
    open_clip reads of them (``local-dir``, or ``no: <why>`` where the folder holds ``model.pt`` itself:
    :func:`protoclip.models.export_openclip.export_or_copy`). ``model.pt`` stays in the run's folder
    (``protoclip.model_sha256`` names it): a second copy would double the run's disk."""
    with tempfile.TemporaryDirectory(prefix=f"protoclip-model-{run}-") as tmp:
        folder = Path(tmp) / "model"
        open_clip = export(model_path, folder)
        version = tracker.log_model(folder, run, {**tags, "protoclip.run": run, "protoclip.open_clip": open_clip[:500]},
                                    description=f"protoclip training run '{run}': "
                                    + ("its open_clip export (open_clip_config.json, open_clip_model.safetensors)"
                                       if open_clip == "local-dir" else "model.pt"))
    if version is not None:
        log.info("run %s: model registered in MLflow as models:/%s/%s", run, run, version)
    return version


def register_model_reference(tracker: Tracker, model_path: Path, run: str, tags: dict[str, str],
                             config_file: str = "config/config.yaml") -> str | None:
    """A version of the model named after the run that holds no copy of the weights (``paths.mlflow_log_models:
    reference``): its tags ``protoclip.model_path`` (``model.pt`` relative to the project) and
    ``protoclip.model_sha256`` name the file, and its description says so and how to get the open_clip form."""
    path = project_path(model_path)
    export = f"protoclip export --config {config_file} --run {run}"
    version = tracker.register_reference(
        run, {**tags, "protoclip.run": run, "protoclip.model_path": path, "protoclip.open_clip": export},
        description=f"protoclip training run '{run}': no files in MLflow; the weights are {path} (sha256 "
                    f"{tags.get('protoclip.model_sha256', '?')}); `{export}` writes their open_clip form where "
                    "open_clip can represent the model")
    if version is not None:
        log.info("run %s: model registered in MLflow as models:/%s/%s (a reference to %s, no copy)", run, run,
                 version, path)
    return version


def project_path(path: Path) -> str:
    """``path`` as the project names it: relative to the working folder (the project's root, where the stages run)
    when it lies below it, else absolute; POSIX separators."""
    absolute = Path(os.path.abspath(path))
    try:
        return absolute.relative_to(Path.cwd()).as_posix()
    except ValueError:
        return absolute.as_posix()


@contextmanager
def evaluation_run(paths: PathsConfig, run_name: str, model_sha256: str, targets: list[str]) -> Iterator[Tracker]:
    """The MLflow run that produced the model with this sha256 (tag ``protoclip.model_sha256``), else a new
    run carrying that tag (e.g. a model restored by ``dvc pull`` into a fresh tracking store). ``paths``,
    ``targets``: as for :func:`training_run`."""
    mlflow = _mlflow(paths)
    if mlflow is None:
        yield Tracker()
        return
    found = mlflow.search_runs(filter_string=f"tags.`protoclip.model_sha256` = '{model_sha256}' and "
                                             f"tags.`protoclip.run` = '{run_name}'",
                               max_results=1, order_by=["start_time DESC"], output_format="list")
    run_id = found[0].info.run_id if found else None
    tags = {"protoclip.run": run_name, "protoclip.model_sha256": model_sha256, **target_tags(targets)}
    if run_id is None:
        tags["protoclip.kind"] = "evaluate"  # the training that made this model logged elsewhere
    with _open(mlflow, run_id, run_name, tags) as tracker:
        yield tracker


@contextmanager
def report_run(paths: PathsConfig, name: str = "report", kind: str = "report") -> Iterator[Tracker]:
    """A new MLflow run holding one report's tables and figures as artifacts (``kind``: its protoclip.kind tag)."""
    mlflow = _mlflow(paths)
    if mlflow is None:
        yield Tracker()
        return
    with _open(mlflow, None, name, {"protoclip.kind": kind}) as tracker:
        yield tracker


@contextmanager
def claims_run(paths: PathsConfig) -> Iterator[Tracker]:
    """A new ``claims`` MLflow run (tag ``protoclip.kind = claims``): the claims ledger's summary, a tag per claim
    (protoclip.report.ledger_table.log_ledger). In the UI: search ``tags.protoclip.kind = 'claims'``."""
    with report_run(paths, name="claims", kind="claims") as tracker:
        yield tracker


def log_report(paths: PathsConfig) -> str | None:
    """Log ``results/tables`` and ``results/figures`` as artifacts of a new ``report`` run; returns its id."""
    layout = Layout.from_paths(paths)
    with report_run(paths) as tracker:
        for folder in (layout.tables, layout.figures):
            if folder.is_dir():
                tracker.log_artifact(folder, folder.name)
        return tracker.run_id
