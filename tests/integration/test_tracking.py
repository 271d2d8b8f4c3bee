"""MLflow bookkeeping, read back through MlflowClient: a training from scratch is a new run (its new params show),
a resumed one continues its own, evaluate finds the run by the model's sha256, the experiment opens on the
training-runs view, and the report gets a run of its own with the tables as artifacts."""
from __future__ import annotations

from pathlib import Path

import pytest

from protoclip.project import load_config
from protoclip.files.hashing import sha256_file
from protoclip.files.layout import Layout
from protoclip.files.records import read_train_log
from testkit.training import TINY_CLIP_RUN, one_thread, tiny_project

_threads = pytest.fixture(autouse=True)(one_thread)

RUN = dict(TINY_CLIP_RUN)


def project(tmp_path: Path, lr: float) -> Path:
    """24 random PNGs (4 held out) and one CLIP run; rewriting it with another ``lr`` changes the run's config."""
    return tiny_project(tmp_path, {"paths": {"mlflow_experiment": "exp"}, "prepare": {"eval_sets": []},
                                   "train": RUN, "runs": {"clip": {"lr": lr}}}, n=24, heldout=4)


def client(cfg):
    import mlflow

    mlflow.set_tracking_uri(cfg.paths.mlflow_uri)
    return mlflow.tracking.MlflowClient()


def training_runs(cfg) -> list:
    c = client(cfg)
    exp = c.get_experiment_by_name(cfg.paths.mlflow_experiment)
    return c.search_runs([exp.experiment_id], "tags.`protoclip.kind` = 'train'", order_by=["attributes.start_time"])


def test_retrain_is_a_new_run_resume_continues_and_evaluate_finds_the_model(tmp_path):
    from protoclip.tracking import evaluation_run
    from protoclip.train.stage import run_train

    cfg = load_config(project(tmp_path, lr=1e-3))
    run_train(cfg, "clip", resume=True, targets=["table_V", "fig_7"])
    (first,) = training_runs(cfg)
    assert first.data.params["train.lr"] == "0.001" and first.info.run_name == "clip"
    assert first.data.tags["protoclip.target.table_V"] == "1" and first.data.tags["protoclip.targets"] == "fig_7,table_V"
    assert "episode/mean/loss" in first.data.metrics
    exp = client(cfg).get_experiment_by_name("exp")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"  # UI: training runs, not GenAI
    inputs = first.inputs.dataset_inputs
    assert len(inputs) == 1 and inputs[0].dataset.name == "manifest:offline:train"
    assert first.data.tags["protoclip.model_sha256"] == sha256_file(Layout.from_config(cfg).model("clip"))

    run_train(cfg, "clip", resume=True)  # same config, finished checkpoint: resumes its own MLflow run
    assert [r.info.run_id for r in training_runs(cfg)] == [first.info.run_id]

    cfg2 = load_config(project(tmp_path, lr=2e-3))  # trained again from scratch with another lr
    run_train(cfg2, "clip", resume=True)
    runs = training_runs(cfg2)
    assert len(runs) == 2 and runs[0].info.run_id == first.info.run_id
    assert runs[0].data.params["train.lr"] == "0.001" and runs[1].data.params["train.lr"] == "0.002"

    sha = sha256_file(Layout.from_config(cfg2).model("clip"))
    with evaluation_run(cfg2.paths, "clip", sha, cfg2.run_targets("clip")) as tracker:
        tracker.log_metrics({"eval/knn/x/top1": 0.5})
    assert tracker.run_id == runs[1].info.run_id  # the run that produced this model, not the first "clip"
    assert client(cfg2).get_run(runs[1].info.run_id).data.metrics["eval/knn/x/top1"] == 0.5


