"""Training on bad input, broken files and kills: one line and exit 2 instead of a
traceback, nothing stale left beside a new config, no temp files of killed writes in a run folder.

Each test builds its own tiny project (12 random PNGs + captions, tiny-rn) or calls the trainer on in-memory
pairs; the stage-level cases fail before any training step, so they take about a second each.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from protoclip.project import load_config
from protoclip.errors import ConfigError
from protoclip.files.layout import Layout
from protoclip.files.records import read_train_log
from protoclip.tracking import Tracker
from protoclip.config.strict import to_dict
from protoclip.train.checkpoint import CheckpointError, resume_key, resume_point, save_checkpoint
from protoclip.train.distributed import DistInfo
from protoclip.train.episode import rank_positions
from protoclip.train.loop import train
from protoclip.train.methods.clip import CLIPMethod
from protoclip.train.schedule import trained_batches_per_episode
from testkit import REPO
from testkit.training import RandomPairs, one_thread, tiny_config, tiny_model, tiny_project

_threads = pytest.fixture(autouse=True)(one_thread)

RUN = {"model": "tiny-rn", "head_hidden": 32, "head_out": 16, "epochs": 1.0, "episode_size": 8, "batch_size": 4,
       "warmup_episodes": 1, "lock_image_epoch": None, "num_workers": 0, "device": "cpu", "precision": "fp32",
       "kmeans": {"backend": "torch", "images_per_prototype": 2, "iters": 3}}


MLFLOW_URI = ""  # one SQLite store for the module (creating its schema takes seconds), set by _mlflow_store


@pytest.fixture(autouse=True, scope="module")
def _mlflow_store(tmp_path_factory):
    global MLFLOW_URI
    MLFLOW_URI = f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/mlflow.db"
    yield


def _project(tmp_path: Path, **train) -> Path:
    """12 train pairs of one source; runs 'clip' and 'proto' (teacher 'toy-teacher', whose cache is absent)."""
    return tiny_project(tmp_path, {"paths": {"mlflow_uri": MLFLOW_URI}, "train": {**RUN, **train},
                                   "runs": {"clip": {"method": "clip", "teacher": None},
                                            "proto": {"method": "protoclip", "teacher": "toy-teacher"}}}, n=12)


def _cli(path: Path, capsys, *extra: str) -> tuple[int, list[str], str]:
    """``protoclip train --run clip`` in-process: exit code, its own stderr lines, the whole stderr."""
    from protoclip.cli import main

    code = main(["train", "--config", str(path), "--run", "clip", *extra])
    err = capsys.readouterr().err
    return code, [ln for ln in err.splitlines() if ln.startswith("protoclip train:")], err


def _small_checkpoint(path: Path, config_key: dict) -> Path:
    """A real (small) training checkpoint: a linear model and its SGD state, written by save_checkpoint."""
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return save_checkpoint(path, model=model, optimizer=opt, episode=1, step=2, extra={"config": config_key})


# ---------------------------------------------------------------- non-finite loss: one line, exit 2


def test_non_finite_loss_through_the_cli_is_one_line_exit_2(tmp_path, capsys, monkeypatch):
    real = CLIPMethod.terms

    def poisoned(self, model, out, positions, prototypes):
        terms = real(self, model, out, positions, prototypes)
        terms["clip"] = terms["clip"] * float("nan")
        return terms

    monkeypatch.setattr(CLIPMethod, "terms", poisoned)
    path = _project(tmp_path)
    code, lines, err = _cli(path, capsys)
    assert code == 2 and len(lines) == 1, err
    assert "training stopped" in lines[0] and "step 0 (episode 0)" in lines[0] and "'clip'" in lines[0]
    assert "no checkpoint was written yet" in lines[0] and "Traceback" not in err
    assert not Layout.from_config(load_config(path)).model("clip").exists()


def test_non_finite_features_for_kmeans_name_step_and_episode(tmp_path, monkeypatch):
    """Weights broken by the last update of an episode (no checkpoint due) reach the next episode's k-means:
    the stop names the step and episode like a loss stop, instead of k-means' own error."""
    from protoclip.prototypes.episode import NonFiniteFeaturesError
    from protoclip.train.loop import NonFiniteLossError
    from protoclip.train.methods.protoclip import ProtoCLIPMethod

    def broken(self, model, data, episode):
        raise NonFiniteFeaturesError(f"episode {episode}: image features for k-means hold NaN/Inf in 1 of 8 rows")

    monkeypatch.setattr(ProtoCLIPMethod, "begin_episode", broken)
    cfg = tiny_config(epochs=1.0, episode_size=8, batch_size=4)
    with pytest.raises(NonFiniteLossError, match=r"non-finite features at step 0 \(episode 0\): episode 0: image"):
        train(tiny_model(cfg), RandomPairs(n=8), cfg, Layout(tmp_path / "d", tmp_path / "r").train_files("f"))


