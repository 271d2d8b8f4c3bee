"""The report's summary figures on a tiny results tree: which points each draws (ours against the paper, Table VI's
differences with seed error bars, the training curves per target), checked against values computed here from the
files the test writes, and that `protoclip report` writes the PNGs and captions the workflow declares."""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import yaml

from protoclip.project import load_config
from protoclip.dag.stages import target_outputs
from protoclip.files.layout import Layout
from protoclip.report.summary_figures import comparable_points, curve_panels, difference_points, summary_names
from protoclip.report.stage import run_report, train_losses
from protoclip.report.values import Results, paper_numbers
from testkit.results import mark_evaluated

# Table VI as the shipped target declares it, cut to two paper columns, the average and one offline column
TARGET = {
    "id": "table_VI", "kind": "table", "caption": "Zero-shot classification evaluation results of YFCC pretraining.",
    "rows": [{"label": "RN50 CLIP", "run": "c"}, {"label": "RN50 ProtoCLIP", "run": "p"},
             {"label": "RN101 CLIP"}, {"label": "RN101 ProtoCLIP"}],
    "columns": [{"label": "CIFAR10", "task": "zeroshot", "datasets": ["cifar10"]},  # no stand-in: no result
                {"label": "STL10", "task": "zeroshot", "datasets": ["stl10"], "offline": ["digits"]},
                {"label": "14 Dataset Avg.", "task": "zeroshot", "datasets": ["cifar10", "stl10"],
                 "offline": ["digits", "fashion_mnist"]},
                {"label": "offline: digits", "task": "zeroshot", "offline": ["digits"], "paper": "-"}],
}
TOP1 = {  # zero-shot top-1 % per run and set: CLIP 3 seeds, ProtoCLIP 2 seeds
    "c_s0": {"digits": 40.0, "fashion_mnist": 30.0}, "c_s1": {"digits": 44.0, "fashion_mnist": 33.0},
    "c_s2": {"digits": 39.0, "fashion_mnist": 31.0},
    "p_s0": {"digits": 47.0, "fashion_mnist": 35.0}, "p_s1": {"digits": 52.0, "fashion_mnist": 29.0},
}
STEPS = {"c_s0": 6, "c_s1": 6, "c_s2": 6, "p_s0": 8, "p_s1": 8, "solo": 5}  # logged steps; solo: in no target


def project(tmp_path):
    exp = tmp_path / "table_VI.yaml"
    exp.write_text(yaml.safe_dump({"target": TARGET, "runs": {
        "c": {"method": "clip", "teacher": None, "seeds": [0, 1, 2]}, "p": {"method": "protoclip", "seeds": [0, 1]},
        "solo": {"method": "clip", "teacher": None}}}))
    conf = tmp_path / "config.yaml"
    conf.write_text(yaml.safe_dump({
        "paths": {"data_dir": str(tmp_path / "data"), "results_dir": str(tmp_path / "results"),
                  "mlflow_uri": f"sqlite:///{tmp_path}/mlflow.db"},
        "experiments": [exp.name],
        "evaluate": {"datasets": {"digits": {"kind": "offline"}, "fashion_mnist": {"kind": "offline"},
                                  "cifar10": {"kind": "torchvision", "path": str(tmp_path / "nope")},
                                  "stl10": {"kind": "torchvision", "path": str(tmp_path / "nope")}}}}))
    cfg = load_config(conf)
    lay = Layout.from_config(cfg)
    for run, sets in TOP1.items():
        for dataset, top1 in sets.items():
            path = lay.metrics(run, "zeroshot", dataset)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"run": run, "task": "zeroshot", "dataset": dataset,
                                        "metrics": {"top1": top1, "top5": 90.0, "n_classes": 10}}))
        for dataset in ("cifar10", "stl10"):
            path = lay.metrics(run, "zeroshot", dataset)
            path.parent.mkdir(parents=True, exist_ok=True)
            line = f"skipped: {dataset} not found at {tmp_path / 'nope'}"
            path.write_text(json.dumps({"run": run, "task": "zeroshot", "dataset": dataset, "skipped": line,
                                        "status": {"state": "missing", "reason": line}}))
    for run, n in STEPS.items():
        log = lay.train_log(run)
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("".join(json.dumps({"kind": "step", "step": s, "loss": 5.0 - 0.1 * s - 0.01 * len(run)}) + "\n"
                               for s in range(n)))
    mark_evaluated(lay.results_dir)
    return cfg, lay


