"""Paper targets: declarations (experiment files), paper numbers, and `protoclip report` on synthetic results.

The synthetic results are metrics files, train logs and feature caches with known values, written for the
runs of the shipped offline config (config/config.yaml) and of a CI-sized config, so every table and figure
is produced in seconds and its cells can be checked against an independent computation.
"""
from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest

from protoclip.project import load_config
from protoclip.dag.stages import evaluation_requests, target_outputs
from protoclip.errors import ConfigError
from protoclip.files.layout import Layout
from protoclip.report.figures import shared_subsample
from protoclip.report.values import paper_numbers, phase_times
from testkit.reports import ALL_TARGETS, PAPER_TXT, ROOT, metric_value, project_copy, synthesize, write


# the evaluation set the targets below name, defined (a column whose sets none defines is a config error)
DIGITS = {"evaluate": {"datasets": {"digits": {"kind": "offline"}}}}


# --------------------------------------------------------------------------- declarations
def test_shipped_config_declares_every_paper_target_and_unique_outputs():
    cfg = load_config(ROOT / "config" / "config.yaml")
    assert [t.id for t in cfg.paper_targets()] == ALL_TARGETS
    outs = target_outputs(cfg, Layout.from_config(cfg))
    assert len(outs) == len(set(outs))
    assert {p.name for p in outs} >= {"table_III.csv", "table_III.md", "table_III.tex", "fig_6a.png", "fig_9.png"}
    # main comparisons have 3 seeds; shared runs (t3_protoclip in Tables III, IV, X, XI) exist once
    assert cfg.run_group("clip_tiny") == ["clip_tiny_s0", "clip_tiny_s1", "clip_tiny_s2"]
    assert cfg.run("protoclip_tiny_s2").seed == 2 and cfg.run_base("protoclip_tiny_s2") == "protoclip_tiny"
    assert cfg.run_names().count("t3_protoclip") == 1
    # an ablation run is evaluated only on what its figure shows
    assert evaluation_requests(cfg)["f6c_images_per_prototype_5"] == {
        "cifar10": ["linear"], "cifar100": ["linear"], "digits": ["linear"],
        "stl10": ["linear"]}


def test_seeds_expand_and_conflicting_shared_runs_are_errors(tmp_path):
    target = {"id": "table_T", "kind": "table", "caption": "c", "rows": [{"label": "A", "run": "a"}],
              "columns": [{"label": "x", "task": "knn", "datasets": ["digits"]}]}
    write(tmp_path / "a.yaml", {"target": target, "runs": {"a": {"method": "clip", "seeds": [3, 4]}}})
    write(tmp_path / "b.yaml", {"runs": {"a": {"method": "clip", "seeds": [3, 4]}}})
    cfg = load_config(write(tmp_path / "c.yaml", {"experiments": ["a.yaml", "b.yaml"], **DIGITS}))
    assert cfg.run_names() == ["a_s3", "a_s4"] and cfg.run("a_s4").seed == 4
    write(tmp_path / "b.yaml", {"runs": {"a": {"method": "clip", "seeds": [3]}}})
    with pytest.raises(ConfigError, match="b.yaml: run 'a' is already defined differently in .*a.yaml"):
        load_config(tmp_path / "c.yaml")
    for bad, msg in [({"seeds": []}, "non-empty list"), ({"seeds": [1, 1]}, "distinct"),
                     ({"seeds": [1], "seed": 1}, "either 'seed' or 'seeds'")]:
        write(tmp_path / "b.yaml", {"runs": {"z": {"method": "clip", **bad}}})
        with pytest.raises(ConfigError, match=msg):
            load_config(tmp_path / "c.yaml")