# ---------------------------------------------------------------- configs that would train nothing


def _naive_trained_batches(m: int, batch: int, world: int) -> int:
    """Batches of >= 2 items each rank's DataLoader yields over its share of an episode (rank_positions)."""
    counts = set()
    for rank in range(world):
        share = len(rank_positions(m, DistInfo(rank, world)))
        sizes = [min(batch, share - i) for i in range(0, share, batch)]
        counts.add(sum(s >= 2 for s in sizes))
    assert len(counts) == 1  # every rank steps equally often (DDP would hang otherwise)
    return counts.pop()


def test_trained_batches_per_episode_matches_a_naive_count():
    for m in range(1, 15):
        for batch in range(1, 6):
            for world in range(1, 4):
                assert trained_batches_per_episode(m, batch, world) == _naive_trained_batches(m, batch, world), \
                    (m, batch, world)


@pytest.mark.parametrize("overrides, n, match", [
    ({"batch_size": 1}, 8, r"batch_size 1 and episode_size 8 over 1 process"),
    ({"episode_size": 1}, 8, r"batch_size 4 and episode_size 1 over 1 process"),
    ({}, 1, r"episode_size 1 \(capped at the 1 training pairs\)"),  # a data set of one pair
])
def test_configs_without_an_optimizer_step_stop_before_training(tmp_path, overrides, n, match):
    cfg = tiny_config(method="clip", epochs=1.0, **{"episode_size": 8, "batch_size": 4, **overrides})
    layout = Layout(tmp_path / "d", tmp_path / "r")
    with pytest.raises(ConfigError, match=match):
        train(tiny_model(cfg), RandomPairs(n=n), cfg, layout.train_files("z"))
    assert not layout.checkpoint("z").exists() and not layout.train_log("z").exists()


def test_batch_size_1_through_the_cli_is_one_line_exit_2_and_writes_no_model(tmp_path, capsys):
    path = _project(tmp_path, batch_size=1)
    code, lines, err = _cli(path, capsys)
    assert code == 2 and len(lines) == 1 and "no optimizer step" in lines[0] and "Traceback" not in err
    assert not Layout.from_config(load_config(path)).model("clip").exists()


# ---------------------------------------------------------------- a retrain from scratch


def _plant_old_outputs(layout: Layout, run: str, key: dict) -> list[Path]:
    """An earlier training's model, log and checkpoint (written with config ``key``)."""
    old = [layout.model(run), layout.train_log(run)]
    for p in old:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("old\n")
    return [*old, _small_checkpoint(layout.checkpoint(run), key)]


@pytest.mark.parametrize("resume", [True, False])
def test_a_failed_retrain_from_scratch_leaves_no_old_model(tmp_path, resume):
    """The old run's outputs go before the new run can fail (here: its teacher cache is missing), so evaluate
    never scores a model of another config. resume=True: the checkpoint was written with another config."""
    from protoclip.train.stage import run_train

    cfg = load_config(_project(tmp_path))
    layout = Layout.from_config(cfg)
    old = _plant_old_outputs(layout, "proto", {"lr": 123.0})
    layout.mlflow_run_file("proto").write_text('{"run_id": "old"}')
    with pytest.raises(ConfigError, match="teacher cache"):
        run_train(cfg, "proto", resume=resume)
    assert [p for p in old if p.exists()] == []
    assert "old" not in layout.mlflow_run_file("proto").read_text()  # the new MLflow run's id


@pytest.mark.parametrize("keep_finished", [True, False])
def test_a_resumable_checkpoint_is_kept_when_the_run_fails_before_training(tmp_path, keep_finished):
    """Also where finished runs' checkpoints are removed (the offline default): an unfinished run keeps its own."""
    import yaml

    from protoclip.train.stage import run_train

    path = _project(tmp_path)
    doc = yaml.safe_load(path.read_text())
    doc["paths"]["keep_finished_checkpoints"] = keep_finished
    path.write_text(yaml.safe_dump(doc))
    cfg = load_config(path)
    layout = Layout.from_config(cfg)
    old = _plant_old_outputs(layout, "proto", resume_key(to_dict(cfg.run("proto"))))
    with pytest.raises(ConfigError, match="teacher cache"):
        run_train(cfg, "proto", resume=True)
    assert [p for p in old if not p.exists()] == []


# ---------------------------------------------------------------- temp files of killed writes


def _killed_write(target: Path) -> Path:
    """Start an atomic write of ``target`` in a child process and kill it mid-write; returns the temp file."""
    code = ("import os, sys; from protoclip.files.atomic import atomic_path\n"
            "with atomic_path(sys.argv[1]) as tmp:\n    tmp.write_text('half'); os._exit(9)\n")
    src = REPO / "src"
    subprocess.run([sys.executable, "-c", code, str(target)], env={"PYTHONPATH": str(src)}, check=False)
    left = [p for p in target.parent.iterdir() if p.name.startswith(f".{target.name}.")]
    assert len(left) == 1 and not target.exists()
    return left[0]


