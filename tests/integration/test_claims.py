"""The claims ledger: verdict rules, config/claims.yaml against the papers, and `protoclip report`'s ledger on
planted per-example results (runs whose correctness differs by a known amount)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from protoclip import records
from protoclip.claims import ledger
from protoclip.claims.ledger import CONTRADICTED, NOT_RESOLVED, NOT_RUN, REPRODUCED, verdict
from protoclip.config import load_config
from protoclip.errors import ConfigError
from protoclip.layout import Layout
from protoclip.report.claims import ClaimEngine, log_ledger, metric_units, run_ledger
from protoclip.report.paper_tables import build_table
from protoclip.report.values import Results
from testkit import REPO
from testkit.reports import PAPER_TXT
from testkit.results import mark_evaluated

ROOT = REPO
PAPERS = PAPER_TXT.parent


# --------------------------------------------------------------------------- rules
@pytest.mark.parametrize("direction, lo, hi, band, n, want", [
    ("positive", 0.4, 3.9, None, None, REPRODUCED),
    ("positive", -3.9, -0.4, None, None, CONTRADICTED),
    ("positive", -0.4, 3.9, None, None, NOT_RESOLVED),
    ("positive", 0.0, 0.0, None, None, NOT_RESOLVED),  # an identical pair
    ("negative", -3.9, -0.4, None, None, REPRODUCED),
    ("negative", 0.1, 2.0, None, None, CONTRADICTED),
    ("within", 20.0, 30.0, [15.5, 62.0], None, REPRODUCED),
    ("within", 10.0, 20.0, [15.5, 62.0], None, NOT_RESOLVED),
    ("within", 0.2, 0.4, [1.0, 5.0], None, CONTRADICTED),
    ("within", 70.0, 80.0, [15.5, 62.0], None, CONTRADICTED),
    ("count", 8.0, 12.0, None, 14, REPRODUCED),  # above half of 14
    ("count", 6.0, 11.0, None, 14, NOT_RESOLVED),
    ("count", 2.0, 5.0, None, 14, CONTRADICTED),
])
def test_verdict_rules(direction, lo, hi, band, n, want):
    assert verdict(direction, lo, hi, band, n_sets=n) == want


def test_interval_text():
    assert ledger.with_interval(1.8, -0.4, 3.9) == "+1.80 [-0.40, +3.90]"
    assert ledger.with_interval(28.0, 27.1, 29.25, sign=False) == "28.00 [27.10, 29.25]"
    assert ledger.signed(0.0) == "0.00" and ledger.signed(-1.04) == "-1.04"


# --------------------------------------------------------------------------- the shipped claims
def shipped_claims():
    return load_config(ROOT / "config" / "config.yaml").paper_claims()


def test_shipped_claims_load_for_every_config_and_name_existing_rows_and_columns():
    for name in ("config.yaml", "ci.yaml", "paper.yaml"):
        claims = load_config(ROOT / "config" / name).paper_claims()
        assert len(claims) == len(shipped_claims()) >= 20
    ids = [c.id for c in shipped_claims()]
    # the claims of the issue, each once
    assert {"cc_linear_32ep", "cc_zeroshot_32ep", "t3_pbt", "t3_teacher", "f6a_episodic", "f6b_soft_targets",
            "t10_proto", "t10_teacher", "t6_nine_of_fourteen", "t5_third_of_the_time", "f9_epoch_overhead",
            "f9_extraction_share", "f9_kmeans_share", "f9_pbt_share"} <= set(ids)
    assert {c.paper for c in shipped_claims()} >= {"ProtoCLIP", "nCLIP/xCLIP", "temperature (multi-token)", "PCL",
                                                    "PAUC"}
    assert len(ids) == len(set(ids))


@pytest.mark.skipif(not PAPER_TXT.exists(), reason="the paper texts are not on this machine")
def test_every_claim_quotes_its_line_and_its_number_is_the_papers():
    """Each quote is on the cited line of the paper's text; a number printed there (or derived from two printed
    numbers, written "a - b") is the claim's paper_value."""
    for c in shipped_claims():
        lines = (PAPERS / c.source).read_text().splitlines()
        line = lines[c.line - 1]
        assert c.quote in line, (c.id, c.line, line[:200])
        if c.paper_value is None:
            continue
        derived = re.search(r"(\d+\.\d+) - (\d+\.\d+)", c.paper_text)
        if derived:
            a, b = map(float, derived.groups())
            assert c.paper_value == pytest.approx(a - b, abs=1e-9), c.id
            assert all(x in " ".join(lines[c.line - 10:c.line + 40]) for x in derived.groups()), c.id  # its table
        elif c.kind == "time_ratio":
            assert c.paper_value == pytest.approx(100 * 10.8 / 32.0)
        elif c.kind == "count":
            assert f"{c.paper_value:g} of {len(c.columns)}" in line, c.id
        else:
            printed = re.search(r"[+-]?\d+(\.\d+)?", c.paper_text).group()
            assert float(printed) == c.paper_value and printed.lstrip("+-") in line, c.id


