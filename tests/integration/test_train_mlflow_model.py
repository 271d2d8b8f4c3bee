"""The train stage on a tiny project, read back through MLflow: the run carries its validation curve (the numbers
`protoclip evaluate` gives the final model), MLflow's system metrics, its weights and open_clip export as artifacts
and a registered model version tagged with its provenance, which open_clip loads and which computes what the
project's model computes (the one copy of the weights in MLflow: model.pt stays in the run's folder); validation leaves the training's weights as they are; the config switches turn the
model artifacts and system metrics off; in reference mode the version holds no copy of the weights, naming model.pt
by path and sha256 instead."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from protoclip.project import load_config
from protoclip.files.layout import Layout
from protoclip.files.records import read_train_log
from testkit.training import TINY_CLIP_RUN, one_thread, tiny_project

_threads = pytest.fixture(autouse=True)(one_thread)

RUN = {**TINY_CLIP_RUN, "epochs": 2.0}
LABELS = ["animals/cat", "food", "vehicles/car"]


def project(tmp_path, name: str = "config.yaml", paths: dict | None = None, relative: bool = False):
    """36 training and 12 held-out pairs under 3 coarse labels; run ``clip`` validates after every 2nd episode
    (zero-shot and kNN), run ``quiet`` is the same run without validation. ``relative``: paths relative to
    ``tmp_path`` (the test then works there)."""
    return tiny_project(tmp_path, {
        "paths": {"mlflow_experiment": "exp", **(paths or {})}, "prepare": {"eval_sets": []},
        "evaluate": {"datasets": {"heldout_pairs": {"kind": "offline"}}}, "train": RUN,
        "runs": {"clip": {"validation": {"every_episodes": 2, "tasks": ["zeroshot", "knn"]}},
                 "quiet": {"validation": {"every_episodes": 0}}}},
        config_name=name, n=48, heldout=12, size=32, labels=LABELS, relative=relative)


def store(cfg):
    import mlflow

    mlflow.set_tracking_uri(cfg.paths.mlflow_uri)
    return mlflow.tracking.MlflowClient()


def training_run(cfg, name: str):
    c = store(cfg)
    exp = c.get_experiment_by_name(cfg.paths.mlflow_experiment)
    (run,) = c.search_runs([exp.experiment_id], f"tags.`protoclip.run` = '{name}'")
    return run


def expected_provenance(layout: Layout, run: str) -> dict[str, str]:
    """The provenance tags computed here from the files: the resolved config's canonical JSON, the manifest's
    training rows (id and image sha256, one line each), the model file."""
    config = yaml.safe_load(layout.run_config(run).read_text())
    df = pd.read_parquet(layout.manifest)
    train = df[df["split"] == "train"]
    data = "\n".join(f"{i} {s}" for i, s in zip(train["id"], train["sha256"]))
    return {"protoclip.config_sha256": hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest(),
            "protoclip.data_digest": hashlib.sha256(data.encode()).hexdigest(),
            "protoclip.model_sha256": hashlib.sha256(layout.model(run).read_bytes()).hexdigest()}


def test_training_run_holds_curves_system_metrics_and_a_registered_model_open_clip_loads(tmp_path, monkeypatch):
    import mlflow
    import open_clip

    from protoclip.evaluate.stage import run_evaluate
    from protoclip.models import get_tokenizer, load_model
    from protoclip.files.provenance import git_commit
    from protoclip.train.stage import run_train

    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "1")  # MLflow's own knob (default 10 s)
    cfg = load_config(project(tmp_path))
    layout = Layout.from_config(cfg)
    run_train(cfg, "clip")
    run = training_run(cfg, "clip")
    c = store(cfg)

    # the validation curve: after episodes 1 and 3 (every 2nd) and 4 (the last of ceil(2 x 36 / 16) = 5), the log's
    # numbers as metrics at the global step of the episode's end (the optimizer steps done), the training curves' axis
    episodes = read_train_log(layout.train_log("clip"), kind="episode")
    assert [r["episode"] for r in episodes] == [0, 1, 2, 3, 4]
    validated = [r for r in episodes if "val/zeroshot/top1" in r]
    assert [r["episode"] for r in validated] == [1, 3, 4] and all("val/knn/top1" in r for r in validated)
    history = c.get_metric_history(run.info.run_id, "val/zeroshot/top1")
    assert [(m.step, m.value) for m in history] == [(r["step"], r["val/zeroshot/top1"]) for r in validated]
    assert "time/validation" in validated[0] and "val/zeroshot/n_classes" not in run.data.metrics
    assert "episode/time/validation" in run.data.metrics

    # ... the final one is what `protoclip evaluate` gives the saved model on the same held-out set
    run_evaluate(cfg, "clip", tasks=["zeroshot", "knn"], datasets=["heldout_pairs"])
    for task in ("zeroshot", "knn"):
        evaluated = json.loads((layout.eval_dir("clip", "heldout_pairs") / f"{task}.json").read_text())
        assert evaluated["metrics"]["top1"] == validated[-1][f"val/{task}/top1"], task

    # MLflow's system metrics, sampled while the run trained
    assert "system/cpu_utilization_percentage" in run.data.metrics
    assert "system/system_memory_usage_megabytes" in run.data.metrics

    # provenance on the run and on the registered version; the weights as the run's artifacts
    tags = {**expected_provenance(layout, "clip"), "protoclip.code_commit": git_commit()}
    assert {k: run.data.tags[k] for k in tags} == tags
    # one copy of the weights in MLflow: the open_clip export (model.pt stays in the run's folder only)
    assert sorted(a.path for a in c.list_artifacts(run.info.run_id, "model")) == [
        "model/open_clip_config.json", "model/open_clip_model.safetensors"]
    (version,) = c.search_model_versions("name = 'clip'")
    assert str(version.version) == "1" and version.run_id == run.info.run_id
    assert version.source == f"runs:/{run.info.run_id}/model"
    assert {k: version.tags[k] for k in tags} == tags and version.tags["protoclip.open_clip"] == "local-dir"

    # the registered version, downloaded by its models:/ URI, is an open_clip model computing what ours computes
    folder = mlflow.artifacts.download_artifacts("models:/clip/1", dst_path=str(tmp_path / "download"))
    from safetensors.torch import load_file

    # its weights are the CLIP part of the model.pt that protoclip.model_sha256 names, tensor for tensor
    saved = torch.load(layout.model("clip"), map_location="cpu", weights_only=False)["state_dict"]
    clip = {k[len("clip."):]: v for k, v in saved.items() if k.startswith("clip.")}
    exported = load_file(tmp_path / "download" / "open_clip_model.safetensors")
    assert exported.keys() == clip.keys() and all(torch.equal(exported[k], clip[k]) for k in clip)
    oc_model, _, _ = open_clip.create_model_and_transforms(f"local-dir:{folder}")
    oc_tokenizer = open_clip.get_tokenizer(f"local-dir:{folder}")
    ours, _ = load_model(layout.model("clip"))
    oc_model.eval()
    images = torch.rand(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    texts = ["a picture of a cat.", "food.", "a clip art of a car.", "an emoji of food."]
    with torch.no_grad():
        # the image tower: one network, one input, the same kernels, i.e. the same computation repeated
        assert torch.equal(oc_model.encode_image(images), ours.encode_image(images))
        # the text tower: ours drops the padding after the longest prompt (models.model.encode_text_trimmed), so
        # the matrix products run over other shapes: float32 rounding of 32-wide sums, ~1e-6 of the values' scale
        theirs = oc_model.encode_text(oc_tokenizer(texts))
        mine = ours.encode_text(get_tokenizer(ours.name, context_length=ours.context_length)(texts))
        assert torch.allclose(theirs, mine, rtol=0, atol=1e-5 * float(mine.abs().max()))
        assert torch.equal(oc_model.logit_scale, ours.clip.logit_scale)


def test_validation_leaves_the_weights_and_the_switches_turn_artifacts_system_metrics_and_checkpoints_off(tmp_path):
    from protoclip.train.stage import run_train

    on = load_config(project(tmp_path))
    run_train(on, "clip")
    off = load_config(project(tmp_path, "off.yaml", {"mlflow_log_models": False, "mlflow_system_metrics": False,
                                                     "keep_finished_checkpoints": False}))
    run_train(off, "quiet")
    layout = Layout.from_config(on)
    # a finished run keeps its checkpoint (its resume point) unless the switch removes it; the model stays
    assert layout.checkpoint("clip").is_file() and not layout.checkpoint("quiet").exists()
    assert layout.model("quiet").is_file() and layout.train_log("quiet").is_file()

    # validation runs in eval mode inside a forked RNG: the same weights as the run without it, bit for bit
    a, b = (torch.load(layout.model(r), map_location="cpu", weights_only=False)["state_dict"] for r in ("clip", "quiet"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    logs = [[{k: v for k, v in r.items() if not k.startswith(("time/", "val/"))}
             for r in read_train_log(layout.train_log(run), kind="episode")] for run in ("clip", "quiet")]
    assert logs[0] == logs[1]
    assert not any(k.startswith("val/") for r in read_train_log(layout.train_log("quiet")) for k in r)

    quiet = training_run(off, "quiet")
    c = store(off)
    assert c.list_artifacts(quiet.info.run_id, "model") == []
    assert c.search_model_versions("name = 'quiet'") == []
    assert not any(k.startswith("system/") for k in quiet.data.metrics)
    assert quiet.data.tags["protoclip.model_sha256"] == expected_provenance(layout, "quiet")["protoclip.model_sha256"]
    assert np.isfinite(quiet.data.metrics["episode/mean/loss"]) and np.isfinite(quiet.data.metrics["train/loss"])


def test_a_model_open_clip_cannot_represent_is_registered_as_model_pt_alone(tmp_path):
    """nCLIP scores pairs by its heads' cross-entropy, which no open_clip model computes: its version holds
    model.pt only and says why in its ``protoclip.open_clip`` tag."""
    from protoclip.models import save_model
    from protoclip.config.strict import to_dict
    from protoclip.tracking import training_run
    from protoclip.train.config import TrainConfig
    from protoclip.models.export_openclip import export_or_copy
    from protoclip.tracking import log_model

    tcfg = TrainConfig(name="nclip_run", method="nclip", teacher=None, model="tiny-rn", image_size=32,
                       head_hidden=32, head_out=16)
    torch.manual_seed(0)
    save_model(tmp_path / "model.pt", tcfg.method_class().build_model(tcfg), to_dict(tcfg),
               eval_spec=tcfg.method_class().eval_spec(tcfg))
    cfg = load_config(tiny_project(tmp_path, {"paths": {"mlflow_system_metrics": False}}, n=4))
    with training_run(cfg.paths, "nclip_run", None, []) as tracker:
        assert log_model(tracker, tmp_path / "model.pt", "nclip_run", {"protoclip.data_digest": "d"}, export_or_copy) == "1"
        run_id = tracker.run_id
    c = store(cfg)
    assert [a.path for a in c.list_artifacts(run_id, "model")] == ["model/model.pt"]
    (version,) = c.search_model_versions("name = 'nclip_run'")
    assert version.tags["protoclip.open_clip"].startswith("no: run 'nclip_run' (nclip) scores image-text pairs by")
    assert version.tags["protoclip.data_digest"] == "d" and version.source == f"runs:/{run_id}/model"


def test_reference_mode_registers_a_version_naming_model_pt_and_stores_no_weights(tmp_path, monkeypatch):
    """``paths.mlflow_log_models: reference``: the run's version (an external LoggedModel of the run) carries
    model.pt's path relative to the project and its sha256 (computed here from the file), and says in its
    description how to get the open_clip form; nothing under the store's artifact folder is a weights file."""
    import mlflow

    from protoclip.train.stage import run_train

    monkeypatch.chdir(tmp_path)
    cfg = load_config(project(tmp_path, paths={"mlflow_log_models": "reference", "mlflow_system_metrics": False},
                              relative=True))
    assert cfg.paths.mlflow_model_mode == "reference"
    run_train(cfg, "quiet")
    layout = Layout.from_config(cfg)
    sha = hashlib.sha256(layout.model("quiet").read_bytes()).hexdigest()
    run = training_run(cfg, "quiet")
    c = store(cfg)

    (version,) = c.search_model_versions("name = 'quiet'")
    assert str(version.version) == "1" and version.run_id == run.info.run_id
    assert version.tags["protoclip.model_sha256"] == sha == run.data.tags["protoclip.model_sha256"]
    assert version.tags["protoclip.model_path"] == "results/runs/quiet/model.pt"
    assert version.tags["protoclip.run"] == "quiet"
    export = "protoclip export --config config.yaml --run quiet"
    assert version.tags["protoclip.open_clip"] == export
    assert "results/runs/quiet/model.pt" in version.description and sha in version.description
    assert export in version.description
    # the source is the run's external LoggedModel, which MLflow marks as such
    assert version.source.startswith("models:/m-")
    logged = c.get_logged_model(version.source[len("models:/"):])
    assert logged.source_run_id == run.info.run_id and logged.tags["mlflow.model.isExternal"] == "true"
    assert logged.tags["protoclip.model_sha256"] == sha

    # no weights in MLflow: the run has no model artifacts, the store's artifact folder no weights file, and the
    # version downloads as MLflow's stub alone
    assert c.list_artifacts(run.info.run_id, "model") == []
    artifacts = tmp_path / "results" / "mlartifacts"
    files = [p for p in artifacts.rglob("*") if p.is_file()]
    assert files and not [p for p in files if p.suffix in (".pt", ".safetensors", ".bin", ".pth")]
    assert sum(p.stat().st_size for p in files) < 1_000_000 < layout.model("quiet").stat().st_size
    folder = mlflow.artifacts.download_artifacts("models:/quiet/1", dst_path=str(tmp_path / "download"))
    assert not [p for p in Path(folder).rglob("*") if p.suffix in (".pt", ".safetensors")]

    # a retrained run adds a version of the same model
    run_train(cfg, "quiet")
    assert sorted(int(v.version) for v in c.search_model_versions("name = 'quiet'")) == [1, 2]


