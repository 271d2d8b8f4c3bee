"""The MLflow UI, opened in headless Chromium on a SQLite store that the real train stage filled: the training run's
validation curve (model metrics), its system metrics, its model artifacts (the open_clip export) and
the registered model's pages, each rendered by ``mlflow server`` on a free loopback port (stopped after); and the
registered version, downloaded by its ``models:/`` URI, loads in open_clip.

Manual look: ``python tests/e2e/test_mlflow_ui_model.py OUT_DIR`` writes the store and one PNG per page.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from protoclip.project import load_config
from testkit.mlflow_ui import CHROMIUM, NO_CHROMIUM, MlflowUI
from testkit.training import TINY_CLIP_RUN, tiny_project

RUN = {**TINY_CLIP_RUN, "epochs": 2.0, "validation": {"every_episodes": 1, "tasks": ["zeroshot", "knn"]}}


def trained_store(root: Path):
    """Run ``clip`` (5 episodes, validated after each) trained by the train stage into a SQLite store under
    ``root``; returns (config, MLflow run)."""
    import mlflow

    from protoclip.train.stage import run_train

    os.environ.setdefault("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "1")  # MLflow's knob (10 s by default)
    cfg = load_config(tiny_project(root, {"paths": {"mlflow_experiment": "ui"}, "prepare": {"eval_sets": []},
                                          "train": RUN, "runs": {"clip": {}}},
                                   n=48, heldout=12, size=32, labels=["animals/cat", "food", "vehicles/car"]))
    run_train(cfg, "clip")
    mlflow.set_tracking_uri(cfg.paths.mlflow_uri)
    (run,) = mlflow.search_runs(experiment_names=["ui"], output_format="list")
    return cfg, run


def pages(run) -> dict[str, str]:
    """The UI pages a user opens, by name: URL fragments of MLflow 3's UI routes."""
    base = f"#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}"
    ml = "workflowType=machine_learning"  # the UI's "Model training" view (its default is the GenAI one)
    return {"model_metrics": f"{base}/model-metrics?{ml}", "system_metrics": f"{base}/system-metrics?{ml}",
            "artifacts": f"{base}/artifacts/model/open_clip_config.json?{ml}",
            "registered_model": f"#/models/clip?{ml}", "model_version": f"#/models/clip/versions/1?{ml}"}


def render(cfg, run, out: Path) -> dict[str, str]:
    """Each page's DOM after the UI's scripts ran, and its screenshot ``out/<page>.png``."""
    doms = {}
    with MlflowUI(cfg.paths.mlflow_uri) as ui:
        for name, fragment in pages(run).items():
            # tall enough for every chart section to be in view (the UI draws charts as they scroll in): episode/mean,
            # episode/time, train (per-step curves) and val, in that order, ~370 px a row of three charts
            size = {"model_metrics": "1400,5800", "system_metrics": "1400,1400"}.get(name, "1400,1000")
            doms[name] = ui.render(fragment, out / f"{name}.png", window=size, budget_ms=60000)
    return doms


def test_mlflow_ui_shows_curve_system_metrics_model_and_registered_version(tmp_path):
    if CHROMIUM is None:
        pytest.skip(NO_CHROMIUM)
    import mlflow
    import open_clip

    cfg, run = trained_store(tmp_path / "p")
    doms = render(cfg, run, tmp_path)
    for name in pages(run):
        assert (tmp_path / f"{name}.png").stat().st_size > 10_000, name
    # the run's charts: the validation curves beside the training losses
    assert "val/zeroshot/top1" in doms["model_metrics"] and "val/knn/top1" in doms["model_metrics"]
    assert "train/loss" in doms["model_metrics"] and "episode/mean/loss" in doms["model_metrics"]
    # MLflow's own system metrics
    assert "system/cpu_utilization_percentage" in doms["system_metrics"]
    assert "system/system_memory_usage_megabytes" in doms["system_metrics"]
    # the model folder in the artifact browser (the open_clip export, the one copy of the weights in MLflow), and the
    # open_clip config shown from it
    for name in ("open_clip_model.safetensors", "open_clip_config.json"):
        assert name in doms["artifacts"], name
    assert "model_cfg" in doms["artifacts"] and "preprocess_cfg" in doms["artifacts"]
    # the registered model and its version, with the provenance tags and the run it came from
    assert "clip" in doms["registered_model"] and "Version 1" in doms["registered_model"]
    for tag in ("protoclip.code_commit", "protoclip.config_sha256", "protoclip.data_digest"):
        assert tag in doms["model_version"], tag
    assert run.data.tags["protoclip.config_sha256"] in doms["model_version"]

    # the version a user picks in that page loads in open_clip
    mlflow.set_tracking_uri(cfg.paths.mlflow_uri)
    folder = mlflow.artifacts.download_artifacts("models:/clip/1", dst_path=str(tmp_path / "download"))
    model, _, preprocess = open_clip.create_model_and_transforms(f"local-dir:{folder}")
    assert type(model).__name__ == "CLIP" and preprocess.transforms[0].size == 32


if __name__ == "__main__":  # manual check: the store and one screenshot per page
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "mlflow_model_shots").resolve()
    out.mkdir(parents=True, exist_ok=True)
    cfg, run = trained_store(out / "project")
    for name, dom in render(cfg, run, out).items():
        (out / f"{name}.html").write_text(dom)
        print(out / f"{name}.png", len(dom))