def test_claim_declarations_are_checked(tmp_path):
    (tmp_path / "claims.yaml").write_text(yaml.safe_dump({"claims": [{
        "id": "x", "paper": "P", "source": "p.txt", "line": 1, "where": "T", "quote": "q", "paper_value": -1.0,
        "paper_text": "-1", "target": "t", "a": "A", "b": "B", "columns": ["c"], "direction": "positive"}]}))
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"claims": {"files": ["claims.yaml"]}}))
    with pytest.raises(ConfigError, match="paper_value -1.0 contradicts direction positive"):
        load_config(tmp_path / "c.yaml")


# --------------------------------------------------------------------------- planted results
N = 2000  # test images per set


def hits_with(p: float, seed: int, n: int = N) -> np.ndarray:
    """Exactly round(p * n) hits, in a seeded random order."""
    return np.random.default_rng(seed).permutation(np.arange(n) < round(p * n))


def plant(layout: Layout, run: str, task: str, dataset: str, hits: np.ndarray | None, labels: np.ndarray,
          keep: bool = True) -> None:
    """A metrics file whose top1 is the planted hits' accuracy (as the evaluation computes it) and, with
    ``keep``, the per-example file beside it."""
    top1 = 100.0 * float(hits.mean()) if task == "linear" else 100.0 * int(hits.sum()) / len(hits)
    records.write_metrics(layout.metrics(run, task, dataset),
                          {"run": run, "dataset": dataset, "task": task, "metrics": {"top1": top1}})
    if keep:
        records.write_examples(layout.examples(run, task, dataset), {"top1": hits, "labels": labels})


def episodes(layout: Layout, run: str, extract: float, train: float, n: int = 6, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    recs = [{"kind": "episode", "episode": e, "time/extract": extract * (1 + 0.05 * rng.standard_normal()),
             "time/kmeans": 0.1 * extract, "time/pbt": 0.001, "time/train": train * (1 + 0.05 * rng.standard_normal())}
            for e in range(n)]
    path = layout.train_log(run)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in [{"kind": "start"}] + recs))


SETS = ["digits", "fashion_mnist", "heldout_pairs"]


def claim(cid: str, a: str, b: str, columns: list[str], direction: str = "positive", **kw) -> dict:
    return {"id": cid, "paper": "planted", "source": "none.txt", "line": 1, "where": "planted", "quote": "-",
            "paper_value": kw.pop("paper_value", None), "paper_text": "-", "target": kw.pop("target", "table_T"),
            "a": a, "b": b, "columns": columns, "direction": direction, **kw}