def test_target_errors_name_the_file_and_key(tmp_path):
    ok = {"id": "t1", "kind": "table", "caption": "c", "rows": [{"label": "A", "run": "nope"}],
          "columns": [{"label": "x", "task": "knn", "datasets": ["digits"]}]}
    write(tmp_path / "a.yaml", {"target": ok, "runs": {"r": {"method": "clip"}}})
    cfg_file = write(tmp_path / "c.yaml", {"experiments": ["a.yaml"]})
    with pytest.raises(ConfigError, match="a.yaml: target 't1': none of its rows' runs"):
        load_config(cfg_file)
    # the same file read for its target only (a config with its own runs): allowed, rows read 'not configured'
    cfg = load_config(write(tmp_path / "d.yaml", {"targets": ["a.yaml"]}))
    assert [t.id for t in cfg.paper_targets()] == ["t1"] and cfg.run_names() == []
    bad = {**ok, "columns": [{"label": "x", "task": "knn", "datasets": ["digits"], "metrc": "top1"}]}
    write(tmp_path / "a.yaml", {"target": bad})
    with pytest.raises(ConfigError, match=r"a.yaml: unknown key 'target.columns\[0\].metrc'|metrc"):
        load_config(cfg_file)
    write(tmp_path / "a.yaml", {"target": {**ok, "columns": [{"label": "x", "task": "knnn", "datasets": ["d"]}]}})
    with pytest.raises(ConfigError, match="unknown task 'knnn'"):
        load_config(cfg_file)
    write(tmp_path / "a.yaml", {"target": ok, "runs": {"nope": {"method": "clip"}}})
    write(tmp_path / "b.yaml", {"target": ok})
    with pytest.raises(ConfigError, match="target 't1' is already declared"):
        load_config(write(tmp_path / "c.yaml", {"experiments": ["a.yaml", "b.yaml"]}))


def test_row_candidates_pick_the_run_the_config_has(tmp_path):
    target = {"id": "t", "kind": "table", "caption": "c", "columns": [{"label": "x", "task": "knn",
                                                                       "datasets": ["digits"]}],
              "rows": [{"label": "A", "run": ["paper_run", "offline_run"]}]}
    write(tmp_path / "t.yaml", {"target": target})
    write(tmp_path / "off.yaml", {"runs": {"offline_run": {"method": "clip"}}})
    write(tmp_path / "pap.yaml", {"runs": {"paper_run": {"method": "clip"}, "offline_run": {"method": "clip"}}})
    off = load_config(write(tmp_path / "c1.yaml", {"experiments": ["off.yaml", "t.yaml"], **DIGITS}))
    pap = load_config(write(tmp_path / "c2.yaml", {"experiments": ["pap.yaml", "t.yaml"], **DIGITS}))
    assert off.paper_targets()[0].rows[0].run == "offline_run" and pap.paper_targets()[0].rows[0].run == "paper_run"


# --------------------------------------------------------------------------- paper numbers
def _paper_table_rows(table: str) -> list[list[float]]:
    """Numbers of each markdown row of paper table ``table`` in the paper text (delta rows included)."""
    text = PAPER_TXT.read_text()
    start = text.index(f"TABLE {table}\n")
    block = text[start:].split("\n\n", 3)
    lines = [ln for part in block[1:3] for ln in part.splitlines() if ln.startswith("|")]
    rows = []
    for ln in lines:
        nums = [float(x) for x in re.findall(r"(?<![\w.])[+-]?\d+\.\d+|(?<=\| )\d+(?= \|)", ln)]
        rows.append(nums)
    return rows


@pytest.mark.skipif(not PAPER_TXT.exists(), reason="the paper text is not on this machine")
@pytest.mark.parametrize("table", ["III", "IV", "V", "VI", "VII", "VIII", "X", "XI", "XII"])
def test_transcribed_numbers_match_the_paper_text(table):
    """Each transcribed row's numbers, in order, are the tail of one row of the paper's table."""
    entry = paper_numbers(f"table_{table}")
    paper_rows = _paper_table_rows(table)
    for label, values in entry["rows"].items():
        ours = [v for v in values.values() if isinstance(v, (int, float))]
        assert any(row[-len(ours):] == ours for row in paper_rows if len(row) >= len(ours)), (table, label, ours)


def test_every_paper_entry_cites_table_and_location():
    for key in [f"table_{t}" for t in ("III", "IV", "V", "VI", "VII", "VIII", "X", "XI", "XII")] + \
               ["fig_6a", "fig_6b", "fig_6c", "fig_6d", "fig_7", "fig_8", "fig_9"]:
        e = paper_numbers(key)
        assert e["cite"].startswith(("Table", "Fig.")) and "protoclip.txt line" in e["where"], key
    assert paper_numbers("table_IV")["rows"]["ProtoCLIP (32 ep)"]["ImageNet linear"] == 55.22


# --------------------------------------------------------------------------- report on synthetic results
def test_phase_times_sum_the_last_record_of_each_episode(tmp_path):
    log = tmp_path / "train_log.jsonl"
    recs = [{"kind": "episode", "episode": 0, "time/extract": 1.0, "time/kmeans": 0.5, "time/pbt": 0.25,
             "time/train": 2.0},
            {"kind": "step", "step": 0},
            {"kind": "episode", "episode": 0, "time/extract": 9.0, "time/train": 1.0},  # resumed: replaces
            {"kind": "episode", "episode": 1, "time/train": 4.0}]
    log.write_text("".join(json.dumps(r) + "\n" for r in recs))
    t = phase_times(log)
    assert t == {"extract": 9.0, "kmeans": 0.0, "pbt": 0.0, "train": 5.0, "total": 14.0, "episodes": 2.0}
    assert phase_times(tmp_path / "none.jsonl") is None


