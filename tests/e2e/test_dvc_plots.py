"""dvc.yaml's ``plots:`` (protoclip.report.dvc_plots): the report writes each run's loss curve and each paper
table's numbers as DVC plot data, ``protoclip dvc-yaml`` declares them from the configured runs and targets, and
DVC itself (``dvc plots show --json``) renders them from a report made on synthetic results."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from protoclip.project import load_config
from protoclip.files.layout import Layout
from protoclip.report.dvc_plots import TRAIN_LOSS_PLOT, dvc_plots
from testkit.reports import metric_value, project_copy, synthesize

DVC = shutil.which("dvc", path=str(Path(sys.executable).parent)) or shutil.which("dvc")


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """The shipped config on synthetic results (relative paths, as in the repository), with step records in
    two runs' train logs; the report run in it."""
    from protoclip.report.stage import run_report

    root = tmp_path_factory.mktemp("plots")
    cfg_file = project_copy(root)
    data = yaml.safe_load(cfg_file.read_text())
    data["paths"].update(results_dir="results", data_dir="data")
    cfg_file.write_text(yaml.safe_dump(data, sort_keys=False))
    cwd = os.getcwd()
    os.chdir(root)
    try:
        cfg = load_config(cfg_file)
        synthesize(cfg)
        for run, base in (("clip_tiny_s0", 5.0), ("protoclip_tiny_s0", 7.0)):
            log = Layout.from_config(cfg).train_log(run)
            steps = "".join(json.dumps({"kind": "step", "step": s, "loss": base - s}) + "\n" for s in range(4))
            log.write_text(log.read_text() + steps)
        run_report(cfg)
        yield root, cfg
    finally:
        os.chdir(cwd)


def test_report_writes_the_plot_data(project):
    root, cfg = project
    lay = Layout.from_config(cfg)
    curve = pd.read_csv(root / lay.loss_curve("protoclip_tiny_s0"))
    assert curve.to_dict("list") == {"step": [0, 1, 2, 3], "loss": [7.0, 6.0, 5.0, 4.0]}
    assert list(pd.read_csv(root / lay.loss_curve("t3_clip")).columns) == ["step", "loss"]  # no steps
    t5 = pd.read_csv(root / lay.target_plot_data("table_V")).set_index("cell")
    sets = ["heldout_pairs", "fashion_mnist", "digits"]
    expect = np.mean([np.mean([metric_value(r, "linear", d, "top1") for d in sets])
                      for r in cfg.run_group("protoclip_tiny")])
    assert t5.loc["RN50 ProtoCLIP | Linear 9 Avg.", "ours"] == pytest.approx(expect)
    assert t5.loc["RN50 ProtoCLIP | Linear 9 Avg.", "paper"] == 65.4
    assert t5.loc["RN50 ProtoCLIP - CLIP | K-NN IN", "paper"] == 0.8  # the paper's printed difference row


def test_dvc_yaml_declares_a_plot_per_run_curve_table_and_figure(project):
    _root, cfg = project
    plots = dvc_plots(cfg)
    curves = plots[0][TRAIN_LOSS_PLOT]
    assert len(curves["y"]) == len(cfg.run_names()) and curves["x"] == "step"
    ids = {next(iter(p)) if isinstance(p, dict) else p for p in plots}
    for t in cfg.paper_targets():
        if t.kind == "table":
            assert {f"{t.id} (ours)", f"{t.id} (paper)"} <= ids
        else:
            assert f"results/figures/{t.id}.png" in ids
    for name in ("ours_vs_paper", "table_VI_differences", "train_curves"):  # the report's summary figures
        assert f"results/figures/{name}.png" in ids


@pytest.mark.skipif(DVC is None, reason="dvc is not installed")
def test_dvc_renders_the_plots(project):
    root, cfg = project
    claims_json = str(Layout.from_config(cfg).claims_files().json)
    (root / "dvc.yaml").write_text(yaml.safe_dump({"metrics": [claims_json], "plots": dvc_plots(cfg)},
                                                  sort_keys=False))
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    subprocess.run([DVC, "init", "--no-scm", "-q"], cwd=root, env=env, check=True, capture_output=True, timeout=120)
    out = subprocess.run([DVC, "plots", "show", "--json"], cwd=root, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout)
    assert not result.get("errors"), result["errors"][:3]
    shown = result["data"]
    text = json.dumps(shown[TRAIN_LOSS_PLOT])
    assert "protoclip_tiny_s0.csv" in text and "clip_tiny_s0.csv" in text
    assert "table_V (ours)" in shown and "results/figures/fig_9.png" in shown
    assert "RN50 ProtoCLIP | Linear 9 Avg." in json.dumps(shown["table_V (ours)"])
    assert "results/figures/claims.png" in shown  # the claims ledger's forest plot
    # the ledger as DVC metrics (dvc.yaml's top-level `metrics:`, as `protoclip dvc-yaml` writes it)
    out = subprocess.run([DVC, "metrics", "show", "--json"], cwd=root, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    metrics = json.dumps(json.loads(out.stdout))
    assert "cc_linear_32ep" in metrics and "f9_epoch_overhead" in metrics and "ci_low" in metrics