def test_training_curves_are_at_the_global_step_and_counters_are_no_metrics(tmp_path):
    """open_clip's curves: train/loss, each loss term, train/lr, train/logit_scale, train/grad_norm at every global
    step the log keeps (log_every_steps: 3, across the episode ends), the episode's numbers at the step count at its
    end, each value the train log's; episode, step, n_steps, epoch never metrics (the schedule is params)."""
    from protoclip.train.stage import run_train

    path = tiny_project(tmp_path, {"paths": {"mlflow_experiment": "exp"}, "prepare": {"eval_sets": []},
                                   "train": {**RUN, "log_every_steps": 3, "episode_size": 8, "batch_size": 4,
                                             "epochs": 2.0}, "runs": {"clip": {}}}, n=24, heldout=4)
    cfg = load_config(path)
    run_train(cfg, "clip")
    (run,) = training_runs(cfg)
    c, run_id = client(cfg), run.info.run_id
    log = Layout.from_config(cfg).train_log("clip")
    steps, episodes = read_train_log(log, "step"), read_train_log(log, "episode")
    assert len(steps) == 10 and len(episodes) == 5  # 2 x 20 pairs in episodes of 8 (the last 4), batches of 4

    def history(key):
        return [(m.step, m.value) for m in sorted(c.get_metric_history(run_id, key), key=lambda m: m.step)]

    assert history("train/loss") == [(r["step"], r["loss"]) for r in steps]
    assert [s for s, _ in history("train/loss")] == list(range(10))  # the global optimizer step, 0-based
    assert history("train/clip") == [(r["step"], r["clip"]) for r in steps]  # the method's loss term
    assert history("train/lr") == [(r["step"], r["lr"]) for r in steps]
    assert history("train/lr")[0][1] < history("train/lr")[1][1]  # the warm-up is visible step by step
    assert history("train/grad_norm") == [(r["step"], r["grad_norm"]) for r in steps]
    # exp(logit_scale) = 1 / tau: the logits' multiplier, CLIP's init 1 / 0.07
    assert [s for s, _ in history("train/logit_scale")] == list(range(10))
    assert history("train/logit_scale")[0][1] == pytest.approx(1 / 0.07, rel=1e-2)
    assert all(v == pytest.approx(1 / r["tau_clip"]) for (_, v), r in zip(history("train/logit_scale"), steps))
    # the episode's numbers at the step count at its end: 2, 4, 6, 8, 10
    assert history("episode/mean/loss") == [(r["step"], r["mean/loss"]) for r in episodes]
    assert [s for s, _ in history("episode/mean/loss")] == [2, 4, 6, 8, 10]
    assert "episode/time/train" in run.data.metrics
    counters = {"episode", "step", "n_steps", "k", "epoch", "train/epoch", "train/step", "train/episode",
                "episode/episode", "episode/step", "episode/n_steps", "episode/mean/epoch", "mean/loss"}
    assert not counters & run.data.metrics.keys()
    assert run.data.params["schedule.steps_per_episode"] == "2" and run.data.params["schedule.n_episodes"] == "5"
    # the optimizer and LR schedule keys are config params like the others; the steps trained a param of the schedule
    assert run.data.params["schedule.total_steps"] == "10" and run.data.params["train.optimizer"] == "adamw"
    assert (run.data.params["train.lr_schedule"], run.data.params["train.min_lr"]) == ("cosine", "0.0")
    assert run.data.params["train.steps"] == "None" and run.data.params["train.warmup_steps"] == "None"


def test_report_run_holds_tables_as_artifacts(tmp_path):
    from protoclip.tracking import log_report

    cfg = load_config(project(tmp_path, lr=1e-3))
    lay = Layout.from_config(cfg)
    lay.tables.mkdir(parents=True)
    (lay.tables / "index.md").write_text("# Results\n")
    (lay.tables / "knn.csv").write_text("dataset,clip\ndigits,0.5\n")
    run_id = log_report(cfg.paths)
    c = client(cfg)
    assert c.get_run(run_id).data.tags["protoclip.kind"] == "report"
    assert sorted(a.path for a in c.list_artifacts(run_id, "tables")) == ["tables/index.md", "tables/knn.csv"]
    assert log_report(cfg.paths) != run_id  # every report is its own run