def test_shared_subsample_is_seeded_and_sorted():
    a, b = shared_subsample(100, 10, seed=0), shared_subsample(100, 10, seed=0)
    assert np.array_equal(a, b) and len(np.unique(a)) == 10 and np.all(np.diff(a) > 0)
    assert np.array_equal(shared_subsample(5, 10), np.arange(5))


def test_report_writes_every_target_with_ours_and_the_papers_numbers(tmp_path):
    from protoclip.report.stage import run_report

    cfg = load_config(project_copy(tmp_path))
    synthesize(cfg)
    index = run_report(cfg)
    for path in target_outputs(cfg, Layout.from_config(cfg)):
        assert path.exists() and path.stat().st_size > 0, path
    text = index.read_text()
    # skipped sets listed once at the top, not in the tables (the ledger's not-run rows give their reasons)
    top, rest = text.split("## table_III", 1)
    tables = rest.split("## Claims ledger", 1)[0]
    assert "skipped: imagenet not found" in top and "skipped: imagenet" not in tables
    # Table V: ours mean ± std over 3 seeds, computed independently here; the paper's number beside it
    t5 = pd.read_csv(tmp_path / "results" / "tables" / "table_V.csv", header=[0, 1], index_col=0)
    runs = cfg.run_group("protoclip_tiny")
    vals = [np.mean([metric_value(r, "linear", d, "top1") for d in ("heldout_pairs", "fashion_mnist", "digits")])
            for r in runs]
    expect = f"{np.mean(vals):.2f} ± {np.std(vals, ddof=1):.2f} (3 seeds)"
    assert t5.loc["RN50 ProtoCLIP", ("Linear 9 Avg.", "ours")] == expect
    assert float(t5.loc["RN50 ProtoCLIP", ("Linear 9 Avg.", "paper")]) == 65.4
    assert t5.loc["RN101 CLIP", ("Linear IN", "ours")] == "not configured"
    assert "protoclip_tiny: protoclip, tiny-rn, offline, 4 ep" in t5.loc["RN50 ProtoCLIP", ("Unnamed: 1_level_0",
                                                                                            "ours: run")]
    md = (tmp_path / "results" / "tables" / "table_V.md").read_text()
    assert "Linear IN: imagenet -> fashion_mnist" in md and "Zero-shot chance level: digits 10.0%" in md
    # Table III: one seed, says so; Table IV: Rel. epochs from the synthetic stage times
    t3 = pd.read_csv(tmp_path / "results" / "tables" / "table_III.csv", header=[0, 1], index_col=0)
    v = metric_value("t3_clip", "linear", "fashion_mnist", "top1")
    assert t3.loc["CLIP", ("ImageNet linear", "ours")] == f"{v:.2f} (1 seed)"
    t4 = pd.read_csv(tmp_path / "results" / "tables" / "table_IV.csv", header=[0, 1], index_col=0)
    names = cfg.run_names()
    per_ep = np.mean([3 * (3.0 + names.index(r)) / 4 for r in cfg.run_group("clip_tiny")])  # CLIP s/epoch
    i = names.index("t4_clip_64ep")
    assert t4.loc["CLIP (64 ep)", ("Epoch (Rel.)", "ours")] == f"8 ({3 * (3.0 + i) / per_ep:.1f})"
    assert float(t4.loc["▷ CLOOB [29] (2.9M, 31 ep)", ("ImageNet zero-shot top-1", "paper")]) == 23.97
    tex = (tmp_path / "results" / "tables" / "table_XII.tex").read_text()
    assert "\\begin{table}" in tex and "paper" in tex
    caption = (tmp_path / "results" / "report" / "fig_8.rst").read_text()
    assert "ARI 0.673 -\\> 0.732" in caption  # rst-escaped
    assert "fashion\\_mnist" in caption and "\n\n" not in caption


def test_ci_config_declares_the_same_targets():
    cfg = load_config(ROOT / "config" / "ci.yaml")
    assert [t.id for t in cfg.paper_targets()] == ALL_TARGETS
    assert all(cfg.run(r).epochs <= 1 for r in cfg.run_names())
