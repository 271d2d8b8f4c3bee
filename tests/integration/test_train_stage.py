"""`run_train` on a fixture project (64 random PNGs + captions, a random teacher cache): outputs and errors."""
from __future__ import annotations

import math

import pytest
import yaml

from protoclip.project import load_config
from protoclip.data.loading.manifest import to_frame, write_manifest
from protoclip.errors import ConfigError
from protoclip.files.layout import Layout
from protoclip.files.records import read_train_log
from protoclip.data.loading.training_set import resolve_sources
from protoclip.train.stage import run_train
from testkit.handoffs import WatchedConfig, protocol_members, spy_handoffs
from testkit.training import one_thread
from testkit.training import stage_project as _project

_threads = pytest.fixture(autouse=True)(one_thread)


def test_run_train_protoclip_writes_outputs_and_mlflow(tmp_path):
    cfg = load_config(_project(tmp_path))
    out = run_train(cfg, "proto")
    layout = Layout.from_config(cfg)
    assert out == layout.model("proto") and out.exists()
    from protoclip.models import load_model

    model, saved_cfg = load_model(out)
    assert saved_cfg["method"] == "protoclip" and saved_cfg["teacher"] == "toy-teacher"
    assert yaml.safe_load((layout.run_dir("proto") / "config.yaml").read_text())["episode_size"] == 32
    steps = read_train_log(layout.train_log("proto"), "step")
    assert len(steps) == 4  # 36 train pairs (4 held out), m = 32: ceil(36/32) = 2 episodes x 32/16 steps
    assert all(math.isfinite(s["proto_external"]) for s in steps)
    import mlflow

    mlflow.set_tracking_uri(cfg.paths.mlflow_uri)
    runs = mlflow.search_runs(experiment_names=["test"], output_format="list")
    assert len(runs) == 1 and runs[0].data.tags["protoclip.run"] == "proto"
    assert runs[0].data.params["train.method"] == "protoclip"
    metrics, params = runs[0].data.metrics, runs[0].data.params
    assert "episode/mean/proto" in metrics and "episode/kmeans_image_objective" in metrics
    # per step: the prototype loss and temperature beside CLIP's; K (m / images_per_prototype = 32 / 4) a param
    assert {"train/proto", "train/tau_proto", "train/proto_logit_scale", "train/logit_scale"} <= metrics.keys()
    assert params["episode.k"] == "8" and "k" not in metrics and "episode/k" not in metrics


def test_missing_teacher_cache_names_path_and_command(tmp_path):
    cfg = load_config(_project(tmp_path, teacher=False))
    with pytest.raises(ConfigError, match=r"toy-teacher\.npz.*protoclip teacher"):
        run_train(cfg, "proto")


def test_resolve_sources_expands_offline(tmp_path):
    cfg = load_config(_project(tmp_path, teacher=False))
    tcfg = cfg.run("clip")
    assert resolve_sources(tcfg.data, cfg.prepare.offline_sources) == ["tuxpaint"]  # default data: ['offline']


def test_empty_manifest_given_to_train_is_one_line_exit_2(tmp_path, capsys):
    from protoclip.cli import main

    path = _project(tmp_path, teacher=False)
    layout = Layout.from_config(load_config(path))
    write_manifest(to_frame([]), layout.manifest)  # e.g. every user row was dropped by prepare
    assert main(["train", "--config", str(path), "--run", "clip"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("protoclip train:")]  # not MLflow's
    assert len(err) == 1 and str(layout.manifest) in err[0] and "no pairs" in err[0] and "Traceback" not in err[0]
    assert not layout.model("clip").exists()


def test_the_stage_reads_the_sections_of_its_protocol_and_hands_on_no_project_config(tmp_path, monkeypatch):
    """run_train reads of the project config only what TrainProject names (the run, paths, prepare's offline
    sources, the evaluation sets, the source file, the targets), and none of its parts receives the config:
    the data set, the validator, the loop, the MLflow run and the model's version get their own values."""
    import protoclip.train.stage as stage

    watched = WatchedConfig(load_config(_project(tmp_path, teacher=False)))
    handed = spy_handoffs(monkeypatch, stage, ["training_pairs", "build_validator", "train", "register_model",
                                                   "training_run"],
                          watched)
    assert run_train(watched, "clip").exists()
    members = protocol_members(stage.TrainProject)
    assert watched.read and watched.read <= members, watched.read - members
    assert handed == []