def test_train_removes_the_temp_files_of_its_killed_writes_only(tmp_path):
    from protoclip.train.stage import run_train, train_outputs

    cfg = load_config(_project(tmp_path))
    layout = Layout.from_config(cfg)
    own = [_killed_write(p) for p in train_outputs(layout, "proto")]
    others = [_killed_write(layout.metrics("proto", "knn", "digits")), _killed_write(layout.metrics_summary("proto"))]
    lookalike = layout.run_dir("proto") / ".model.pt.notes.txt"
    lookalike.write_text("a user's file")
    with pytest.raises(ConfigError, match="teacher cache"):  # fails right after the stage's start
        run_train(cfg, "proto")
    assert [p for p in own if p.exists()] == []
    assert all(p.exists() for p in [*others, lookalike])  # evaluate's / collect's / not a temp name


# ---------------------------------------------------------------- a broken last.pt


def _broken(kind: str, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated":
        data = _small_checkpoint(path, {}).read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif kind == "foreign":  # e.g. an open_clip checkpoint put there
        torch.save({"epoch": 3, "state_dict": torch.nn.Linear(2, 2).state_dict()}, path)
    elif kind == "incomplete":  # our version tag, but not what a resume reads
        torch.save({"version": 1, "model": {}}, path)
    else:
        path.write_text("not a checkpoint\n")


@pytest.mark.parametrize("kind", ["empty", "truncated", "foreign", "incomplete", "text"])
def test_a_broken_checkpoint_is_one_error_naming_it(tmp_path, kind):
    path = tmp_path / "checkpoints" / "last.pt"
    _broken(kind, path)
    with pytest.raises(CheckpointError, match=rf"^{re.escape(str(path))}: .*delete it to train from scratch") as err:
        resume_point(path, {})
    assert "\n" not in str(err.value) and path.exists()  # one line; the file is left for the user to inspect


def test_a_broken_checkpoint_through_the_cli_is_one_line_exit_2(tmp_path, capsys):
    path = _project(tmp_path)
    ckpt = Layout.from_config(load_config(path)).checkpoint("clip")
    _broken("truncated", ckpt)
    code, lines, err = _cli(path, capsys, "--resume")
    assert code == 2 and len(lines) == 1 and str(ckpt) in lines[0] and "Traceback" not in err
    assert ckpt.exists()


def test_resume_point_accepts_only_its_own_config(tmp_path):
    path = _small_checkpoint(tmp_path / "last.pt", {"lr": 1.0})
    assert resume_point(path, {"lr": 1.0})["step"] == 2
    assert resume_point(path, {"lr": 2.0}) is None  # another config: train from scratch
    assert resume_point(tmp_path / "none.pt", {"lr": 1.0}) is None


# ---------------------------------------------------------------- the resolved world size


def test_world_size_and_batches_are_logged_and_saved_with_the_run(tmp_path):
    class Recorder(Tracker):
        def __init__(self):
            self.params = {}

        def log_params(self, params):
            self.params.update(params)

    cfg = tiny_config(method="clip", epochs=0.5, episode_size=8, batch_size=4)
    layout = Layout(tmp_path / "d", tmp_path / "r")
    rec = Recorder()
    train(tiny_model(cfg), RandomPairs(n=16), cfg, layout.train_files("w"), tracker=rec)
    start = read_train_log(layout.train_log("w"), "start")[0]["schedule"]
    assert (start["world_size"], start["per_rank_batch"], start["global_batch"]) == (1, 4, 4)
    assert rec.params["world"] == {"world_size": 1, "per_rank_batch": 4, "global_batch": 4}


# ---------------------------------------------------------------- a broken manifest


@pytest.mark.parametrize("kind", ["empty", "truncated", "text"])
def test_a_broken_manifest_through_the_cli_is_one_line_exit_2(tmp_path, capsys, kind):
    """A manifest left empty or cut short (a full disk, a copy that stopped): one line naming the file and the stage
    that writes it, before any training; the file is left as it is."""
    path = _project(tmp_path)
    manifest = Layout.from_config(load_config(path)).manifest
    data = manifest.read_bytes()
    manifest.write_bytes({"empty": b"", "truncated": data[: len(data) * 2 // 3], "text": b"id,path\n"}[kind])
    code, lines, err = _cli(path, capsys)
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert str(manifest) in lines[0] and "protoclip prepare" in lines[0] and "not a readable manifest" in lines[0]
    assert (" (0 bytes)" in lines[0]) == (kind == "empty")
    assert manifest.stat().st_size == {"empty": 0, "truncated": len(data) * 2 // 3, "text": 8}[kind]