@pytest.fixture
def planted(tmp_path):
    """A project whose runs differ by known amounts: a (3 seeds) 60 % vs b (1 seed) 50 % on each set; a_copy
    identical to a's first seed; nokeep without per-example results."""
    target = {"id": "table_T", "kind": "table", "caption": "planted", "paper": "-",
              "rows": [{"label": "A", "run": "a"}, {"label": "B", "run": "b"}, {"label": "A0", "run": "a0"},
                       {"label": "A copy", "run": "a_copy"}, {"label": "No keep", "run": "nokeep"}],
              "columns": [{"label": s, "task": "linear", "datasets": [s]} for s in SETS]
              + [{"label": "avg", "task": "linear", "datasets": SETS}]}
    # Table V's difference row (RN50 ProtoCLIP - RN50 CLIP) over a planted column named as the paper's
    table_v = {"id": "table_W", "kind": "table", "caption": "planted V", "paper": "table_V",
               "rows": [{"label": "RN50 CLIP", "run": "b"}, {"label": "RN50 ProtoCLIP", "run": "a"}],
               "columns": [{"label": "Linear IN", "task": "linear", "datasets": ["digits"]}]}
    time_fig = {"id": "fig_T", "kind": "figure", "plot": "time_split", "caption": "planted times", "paper": "-",
                "rows": [{"label": "CLIP", "run": "b"}, {"label": "ProtoCLIP", "run": "a"}]}
    runs = {"a": {"method": "protoclip", "seeds": [0, 1, 2]}, "b": {"method": "clip"}, "a0": {"method": "clip"},
            "a_copy": {"method": "clip"}, "nokeep": {"method": "clip"}}
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump({"target": target, "runs": runs}))
    (tmp_path / "exp_v.yaml").write_text(yaml.safe_dump({"target": table_v}))
    (tmp_path / "exp_t.yaml").write_text(yaml.safe_dump({"target": time_fig}))
    claims = [
        claim("planted", "A", "B", ["digits"], paper_value=10.0),
        claim("planted_avg", "A", "B", ["avg"]),
        claim("identical", "A0", "A copy", ["digits"]),
        claim("reversed", "B", "A", ["digits"]),
        claim("count", "A", "B", SETS, kind="count"),
        claim("no_examples", "A", "No keep", ["digits"]),
        claim("absent", "A", "B", ["digits"], target="table_nowhere"),
        claim("share", "ProtoCLIP", "CLIP", [], kind="share", phase="extract", direction="within",
              band=[20.0, 40.0], target="fig_T"),
        claim("overhead", "ProtoCLIP", "CLIP", [], kind="overhead", target="fig_T"),
        {"id": "untestable", "paper": "P", "source": "none.txt", "line": 1, "where": "-", "quote": "-",
         "paper_value": None, "paper_text": "-", "unavailable": "no such run here"},
    ]
    (tmp_path / "claims.yaml").write_text(yaml.safe_dump({"claims": claims}))
    cfg_file = tmp_path / "config.yaml"
    cfg_file.write_text(yaml.safe_dump({
        "paths": {"data_dir": str(tmp_path / "data"), "results_dir": str(tmp_path / "results"),
                  "mlflow_uri": f"sqlite:///{tmp_path}/mlflow.db"},
        "experiments": ["exp.yaml"], "targets": ["exp_v.yaml", "exp_t.yaml"],
        "claims": {"files": ["claims.yaml"], "resamples": 1000, "seed": 0},
        "evaluate": {"datasets": {s: {"kind": "offline"} for s in SETS}}}))
    cfg = load_config(cfg_file)
    layout = Layout.from_config(cfg)
    labels = np.arange(N) % 10
    for i, s in enumerate(SETS):
        for k, run in enumerate(cfg.run_group("a")):
            plant(layout, run, "linear", s, hits_with(0.60, seed=10 * i + k), labels)
        plant(layout, "b", "linear", s, hits_with(0.50, seed=100 + i), labels)
        plant(layout, "a0", "linear", s, hits_with(0.60, seed=10 * i), labels)
        plant(layout, "a_copy", "linear", s, hits_with(0.60, seed=10 * i), labels)
        plant(layout, "nokeep", "linear", s, hits_with(0.55, seed=200 + i), labels, keep=False)
    for k, run in enumerate(cfg.run_group("a")):
        episodes(layout, run, extract=1.0, train=3.0, seed=k)  # extraction: 1 / 3 = 33 % of CLIP's epoch time
    episodes(layout, "b", extract=0.0, train=3.0, seed=9)
    mark_evaluated(layout.results_dir)
    return cfg, layout