def _open_store(uri: str) -> str:
    from types import SimpleNamespace

    from protoclip.tracking import _mlflow

    paths = SimpleNamespace(mlflow_uri=uri, mlflow_experiment="race")
    return _mlflow(paths).get_experiment_by_name("race").experiment_id


def test_parallel_jobs_open_a_fresh_sqlite_store_together(tmp_path):
    """Snakemake starts several jobs at once on a new results folder: each must get the one experiment."""
    import multiprocessing as mp

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with mp.get_context("spawn").Pool(3) as pool:
        ids = pool.map(_open_store, [uri] * 3)
    assert len(set(ids)) == 1


def test_a_job_waits_for_a_store_another_job_holds_locked(tmp_path):
    """On a busy machine one job's write can hold the SQLite store locked for longer than SQLite's 5 s default:
    a job opening the store then waits for it (make run failed there with "database is locked")."""
    import multiprocessing as mp
    import sqlite3
    import threading

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with mp.get_context("spawn").Pool(1) as pool:
        (first,) = pool.map(_open_store, [uri])  # the store and its tables, made by another job
    held = sqlite3.connect(tmp_path / "mlflow.db", isolation_level=None, check_same_thread=False)
    held.execute("BEGIN EXCLUSIVE")  # a writer that keeps the lock for 20 s
    release = threading.Timer(20.0, held.execute, ["COMMIT"])
    release.start()
    try:
        with mp.get_context("spawn").Pool(1) as pool:  # a fresh process: its store is opened, not cached
            assert pool.map(_open_store, [uri]) == [first]
    finally:
        release.join()
        held.close()


def test_a_dataset_another_job_inserted_first_is_linked_not_an_error(tmp_path, monkeypatch):
    """Two jobs log the same manifest at once: MLflow's store looks the dataset up, then inserts it, and the later
    insert breaks the unique (experiment, name, digest) key (seen in CI's DAG). The race made deterministic on a real
    SQLite store: the other job's insert lands between this job's lookup and its insert, once."""
    import mlflow
    import pandas as pd
    from mlflow.store.tracking.dbmodels.models import SqlDataset
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    from protoclip.tracking import MlflowTracker

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    mlflow.set_experiment("race")
    frame = pd.DataFrame({"id": ["a", "b"], "caption": ["x", "y"]})
    with mlflow.start_run() as other:
        other_id = other.info.run_id
    original, calls = SqlAlchemyStore._log_inputs_impl, []

    def raced(store, experiment_id, run_id, datasets=None, models=None):
        calls.append(run_id)
        if len(calls) == 1:  # the other job's insert wins; this job's insert of the same key then fails in the store's
            original(store, experiment_id, other_id, datasets, models)  # session wrapper, as in the race
            with store.ManagedSessionMaker(read_only=False) as session:
                row = session.query(SqlDataset).one()
                session.add(SqlDataset(**{c.name: getattr(row, c.name) for c in SqlDataset.__table__.columns
                                          if c.name != "dataset_uuid"}, dataset_uuid="this-job"))
        return original(store, experiment_id, run_id, datasets, models)

    monkeypatch.setattr(SqlAlchemyStore, "_log_inputs_impl", raced)
    with mlflow.start_run() as run:
        MlflowTracker(mlflow, run.info.run_id).log_dataset(frame, name="manifest:x:train", digest="d1")
    assert len(calls) == 2  # the duplicate key's error, then the retry
    for run_id in (other_id, run.info.run_id):  # both runs link the one dataset
        inputs = mlflow.get_run(run_id).inputs.dataset_inputs
        assert [(i.dataset.name, i.dataset.digest) for i in inputs] == [("manifest:x:train", "d1")]