def test_ours_against_the_paper_draws_every_cell_with_both_numbers(tmp_path):
    from protoclip.claims.engine import ClaimEngine
    from protoclip.report.paper_tables import build_table

    cfg, _ = project(tmp_path)
    results = Results(cfg)
    target = cfg.paper_targets()[0]
    _, _, records = build_table(cfg, results, target, ClaimEngine(cfg, results))
    points = comparable_points(records)
    # independently: a run row (not a difference row) with our mean over seeds and a paper number. CIFAR10 has no
    # stand-in (no result), "offline: digits" no paper number, the RN101 rows no run: 2 rows x 2 columns remain
    paper = paper_numbers("table_VI")["rows"]
    mean = {r: {c: float(np.mean([np.mean([TOP1[f"{r}_s{s}"][d] for d in sets]) for s in seeds]))
                for c, sets in (("STL10", ["digits"]), ("14 Dataset Avg.", ["digits", "fashion_mnist"]))}
            for r, seeds in (("c", range(3)), ("p", range(2)))}
    want = {(row, col): (float(paper[row][col]), mean[run][col])
            for row, run in (("RN50 CLIP", "c"), ("RN50 ProtoCLIP", "p")) for col in ("STL10", "14 Dataset Avg.")}
    got = {(r.row, r.column): (r.paper, r.ours) for r in points.itertuples()}
    assert got.keys() == want.keys()
    for key in want:
        assert got[key][0] == want[key][0] and math.isclose(got[key][1], want[key][1], rel_tol=1e-12), key
    assert set(points["target"]) == {"table_VI"} and points["stand_in"].all() and set(points["unit"]) == {"%"}
    # difference rows carry numbers on both sides too, but are not cells of the scatter
    assert any(r.get("row_kind") == "difference" and r["ours_mean"] is not None for r in records)


def test_table_vi_differences_are_our_means_difference_with_its_seed_standard_error(tmp_path):
    cfg, _ = project(tmp_path)
    points = difference_points(cfg, Results(cfg), cfg.paper_targets()[0])
    diffs = paper_numbers("table_VI")["differences"]
    assert [(p.difference, p.column) for p in points] == [(d, c["label"]) for d in diffs for c in TARGET["columns"]]
    by = {(p.difference, p.column): p for p in points}
    c = [TOP1[f"c_s{s}"]["digits"] for s in range(3)]
    p = [TOP1[f"p_s{s}"]["digits"] for s in range(2)]
    stl = by[("RN50 ProtoCLIP - CLIP", "STL10")]
    assert math.isclose(stl.ours, np.mean(p) - np.mean(c), rel_tol=1e-12)
    se = math.sqrt(np.var(p, ddof=1) / 2 + np.var(c, ddof=1) / 3)
    assert math.isclose(stl.error, se, rel_tol=1e-12) and stl.seeds == (2, 3) and stl.sets == ["digits"]
    assert stl.paper == diffs["RN50 ProtoCLIP - CLIP"]["values"]["STL10"]  # +6.99, as printed
    assert by[("RN50 ProtoCLIP - CLIP", "CIFAR10")].ours is None  # no result of ours: the paper's point only
    assert by[("RN50 ProtoCLIP - CLIP", "offline: digits")].paper is None  # the paper has no such column
    assert all(p.ours is None for (d, _), p in by.items() if d.startswith("RN101"))  # not configured here


def test_training_curves_have_one_panel_per_target_with_the_runs_it_compares(tmp_path):
    cfg, lay = project(tmp_path)
    panels = curve_panels(cfg, train_losses(lay, cfg.run_names()))
    assert [p.title for p in panels] == [f"table_VI: {TARGET['caption']}", "runs of no paper target"]
    assert panels[0].lines == [("RN50 CLIP (c, 3 seeds)", ["c_s0", "c_s1", "c_s2"]),
                               ("RN50 ProtoCLIP (p, 2 seeds)", ["p_s0", "p_s1"])]
    assert panels[1].lines == [("solo", ["solo"])]
    lay.train_log("solo").unlink()  # a run without a log draws nothing
    assert [p.title for p in curve_panels(cfg, train_losses(lay, cfg.run_names()))] == [panels[0].title]


def test_report_writes_the_summary_figures_the_workflow_declares(tmp_path):
    cfg, lay = project(tmp_path)
    index = run_report(cfg)
    names = summary_names(cfg)
    assert names == ["ours_vs_paper", "table_VI_differences", "train_curves"]
    declared = set(target_outputs(cfg, lay))
    for name in names:
        png, rst = lay.figures / f"{name}.png", lay.caption(name)
        assert png in declared and rst in declared
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000, name
        assert rst.read_text().strip(), name
        assert f"![{name}](../figures/{name}.png)" in index.read_text()
    assert "one point per comparable table cell (4 cells of 1 table)" in lay.caption("ours_vs_paper").read_text()
    assert "3 of 8 bars have our result" in lay.caption("table_VI_differences").read_text()
    losses = pd.read_csv(lay.train_losses)
    assert len(losses) == sum(STEPS.values())  # the per-step values the curves smooth
