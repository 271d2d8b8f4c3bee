"""MLflow target tags: every training and evaluation run carries ``protoclip.target.<id> = 1`` for the paper targets
its experiment files show it in, derived from the config by the stage (no rule passes them). Checked through the
real CLI (``protoclip train`` / ``protoclip evaluate`` subprocesses) and ``mlflow.search_runs`` with the filter the
README documents, and in the MLflow UI (headless Chromium; skipped with the reason when it is not installed).

Manual look: ``python tests/test_tracking_targets.py OUT_DIR`` writes OUT_DIR/mlflow_table_V.png.
"""
from __future__ import annotations

import os
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from protoclip.project import load_config
from testkit import REPO
from testkit.mlflow_ui import CHROMIUM, NO_CHROMIUM, MlflowUI
from testkit.training import TINY_CLIP_RUN, tiny_project

TABLE_FILTER = "tags.`protoclip.target.table_V` = '1'"  # the README's filter
COLUMN = {"label": "kNN", "task": "knn", "metric": "top1", "offline": ["digits"]}


def project(tmp_path: Path) -> Path:
    """16 random PNGs; two experiment files: table_V shows runs clip_a and pair_b (seeds 0, 1), fig_x shows clip_a;
    run lonely (inline) is in no target."""
    exp = tmp_path / "experiments"
    exp.mkdir(parents=True)
    (exp / "table_V.yaml").write_text(yaml.safe_dump({
        "target": {"id": "table_V", "kind": "table", "caption": "t", "columns": [COLUMN],
                   "rows": [{"label": "CLIP", "run": "clip_a"}, {"label": "B", "run": "pair_b"}]},
        "runs": {"clip_a": {}, "pair_b": {"seeds": [0, 1]}}}))
    (exp / "fig_x.yaml").write_text(yaml.safe_dump({
        "target": {"id": "fig_x", "kind": "figure", "plot": "bars", "caption": "f", "columns": [COLUMN],
                   "rows": [{"label": "CLIP", "run": "clip_a"}]},
        "runs": {"clip_a": {}}}))
    return tiny_project(tmp_path, {"paths": {"mlflow_experiment": "exp"}, "prepare": {"eval_sets": []},
                                   "train": TINY_CLIP_RUN, "experiments": ["experiments/table_V.yaml", "experiments/fig_x.yaml"],
                                   "runs": {"lonely": {}},
                                   # the set the targets' column names (a column no defined set serves: config error)
                                   "evaluate": {"datasets": {"digits": {"kind": "offline"}}}}, n=16, size=32)


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "protoclip.cli", *args], env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def search(cfg, filter_string: str) -> list:
    import mlflow

    mlflow.set_tracking_uri(cfg.paths.mlflow_uri)
    return mlflow.search_runs(experiment_names=[cfg.paths.mlflow_experiment], filter_string=filter_string,
                              output_format="list")


def test_run_targets_come_from_the_experiment_files(tmp_path):
    from protoclip.tracking import target_tags

    cfg = load_config(project(tmp_path))
    assert cfg.run_targets("clip_a") == ["fig_x", "table_V"]
    assert cfg.run_targets("pair_b_s1") == ["table_V"]  # a seeds group's row stands for each of its runs
    assert cfg.run_targets("lonely") == []
    assert target_tags(cfg.run_targets("clip_a")) == {"protoclip.target.fig_x": "1", "protoclip.target.table_V": "1",
                                                       "protoclip.targets": "fig_x,table_V"}


def test_cli_train_and_evaluate_runs_carry_target_tags(tmp_path):
    config = project(tmp_path)
    cfg = load_config(config)
    cli("train", "--config", str(config), "--run", "clip_a")
    (train,) = search(cfg, TABLE_FILTER)
    assert train.info.run_name == "clip_a" and train.data.tags["protoclip.kind"] == "train"
    assert train.data.tags["protoclip.targets"] == "fig_x,table_V"
    assert [r.info.run_name for r in search(cfg, "tags.`protoclip.target.fig_x` = '1'")] == ["clip_a"]

    # an evaluation whose training run is not in the store (a model restored by `dvc pull`) opens a run of its own
    fresh = yaml.safe_load(config.read_text())
    fresh["paths"]["mlflow_uri"] = f"sqlite:///{tmp_path}/fresh.db"
    config2 = tmp_path / "fresh.yaml"
    config2.write_text(yaml.safe_dump(fresh))
    cli("evaluate", "--config", str(config2), "--run", "clip_a")
    (ev,) = search(load_config(config2), TABLE_FILTER)
    assert ev.info.run_name == "clip_a" and ev.data.tags["protoclip.kind"] == "evaluate"
    assert ev.data.tags["protoclip.target.fig_x"] == "1"


# --------------------------------------------------------------------------- the MLflow UI, filtered by one table
def small_store(tmp_path: Path):
    """Three training runs logged through protoclip.tracking (two in table_V, one in no target)."""
    from protoclip.tracking import training_run

    cfg = load_config(project(tmp_path))
    for run in ("clip_a", "pair_b_s0", "lonely"):
        with training_run(cfg.paths, run, None, cfg.run_targets(run)) as tracker:
            tracker.log_metrics({"mean/loss": 1.0})
    return cfg


def ui_fragment(cfg) -> str:
    import mlflow

    mlflow.set_tracking_uri(cfg.paths.mlflow_uri)
    exp_id = mlflow.get_experiment_by_name(cfg.paths.mlflow_experiment).experiment_id
    return f"#/experiments/{exp_id}/runs?searchFilter={urllib.parse.quote(TABLE_FILTER)}"


def screenshot_filtered_table(cfg, out: Path) -> str:
    """Serve the store, screenshot the runs table filtered by table_V to ``out``; returns the page's DOM."""
    with MlflowUI(cfg.paths.mlflow_uri) as ui:
        return ui.render(ui_fragment(cfg), out)


def test_mlflow_ui_shows_the_runs_of_one_table(tmp_path):
    if CHROMIUM is None:
        pytest.skip(NO_CHROMIUM)
    cfg = small_store(tmp_path / "p")
    shot = tmp_path / "mlflow_table_V.png"
    dom = screenshot_filtered_table(cfg, shot)
    assert shot.stat().st_size > 10_000
    assert "clip_a" in dom and "pair_b_s0" in dom  # the table's runs are listed ...
    assert "lonely" not in dom  # ... and only they


if __name__ == "__main__":  # manual check: a small store and a screenshot of the filtered runs table
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "mlflow_shot")
    out.mkdir(parents=True, exist_ok=True)
    dom = screenshot_filtered_table(small_store(out / "project"), out / "mlflow_table_V.png")
    print(out / "mlflow_table_V.png", "clip_a" in dom, "lonely" in dom)