def test_reference_mode_registers_a_run_whose_name_mlflow_refuses_for_a_logged_model(tmp_path):
    """MLflow refuses '.' in a LoggedModel's name but not in a registered model's (the offline default's
    f7_clip_subset_0.5 stopped `make run` on it): the version keeps the run's name, its LoggedModel a safe one."""
    from protoclip.tracking import training_run as open_training_run

    cfg = load_config(project(tmp_path, paths={"mlflow_log_models": "reference", "mlflow_system_metrics": False}))
    name = "f7_clip_subset_0.5"
    with open_training_run(cfg.paths, name, None, []) as tracker:
        assert tracker.register_reference(name, {"protoclip.run": name}) == "1"
    c = store(cfg)
    (version,) = c.search_model_versions(f"name = '{name}'")
    logged = c.get_logged_model(version.source[len("models:/"):])
    assert logged.name == "f7_clip_subset_0_5" and logged.tags["protoclip.run"] == name


def test_mlflow_log_models_takes_true_false_copy_reference_and_names_the_allowed_values_otherwise(tmp_path):
    from protoclip.errors import ConfigError

    modes = {True: "copy", "copy": "copy", "reference": "reference", False: None}
    for value, mode in modes.items():
        cfg = load_config(tiny_project(tmp_path, {"paths": {"mlflow_log_models": value}}, n=4))
        assert cfg.paths.mlflow_model_mode == mode
    for value in ("refs", 1, None):
        with pytest.raises(ConfigError, match=r"'paths.mlflow_log_models' must be bool \| 'copy' \| 'reference'"):
            load_config(tiny_project(tmp_path, {"paths": {"mlflow_log_models": value}}, n=4))