def test_planted_difference_is_reproduced_and_identical_pair_not_resolved(planted):
    cfg, layout = planted
    rows, files = run_ledger(cfg, Results(cfg))
    by = {r.claim.id: r for r in rows}
    p = by["planted"]
    assert p.verdict == REPRODUCED and p.ours == pytest.approx(10.0)  # 60 % vs 50 %, planted exactly
    assert 0 < p.lo < 10.0 < p.hi and p.hi - p.lo < 8  # the truth inside, 0 excluded
    assert by["planted_avg"].verdict == REPRODUCED and by["planted_avg"].ours == pytest.approx(10.0)
    # the mean over 3 sets has a narrower interval than one set's
    assert by["planted_avg"].hi - by["planted_avg"].lo < p.hi - p.lo
    same = by["identical"]
    assert same.verdict == NOT_RESOLVED and (same.ours, same.lo, same.hi) == (0.0, 0.0, 0.0)
    assert by["reversed"].verdict == CONTRADICTED  # B - A claimed positive
    assert by["count"].verdict == REPRODUCED and by["count"].ours == 3 and by["count"].lo == 3
    nk = by["no_examples"]
    assert nk.verdict == NOT_RUN and "nokeep: no per-example results for linear on digits" in nk.reason
    assert nk.ours == pytest.approx(5.0)  # the point stands without an interval
    assert by["absent"].verdict == NOT_RUN and "target table_nowhere is not declared" in by["absent"].reason
    assert by["untestable"].verdict == NOT_RUN and by["untestable"].reason == "no such run here"
    # costs from the train logs: extraction ~ 1 / 3 of CLIP's epoch time, ~ +37 % per epoch
    assert by["share"].verdict == REPRODUCED and by["share"].ours == pytest.approx(100 / 3, rel=0.05)
    assert by["overhead"].verdict == REPRODUCED and by["overhead"].ours == pytest.approx(100 * 1.101 / 3, rel=0.05)
    assert all(r.verdict in ledger.VERDICTS and (r.verdict != NOT_RUN or r.reason) for r in rows)

    # the files: every claim once, never a blank verdict; the json for DVC; the forest plot
    frame = pd.read_csv(files["csv"])
    assert list(frame["id"]) == [r.claim.id for r in rows] and frame["verdict"].notna().all()
    assert json.loads(files["json"].read_text())["planted"]["verdict"] == REPRODUCED
    md = files["md"].read_text()
    assert "+10.00 [" in md and "4 reproduced" not in md and f"{len(rows)} claims" in md
    assert files["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "reproduced" in files["rst"].read_text()


def test_identical_seeds_give_the_one_seed_interval(planted):
    """Three seeds with identical per-example results: the seed level adds nothing (its draws come after the
    examples'), so the interval is the one-seed interval, to rounding. (Seed spread widening it:
    test_claims_bootstrap.)"""
    cfg, layout = planted
    engine = ClaimEngine(cfg, Results(cfg))
    col = next(c for c in cfg.paper_targets()[0].columns if c.label == "digits")
    one = engine.column_interval(["a0"], ["b"], col, ["digits"], 10.0)
    same = engine.column_interval(["a0", "a_copy", "a0"], ["b"], col, ["digits"], 10.0)
    assert (same.lo, same.hi) == pytest.approx((one.lo, one.hi), rel=1e-12) and one.lo < 10.0 < one.hi


def test_table_difference_rows_carry_their_interval(planted):
    cfg, _ = planted
    results = Results(cfg)
    target = next(t for t in cfg.paper_targets() if t.id == "table_W")
    table, caption, long = build_table(cfg, results, target, ClaimEngine(cfg, results))
    cell = table.loc["RN50 ProtoCLIP - CLIP", ("Linear IN", "ours")]
    assert re.fullmatch(r"\+\d+\.\d\d \[\+\d+\.\d\d, \+\d+\.\d\d\]", cell), cell
    assert table.loc["RN50 ProtoCLIP - CLIP", ("Linear IN", "paper")] == "+0.6"
    assert "bootstrap interval in brackets" in caption
    rec = next(r for r in long if r["row"] == "RN50 ProtoCLIP - CLIP")
    assert rec["ours_ci_low"] < rec["ours_mean"] < rec["ours_ci_high"]
    # without an engine (or without per-example results) the point alone, as before
    plain, _, _ = build_table(cfg, results, target)
    assert "[" not in plain.loc["RN50 ProtoCLIP - CLIP", ("Linear IN", "ours")]


def test_ledger_logged_to_mlflow_through_the_tracker(planted):
    cfg, _ = planted
    run_ledger(cfg, Results(cfg))

    class Recorder:
        tags, metrics, artifacts = {}, {}, []

        def set_tags(self, tags):
            self.tags.update(tags)

        def log_metrics(self, metrics, step=None):
            self.metrics.update(metrics)

        def log_artifact(self, path, artifact_path=None):
            self.artifacts.append(Path(path).name)

    rec = Recorder()
    log_ledger(cfg, rec)
    assert rec.tags["protoclip.claim.planted"] == REPRODUCED and rec.tags["protoclip.claim.absent"] == NOT_RUN
    assert rec.metrics["claim/planted/ours"] == pytest.approx(10.0) and "claim/planted/ci_low" in rec.metrics
    assert "claim/absent/ours" not in rec.metrics and {"claims.md", "claims.png", "claims.json"} <= set(rec.artifacts)


def test_retrieval_units_give_the_metrics_files_recalls():
    from protoclip.evaluate.metrics.retrieval import retrieval_recall

    rng = np.random.default_rng(0)
    images = rng.normal(size=(25, 6))
    owner = np.repeat(np.arange(25), rng.integers(1, 4, 25))  # 1-3 captions per image
    texts = images[owner] + 2.0 * rng.normal(size=(len(owner), 6))
    m, ranks = retrieval_recall(images, texts, owner, per_example=True)
    examples = {**ranks, "text_to_image": owner}
    for metric in ("image_to_text_R@1", "text_to_image_R@5", "mean_recall"):
        assert metric_units("retrieval", metric, examples).value()[0] == pytest.approx(m[metric], rel=1e-12)
    assert metric_units("clustering", "ari", {}) is None and metric_units("knn", "top5", {"top1": ranks}) is None


def test_ledger_in_a_real_mlflow_store(planted):
    """`protoclip report`'s claims run in the project's SQLite MLflow store: found by the verdict tag, with our
    estimate, interval and the paper's number as metrics and the ledger files as artifacts."""
    import mlflow

    from protoclip.tracking import claims_run

    cfg, _ = planted
    run_ledger(cfg, Results(cfg))
    with claims_run(cfg) as tracker:
        log_ledger(cfg, tracker)
    mlflow.set_tracking_uri(cfg.paths.mlflow_uri)
    found = mlflow.search_runs(experiment_names=[cfg.paths.mlflow_experiment], output_format="list",
                               filter_string="tags.`protoclip.claim.planted` = 'reproduced'")
    assert len(found) == 1 and found[0].info.run_name == "claims"
    run = found[0]
    assert run.data.tags["protoclip.kind"] == "claims" and run.data.tags["protoclip.claim.identical"] == NOT_RESOLVED
    assert run.data.metrics["claim/planted/paper"] == 10.0 and run.data.metrics["claim/planted/ours"] == \
        pytest.approx(10.0)
    arts = {a.path for a in mlflow.tracking.MlflowClient().list_artifacts(run.info.run_id, "claims")}
    assert {"claims/claims.md", "claims/claims.csv", "claims/claims.png"} <= arts
