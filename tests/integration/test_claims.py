"""The claims ledger: config/claims.yaml against the papers, and `protoclip report`'s ledger on planted
per-example results (runs whose correctness differs by a known amount). The verdict rules and intervals alone:
tests/unit/test_claims_verdicts.py, tests/unit/test_claims_intervals.py."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy import stats

from protoclip.claims.intervals import holm
from protoclip.files import records
from protoclip.claims import ledger
from protoclip.claims.ledger import CONTRADICTED, NOT_RESOLVED, NOT_RUN, NOT_TESTED, REPRODUCED
from protoclip.project import load_config
from protoclip.errors import ConfigError
from protoclip.files.layout import Layout
from protoclip.claims.engine import ClaimEngine
from protoclip.claims.units import chance_of, init_variance, metric_units
from protoclip.report.ledger_table import log_ledger, rule_text, run_ledger
from protoclip.report.paper_tables import build_table
from protoclip.report.values import Results
from testkit import REPO
from testkit.reports import PAPER_TXT
from testkit.results import mark_evaluated

ROOT = REPO
PAPERS = PAPER_TXT.parent


# --------------------------------------------------------------------------- printing
def test_interval_text():
    assert ledger.with_interval(1.8, -0.4, 3.9) == "+1.80 [-0.40, +3.90]"
    assert ledger.with_interval(28.0, 27.1, 29.25, sign=False) == "28.00 [27.10, 29.25]"
    assert ledger.signed(0.0) == "0.00" and ledger.signed(-1.04) == "-1.04"


# --------------------------------------------------------------------------- the shipped claims
def shipped_claims():
    return load_config(ROOT / "config" / "config.yaml").paper_claims()


def test_shipped_claims_load_for_every_config_and_name_existing_rows_and_columns():
    for name in ("config.yaml", "ci.yaml", "paper.yaml"):
        cfg = load_config(ROOT / "config" / name)
        claims = cfg.paper_claims()
        assert len(claims) == len(shipped_claims()) >= 40
        assert cfg.claims.paper_scale == (name == "paper.yaml")  # magnitudes are judged at the paper's scale only
    by = {c.id: c for c in shipped_claims()}
    # the claims of the papers, each once: Table X's teacher claim is Table III's (the same runs and column)
    assert {"cc_linear_32ep", "cc_zeroshot_32ep", "t3_pbt", "t3_teacher", "f6a_episodic", "f6b_soft_targets",
            "t10_proto", "t6_nine_of_fourteen", "t5_third_of_the_time", "f9_epoch_overhead",
            "f9_extraction_share", "f9_kmeans_share", "f9_pbt_share", "t4_two_thirds_of_the_time",
            "t3_soft_target", "t3_kmeans", "t3_augmentation", "f6c_images_per_prototype", "f6d_roberta_teacher",
            "t5_knn_advantage", "t5_retrieval_advantage", "t12_eight_of_ten", "f8_ari_stl10",
            "nclip_linear_imagenet", "nclip_retrieval", "xclip_time", "temperature_fixed_sphere",
            "temperature_euclidean_holds", "multitoken_time", "pcl_knn", "pcl_ami", "pcl_instance_only",
            "pauc_imagenet100", "pauc_imagenet1k", "pauc_nemd"} <= set(by)
    assert "t10_teacher" not in by and [a.line for a in by["t3_teacher"].also] == [351]
    runs = {(c.target, c.a, c.b, tuple(c.a_runs), tuple(c.b_runs), tuple(c.columns), c.metric, c.kind, c.phase)
            for c in by.values() if not c.unavailable}
    assert len(runs) == sum(not c.unavailable for c in by.values())  # no two claims on the same runs and column
    assert {c.paper for c in by.values()} >= {"ProtoCLIP", "nCLIP/xCLIP", "temperature (multi-token)", "PCL",
                                              "PAUC"}
    for c in by.values():  # every magnitude has its margin and the reason for it; one-sided words stay one-sided
        assert c.magnitude == "none" or (c.margin is not None and c.margin_why), c.id
        if c.kind in ("difference", "gain") and c.magnitude == "equivalence" and c.direction != "none":
            # half the paper's difference: the band [paper/2, 3 paper/2] excludes 0, a direction can be contradicted
            assert c.margin == pytest.approx(abs(c.paper_value) / 2), c.id
            assert c.paper_value - c.margin > 0 or c.paper_value + c.margin < 0, c.id
        assert "0.4-1.5 points" not in c.margin_why, c.id  # a spread is the ledger's own measurement
    assert by["f9_kmeans_share"].magnitude == "at_most" and by["f9_pbt_share"].magnitude == "at_most"
    assert by["multitoken_time"].magnitude == "at_most" and by["multitoken_time"].bound() == 8.0
    assert by["f9_extraction_share"].margin == pytest.approx(0.25 * 31.0)
    assert by["f9_epoch_overhead"].direction == "none"  # strictly more work per epoch: no sign to test


# the headline claims, each with the paper's line it is printed on (its quote checked below): (id, line); those
# no run of this project can test read "not run" with the reason, the others name a target's rows and column
HEADLINES = {
    "protoclip.txt": [("cc_half_epochs_zeroshot", 303), ("cc_half_epochs_top5", 303),
                      ("cc_half_epochs_retrieval_matched", 303), ("t11_linear_vs_simclr", 448),
                      ("t11_retrieval_vs_simclr", 448), ("f7_clip_scales_zeroshot", 293),
                      ("f7_clip_scales_linear", 293), ("f8_ami_stl10", 355), ("t3_ablations_beat_clip", 301),
                      ("f6a_best_episode_size", 273), ("f6b_best_target_temperature", 275)],
    "nclip-xclip.txt": [("xclip_linear_imagenet", 162), ("xclip_out_of_distribution", 126), ("xclip_flickr_r1", 154),
                        ("xclip_memory", 31)],
    "clip-temperature-multi-class-tokens.txt": [("temperature_uniformity", 293), ("temperature_distance_range", 303),
                                                ("temperature_equilibrium", 314),
                                                ("temperature_mscoco_exception", 479)],
    "pcl-protonce.txt": [("pcl_low_resource", 30), ("pcl_warmup", 327)],
    "pauc-nemd.txt": [("pauc_toy_nemd", 96), ("pauc_vs_byol", 175)],
}
NOT_RUN_HERE = {"xclip_out_of_distribution", "xclip_flickr_r1", "xclip_memory", "temperature_uniformity",
                "temperature_distance_range",
                "pcl_low_resource", "pcl_warmup", "pauc_vs_byol"}


def test_headline_claims_are_declared_on_their_lines():
    """Every headline claim is in the ledger on its paper's line; a claim no run here can test says why (and reads
    "not run"), a tested one names a target and a rule able to fail (a direction, or a magnitude bound)."""
    by = {c.id: c for c in shipped_claims()}
    for source, claims in HEADLINES.items():
        for cid, line in claims:
            c = by[cid]
            assert (c.source, c.line) == (source, line), cid
            assert bool(c.unavailable) == (cid in NOT_RUN_HERE), cid
            if not c.unavailable:
                assert c.target or c.kind == "toy", cid  # the toy claim reads the toy stage's table
                assert c.direction != "none" or c.magnitude in ("at_least", "at_most"), cid
    # a row's unit as its claim measures it, also where nothing is run: a memory share, a temperature, NEMD
    from protoclip.claims.rows import LedgerRow
    assert [LedgerRow(by[i]).unit for i in ("xclip_memory", "temperature_equilibrium", "pauc_toy_nemd", "pcl_knn")] \
        == ["% of memory", "% of the initial spread", "settings", "points"]
    grid = by["f6a_best_episode_size"], by["f6b_best_target_temperature"], by["t3_ablations_beat_clip"]
    assert [c.kind for c in grid] == ["best", "best", "most"] and len(grid[2].rows) == 5 and len(grid[2].columns) == 4
    two = by["t5_knn_advantage"]  # two gains compared, as the sentence does
    assert two.kind == "gain" and two.columns == ["K-NN 9 Avg.", "Linear 9 Avg."] and two.paper_value == 0.9


@pytest.mark.skipif(not PAPER_TXT.exists(), reason="the paper texts are not on this machine")
def test_every_claim_quotes_its_line_and_its_number_is_the_papers():
    """Each quote (and each `also` quote) is on the cited line of the paper's text; a number printed there (or
    derived from two printed numbers, written "a - b", or a ratio "a / b") is the claim's paper_value."""
    for c in shipped_claims():
        lines = (PAPERS / c.source).read_text().splitlines()
        for line_no, quote in [(c.line, c.quote)] + [(a.line, a.quote) for a in c.also]:
            line = lines[line_no - 1]
            assert quote in line, (c.id, line_no, line[:200])
        if c.paper_value is None:
            continue
        near = " ".join(lines[c.line - 10:c.line + 40])
        derived = re.search(r"(\d+\.\d+) ([-/]) (\d+\.\d+)", c.paper_text)
        gains = re.fullmatch(r"[+-]?\d+(\.\d+)? = \(([\d.]+) - ([\d.]+)\) - \(([\d.]+) - ([\d.]+)\)", c.paper_text)
        if c.kind == "gain":  # two gains compared: (a - b) - (c - d), each number in its table
            a, b, x, y = (float(v) for v in gains.groups()[1:])
            assert c.paper_value == pytest.approx((a - b) - (x - y), abs=1e-9), c.id
            assert all(v in near for v in gains.groups()[1:]), c.id
        elif derived:
            a, op, b = derived.groups()
            value = float(a) - float(b) if op == "-" else 100 * float(a) / float(b)
            assert c.paper_value == pytest.approx(value, abs=1e-9), c.id
            assert a in near and b in near, c.id  # its table
        elif c.kind == "count":
            assert re.search(rf"\b{c.paper_value:g} (out )?of {len(c.columns)}\b", lines[c.line - 1]), c.id
        else:
            printed = re.search(r"[+-]?\d+(\.\d+)?", c.paper_text).group()
            assert float(printed) == c.paper_value and printed.lstrip("+-") in lines[c.line - 1], c.id


def test_claim_declarations_are_checked(tmp_path):
    base = {"id": "x", "paper": "P", "source": "p.txt", "line": 1, "where": "T", "quote": "q", "paper_value": -1.0,
            "paper_text": "-1", "target": "t", "a": "A", "b": "B", "columns": ["c"], "direction": "positive",
            "margin": 1.0, "margin_why": "stated"}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"claims": {"files": ["claims.yaml"]}}))
    for change, message in (({}, "paper_value -1.0 contradicts direction positive"),
                            ({"direction": "negative", "margin_why": ""}, "needs `margin` >= 0 and `margin_why`"),
                            ({"direction": "negative", "paper_value": None}, "equivalence test needs `paper_value`"),
                            ({"direction": "none", "magnitude": "none", "margin": None}, "neither a direction"),
                            ({"direction": "negative", "magnitude": "none"}, "`margin` is for a magnitude test"),
                            ({"kind": "best", "b": None, "columns": ["c", "d"], "paper_value": 1.0},
                             "a best compares one column, got 2"),
                            ({"kind": "most", "a": None, "direction": "none", "paper_value": None},
                             "a most claim has direction positive or negative"),
                            ({"kind": "most", "a": None, "b": None, "paper_value": None},
                             "a most claim needs `b`")):
        (tmp_path / "claims.yaml").write_text(yaml.safe_dump({"claims": [{**base, **change}]}))
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_config(tmp_path / "c.yaml")


# --------------------------------------------------------------------------- planted results
N = 2000  # test images per set


def hits_with(p: float, seed: int, n: int = N) -> np.ndarray:
    """Exactly round(p * n) hits, in a seeded random order."""
    return np.random.default_rng(seed).permutation(np.arange(n) < round(p * n))


def plant(layout: Layout, run: str, task: str, dataset: str, hits: np.ndarray | None, labels: np.ndarray,
          keep: bool = True, **extra) -> None:
    """A metrics file whose top1 is the planted hits' accuracy (as the evaluation computes it) and, with
    ``keep``, the per-example file beside it; ``extra``: more metrics (a zero-shot set's n_classes)."""
    top1 = 100.0 * float(hits.mean()) if task == "linear" else 100.0 * int(hits.sum()) / len(hits)
    records.write_metrics(layout.metrics(run, task, dataset),
                          {"run": run, "dataset": dataset, "task": task, "metrics": {"top1": top1, **extra}})
    if keep:
        records.write_examples(layout.examples(run, task, dataset), {"top1": hits, "labels": labels})


N_INIT = 10


def init_assignments(labels: np.ndarray, keep: float, seed: int) -> list[np.ndarray]:
    """N_INIT "k-means initialisations": each follows the labels for a share of the images drawn around
    ``keep`` (initialisations differ by more than the images' resampling), the first the kept one."""
    rng = np.random.default_rng(seed)
    shares = np.clip(keep + 0.04 * rng.standard_normal(N_INIT), 0.0, 1.0)
    return [np.where(rng.random(len(labels)) < k, labels, rng.integers(0, 10, len(labels))) for k in shares]


def plant_clusters(layout: Layout, run: str, dataset: str, labels: np.ndarray, keep: float, seed: int) -> None:
    """k-means assignments that follow the labels for a share ``keep`` of the images, with the metrics file's
    ARI and AMI computed from them as the evaluation does, and the spread over the N_INIT initialisations as
    the evaluation writes it (``<score>_std`` with numpy's ddof 0, ``n_init``)."""
    from sklearn.metrics import adjusted_mutual_info_score, adjusted_rand_score

    inits = init_assignments(labels, keep, seed)
    cluster = inits[0]
    aris = np.array([adjusted_rand_score(labels, c) for c in inits])
    amis = np.array([adjusted_mutual_info_score(labels, c) for c in inits])
    m = {"ari": aris[0], "ami": amis[0], "n_init": N_INIT, "ari_std": float(aris.std()), "ami_std": float(amis.std())}
    records.write_metrics(layout.metrics(run, "clustering", dataset),
                          {"run": run, "dataset": dataset, "task": "clustering", "metrics": m})
    records.write_examples(layout.examples(run, "clustering", dataset), {"cluster": cluster, "labels": labels})


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
    """A planted claim: a direction only unless a magnitude test is given."""
    return {"id": cid, "paper": kw.pop("paper", "planted"), "source": "none.txt", "line": 1, "where": "planted",
            "quote": "-",
            "paper_value": kw.pop("paper_value", None), "paper_text": "-", "target": kw.pop("target", "table_T"),
            "a": a, "b": b, "columns": columns, "direction": direction, "magnitude": kw.pop("magnitude", "none"),
            **kw}


@pytest.fixture(params=[False], ids=["offline"])
def planted(tmp_path, request):
    """A project whose runs differ by known amounts: a (3 seeds, 59 / 60 / 61 %) vs b (1 seed) 50 % on each set;
    a_copy identical to a0; nokeep without per-example results; episode times with extraction a third of the
    training phase's time. ``paper_scale`` from the param (False: the offline default)."""
    target = {"id": "table_T", "kind": "table", "caption": "planted", "paper": "-",
              "rows": [{"label": "A", "run": "a"}, {"label": "B", "run": "b"}, {"label": "A0", "run": "a0"},
                       {"label": "C", "run": "c"},
                       {"label": "A copy", "run": "a_copy"}, {"label": "No keep", "run": "nokeep"},
                       {"label": "Floor", "run": "floor"}],
              "columns": [{"label": s, "task": "linear", "datasets": [s]} for s in SETS]
              + [{"label": "avg", "task": "linear", "datasets": SETS},
                 {"label": "ARI digits", "task": "clustering", "metric": "ari", "datasets": ["digits"]},
                 {"label": "AMI digits", "task": "clustering", "metric": "ami", "datasets": ["digits"]},
                 {"label": "ZS digits", "task": "zeroshot", "datasets": ["digits"]},
                 {"label": "KNN digits", "task": "knn", "datasets": ["digits"]},
                 {"label": "NEMD digits", "task": "nemd", "metric": "nemd", "datasets": ["digits"]}]}
    # Table V's difference row (RN50 ProtoCLIP - RN50 CLIP) over a planted column named as the paper's
    table_v = {"id": "table_W", "kind": "table", "caption": "planted V", "paper": "table_V",
               "rows": [{"label": "RN50 CLIP", "run": "b"}, {"label": "RN50 ProtoCLIP", "run": "a"}],
               "columns": [{"label": "Linear IN", "task": "linear", "datasets": ["digits"]}]}
    time_fig = {"id": "fig_T", "kind": "figure", "plot": "time_split", "caption": "planted times", "paper": "-",
                "rows": [{"label": "CLIP", "run": "b"}, {"label": "ProtoCLIP", "run": "a"}]}
    # three runs of one method from logit scales 14.3, 1 and 50 (the temperature study's equilibrium claim)
    temp_fig = {"id": "fig_E", "kind": "figure", "plot": "time_split", "caption": "planted scales", "paper": "-",
                "rows": [{"label": f"s0 = {s}", "run": f"t{s}"} for s in ("14", "1", "50")]}
    runs = {"a": {"method": "protoclip", "seeds": [0, 1, 2]}, "b": {"method": "clip"}, "a0": {"method": "clip"},
            "c": {"method": "clip", "seeds": [0, 1, 2]},
            "a_copy": {"method": "clip"}, "nokeep": {"method": "clip"}, "floor": {"method": "clip"},
            **{f"t{s}": {"method": "clip", "loss": {"init_temperature": tau}} for s, tau in
               (("14", 0.07), ("1", 1.0), ("50", 0.02))}}
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump({"target": target, "runs": runs}))
    (tmp_path / "exp_v.yaml").write_text(yaml.safe_dump({"target": table_v}))
    (tmp_path / "exp_t.yaml").write_text(yaml.safe_dump({"target": time_fig}))
    (tmp_path / "exp_e.yaml").write_text(yaml.safe_dump({"target": temp_fig}))
    claims = [
        claim("planted", "A", "B", ["digits"], paper_value=10.0, magnitude="equivalence", margin=5.0,
              margin_why="planted"),
        claim("planted_avg", "A", "B", ["avg"]),
        claim("identical", "A0", "A copy", ["digits"]),
        claim("reversed", "B", "A", ["digits"]),
        claim("small", "A", "C", ["digits"], paper_value=10.0),
        claim("one_seed", "A0", "B", ["digits"], paper_value=10.0, magnitude="equivalence", margin=5.0,
              margin_why="planted"),
        claim("count", "A", "B", SETS, kind="count", paper_value=3, magnitude="equivalence", margin=1.0,
              margin_why="planted"),
        claim("count_small", "A", "C", SETS, kind="count"),
        claim("count_reversed", "B", "A", SETS, kind="count"),
        claim("count_floor", "A", "Floor", SETS, kind="count"),  # floor at chance on every set
        claim("no_examples", "A", "No keep", ["digits"]),
        claim("zs_one_seed", "A0", "B", ["ZS digits"]),  # one seed a side, no repeated zero-shot runs anywhere
        claim("above_floor", "A", "Floor", ["digits"]),  # the baseline at chance (10 classes: 10 %)
        claim("other_paper", "A", "C", ["fashion_mnist"], paper="other"),
        claim("gain", "A", "B", ["KNN digits", "digits"], kind="gain"),  # kNN gain +15 against linear +10
        claim("gain_reversed", "A", "B", ["digits", "KNN digits"], kind="gain"),
        claim("ari", "A", "B", ["ARI digits"]),
        claim("knn_one_seed", "A0", "B", ["KNN digits"]),  # kNN's seed spread measured only in the gains' rows
        # a grid's best row: A (3 seeds, ~60 %) against B (50 %) and C (~59.5 %); B against A and C (worst)
        claim("best", "A", None, ["digits"], kind="best", rows=["B", "C"]),
        claim("best_wrong", "B", None, ["digits"], kind="best", rows=["A", "C"]),
        # rows ahead of B on most of 3 sets: A and C on all 3 (a sign test over 3 sets cannot reach 2.5 %)
        claim("most", None, "B", SETS, kind="most", rows=["A", "C", "Floor"]),
        claim("most_typo", None, "B", SETS, kind="most", rows=["A", "No such row"]),
        # PAUC's toy table: NEMD lower for pauc in 3 of 5 class settings, higher in 1, tied in 1
        claim("toy", "pauc", "pcl", ["nemd"], direction="negative", kind="toy", target=None),
        claim("equilibrium", None, None, [], direction="none", kind="equilibrium", target="fig_E",
              rows=["s0 = 14", "s0 = 1", "s0 = 50"], magnitude="at_most", margin=10.0, margin_why="planted"),
        claim("nemd", "A", "B", ["NEMD digits"], direction="negative"),  # 3 seeds vs 1: the seeds' spread alone
        claim("nemd_one_value", "A0", "B", ["NEMD digits"], direction="negative"),  # one run a side: a point
        claim("nemd_absent", "A", "No keep", ["NEMD digits"], direction="negative"),  # nokeep has no NEMD
        claim("ami", "A", "B", ["AMI digits"]),
        claim("absent", "A", "B", ["digits"], target="table_nowhere"),
        claim("share", "ProtoCLIP", "CLIP", [], kind="share", phase="extract", direction="none",
              paper_value=31.0, magnitude="equivalence", margin=7.75, margin_why="planted", target="fig_T"),
        claim("share_far", "ProtoCLIP", "CLIP", [], kind="share", phase="extract", direction="none",
              paper_value=60.0, magnitude="equivalence", margin=10.0, margin_why="planted", target="fig_T"),
        claim("kmeans_only", "ProtoCLIP", "CLIP", [], kind="share", phase="kmeans", direction="none",
              paper_value=2.3, magnitude="at_most", margin=0.6, margin_why="planted", target="fig_T"),
        claim("overhead", "ProtoCLIP", "CLIP", [], kind="overhead", direction="none", paper_value=34.8,
              magnitude="equivalence", margin=8.7, margin_why="planted", target="fig_T"),
        {"id": "untestable", "paper": "P", "source": "none.txt", "line": 1, "where": "-", "quote": "-",
         "paper_value": None, "paper_text": "-", "unavailable": "no such run here"},
    ]
    (tmp_path / "claims.yaml").write_text(yaml.safe_dump({"claims": claims}))
    cfg_file = tmp_path / "config.yaml"
    cfg_file.write_text(yaml.safe_dump({
        "paths": {"data_dir": str(tmp_path / "data"), "results_dir": str(tmp_path / "results"),
                  "mlflow_uri": f"sqlite:///{tmp_path}/mlflow.db"},
        "experiments": ["exp.yaml"], "targets": ["exp_v.yaml", "exp_t.yaml", "exp_e.yaml"],
        "claims": {"files": ["claims.yaml"], "resamples": 1000, "seed": 0, "paper_scale": request.param},
        "evaluate": {"datasets": {s: {"kind": "offline"} for s in SETS}}}))
    cfg = load_config(cfg_file)
    layout = Layout.from_config(cfg)
    labels = np.arange(N) % 10
    for i, s in enumerate(SETS):
        for k, run in enumerate(cfg.run_group("a")):
            plant(layout, run, "linear", s, hits_with(0.59 + 0.01 * k, seed=10 * i + k), labels)
        for k, run in enumerate(cfg.run_group("c")):  # 58.8 / 59.5 / 60.2 %: half a point below a
            plant(layout, run, "linear", s, hits_with(0.588 + 0.007 * k, seed=50 + 10 * i + k), labels)
        plant(layout, "b", "linear", s, hits_with(0.50, seed=100 + i), labels)
        plant(layout, "a0", "linear", s, hits_with(0.60, seed=10 * i), labels)
        plant(layout, "a_copy", "linear", s, hits_with(0.60, seed=10 * i), labels)
        plant(layout, "nokeep", "linear", s, hits_with(0.55, seed=200 + i), labels, keep=False)
        plant(layout, "floor", "linear", s, hits_with(0.105, seed=250 + i), labels)  # chance: 10 %
    for k, run in enumerate(cfg.run_group("a")):  # kNN 64 / 65 / 66 % on the linear probe's images
        plant(layout, run, "knn", "digits", hits_with(0.64 + 0.01 * k, seed=600 + k), labels)
    plant(layout, "b", "knn", "digits", hits_with(0.50, seed=700), labels)
    plant(layout, "a0", "knn", "digits", hits_with(0.60, seed=800), labels)
    for run, value in [*zip(cfg.run_group("a"), (0.30, 0.32, 0.34)), ("a0", 0.30), ("b", 0.40)]:  # no examples
        records.write_metrics(layout.metrics(run, "nemd", "digits"),
                              {"run": run, "dataset": "digits", "task": "nemd", "metrics": {"nemd": value}})
    for run, p in (("a0", 0.60), ("b", 0.50)):  # the classifier's 12 classes, 10 of them in the test labels
        plant(layout, run, "zeroshot", "digits", hits_with(p, seed=500 + len(run)), labels, n_classes=12)
    for k, run in enumerate(cfg.run_group("a")):  # clusters matching the labels 90 % of the time vs 50 %
        plant_clusters(layout, run, "digits", labels, 0.9, seed=300 + k)
    plant_clusters(layout, "b", "digits", labels, 0.5, seed=400)
    plant_clusters(layout, "a0", "digits", labels, 0.8, seed=450)
    for k, run in enumerate(cfg.run_group("a")):
        episodes(layout, run, extract=1.0, train=3.0, seed=k)  # extraction: 1 / 3 = 33 % of CLIP's epoch time
    episodes(layout, "b", extract=0.0, train=3.0, seed=9)
    toy = layout.toy_files()["csv"]
    toy.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([{"n_classes": n, "method": m, "nemd": v} for n, pcl, pauc in
                  ((10, 0.5, 0.4), (20, 0.5, 0.45), (30, 0.5, 0.6), (40, 0.5, 0.5), (50, 0.5, 0.3))
                  for m, v in (("pcl", pcl), ("pauc", pauc))]).to_csv(toy, index=False)
    for run, last in (("t14", 20.0), ("t1", 21.0), ("t50", 22.0)):  # each scale's last step record is its end
        steps = [{"kind": "step", "step": i, "clip_scale": s} for i, s in enumerate((5.0, 30.0, last))]
        layout.train_log(run).parent.mkdir(parents=True, exist_ok=True)
        layout.train_log(run).write_text("".join(json.dumps(r) + "\n" for r in steps))
    mark_evaluated(layout.results_dir)
    return cfg, layout


def test_an_ami_too_long_to_resample_is_not_run_saying_how_long(planted, monkeypatch):
    """At ImageNet's size each AMI resample takes seconds: past the budget the row is "not run" with the time."""
    import protoclip.claims.engine as claims_module
    from protoclip.claims.rows import NotRun

    cfg, _ = planted
    monkeypatch.setattr(claims_module, "AMI_BUDGET_S", 0.0)
    engine = ClaimEngine(cfg, Results(cfg))
    with pytest.raises(NotRun, match=r"AMI on digits takes \d+ min to resample \(1000 expected mutual "
                                                 r"informations of 2000 images"):
        engine.units("b", "clustering", "digits", "ami")
    assert engine.units("b", "clustering", "digits", "ari")  # ARI has no such cost


def test_planted_ledger_asks_both_questions_offline(planted):
    cfg, _ = planted
    rows, files = run_ledger(cfg, Results(cfg))
    by = {r.claim.id: r for r in rows}
    p = by["planted"]
    assert (p.direction, p.magnitude) == (REPRODUCED, NOT_RESOLVED) and p.ours == pytest.approx(10.0)
    assert p.verdict == "direction reproduced, magnitude not resolved"
    assert "not the paper's scale" in p.magnitude_why  # offline: never a magnitude
    assert 0 < p.lo < p.lo90 < 10.0 < p.hi90 < p.hi and p.hi - p.lo < 12
    assert p.seed_note == "b: 1 seed, its seed spread taken from a"
    assert by["planted_avg"].direction == REPRODUCED and by["planted_avg"].ours == pytest.approx(10.0)
    assert by["planted_avg"].magnitude == NOT_TESTED and by["planted_avg"].verdict == "direction reproduced"
    # one seed a side (a0 - a_copy, identical): the seed spread of linear top-1 on digits pooled over the
    # ledger's repeated runs on digits, a (59 / 60 / 61 %) and c (58.8 / 59.5 / 60.2 %), is combined into it:
    # per-seed variance (2 * 1 + 2 * 0.49) / 4 = 0.745 on 4 df; no example part (identical results), so the
    # interval is 0 -+ t_4 * sqrt(0.745 * (1/1 + 1/1))
    same = by["identical"]
    half = stats.t.ppf(0.975, 4) * np.sqrt(0.745 * 2)
    assert same.direction == NOT_RESOLVED and same.ours == 0.0
    assert (same.lo, same.hi) == pytest.approx((-half, half), rel=1e-9)
    assert same.seed_note == ("seed spread combined from linear top1 of a on digits (3 seeds), c on digits (3 "
                              "seeds): pooled seed sd 0.86, 4 df; rows planted, reversed, small, count, count_small, "
                              "count_reversed, count_floor, above_floor, gain, gain_reversed, best, best_wrong")
    assert same.spread == same.seed_note.removeprefix("seed spread combined from ")  # the spread its interval used
    # a kNN difference of one seed a side: kNN's seeds are measured only in the two gains' rows (a: 64 / 65 /
    # 66 %), whose families carry their own task and metric: per-seed variance 1 on 2 df is combined into it
    knn = by["knn_one_seed"]
    assert knn.seed_note == ("seed spread combined from knn top1 of a on digits (3 seeds): pooled seed sd 1.00, 2 df; "
                             "rows gain, gain_reversed") and "not measured here" not in knn.needs
    # NEMD has no test examples to resample: 3 seeds (0.30 / 0.32 / 0.34) vs 1 (0.40), the pooled two-sample t
    # interval of the seeds alone, -0.08 -+ t_2 * 0.02 * sqrt(1/3 + 1); one run a side: the point, no interval
    nemd, one = by["nemd"], by["nemd_one_value"]
    half = stats.t.ppf(0.975, 2) * 0.02 * np.sqrt(1 / 3 + 1)
    assert nemd.ours == pytest.approx(-0.08) and (nemd.lo, nemd.hi) == pytest.approx((-0.08 - half, -0.08 + half))
    assert nemd.unit == "score (ARI, AMI, NEMD)" and nemd.seed_note.startswith("the seeds' spread alone")
    assert by["no_examples"].unit == "points" and by["absent"].unit == "points"
    assert by["nemd_absent"].verdict == NOT_RUN and by["nemd_absent"].unit == "score (ARI, AMI, NEMD)"  # not points
    assert nemd.raw_direction == NOT_RESOLVED and nemd.spread == "these runs' own seeds (3 and 1): pooled seed sd " \
        "0.02 score (ARI, AMI, NEMD), 2 df"
    assert one.direction == ledger.ONE_VALUE and one.ours == pytest.approx(-0.10) and one.lo is None
    assert one.verdict == "direction one value a side: not decisive" and one.p is None and one.reason == ""
    assert "no test examples to resample (nemd nemd): no interval" in one.seed_note and "2 or more runs" in one.needs
    # "A is the best row": A - B = +10, A - C = +0.5 on digits; the statistic is the runner-up's difference, its
    # lower end the smallest of the comparisons' (A - C's, which contains 0): not resolved
    best, worst = by["best"], by["best_wrong"]
    engine = ClaimEngine(cfg, Results(cfg))
    col = next(c for c in cfg.paper_targets()[0].columns if c.label == "digits")
    vs_c, _ = engine.column_estimate(cfg.run_group("a"), cfg.run_group("c"), col, ["digits"])
    assert best.ours == pytest.approx(0.5) and best.lo == pytest.approx(vs_c.interval(0.95)[0], rel=1e-9)
    assert best.direction == NOT_RESOLVED and best.unit == "points" and "B +10.00, C +0.50" in best.measured
    assert best.spread.startswith("these runs' own seeds (3 and 1)") and "closest now: +0.50" in best.needs
    # B the best: B - A = -10 is below 0 on every resample and seed (Bonferroni's upper end over 2): contradicted
    assert worst.ours == pytest.approx(-10.0) and worst.hi < 0 and worst.direction == CONTRADICTED
    # rows ahead of B on most sets: A and C on all 3; Floor at chance on every set carries no sign; the claim's p
    # is the largest row's (Floor's 1.0: no set with a sign), never below 2.5 % with 3 sets
    most = by["most"]
    assert most.ours == 2 and most.unit == "rows" and most.direction == NOT_RESOLVED and most.p == 1.0
    assert "A 3 / 0, C 3 / 0, Floor 0 / 0" in most.measured and most.needs.startswith("unreachable here")
    assert by["most_typo"].verdict == NOT_RUN and "table_T has no row 'No such row'" in by["most_typo"].reason
    # the final scales 20 / 21 / 22 from 14.3 / 1 / 50: their log-range in % of the initial one, a point; offline
    # (and one run per start) its magnitude is not decided, the test alone printed
    toy = by["toy"]  # 3 of 4 settings with a sign on the paper's side: a sign test over 4 cannot reach 2.5 %
    assert toy.ours == 3 and toy.count_signs == (3, 1) and toy.unit == "settings" and toy.direction == NOT_RESOLVED
    assert toy.p == pytest.approx(5 / 16) and "30 classes +0.1000" in toy.measured
    assert toy.needs.startswith("unreachable here: 4 class settings")
    eq = by["equilibrium"]
    assert eq.ours == pytest.approx(100 * np.log(22 / 20) / np.log(50 / 1)) and eq.lo is None
    assert eq.unit == "% of the initial spread" and eq.direction == NOT_TESTED and eq.magnitude == NOT_RESOLVED
    assert "(the test alone: reproduced)" in eq.magnitude_why and "s0 = 50: 50 -> 22 (t50)" in eq.runs
    # no paper number, our estimate not on its side: planned at the 1-point floor, never below the seeds run
    assert "at our estimate 0.00: not on the paper's side of 0" in same.needs, same.needs
    n = int(re.search(r"the paper prints no number; at \+1\.00: (\d+) seeds a side", same.needs).group(1))
    assert n >= 2 and "seed sd 0.86 points (linear top1 of a on digits" in same.needs, same.needs
    assert by["reversed"].direction == CONTRADICTED  # B - A claimed positive
    one = by["one_seed"]  # one seed a side, the task's spread combined: decisive, its magnitude still not
    assert one.seed_note.startswith("seed spread combined from linear top1 of a on digits (3 seeds), c on digits")
    assert one.direction == REPRODUCED and one.raw_direction == REPRODUCED
    assert one.lo < by["planted"].lo + 10 and "seed spread not measured" in one.magnitude_why
    # one seed a side where no repeated run of the task exists (zero-shot): the interval alone would reproduce
    # it, the verdict says it is not decisive, and the plan says what is missing
    zs = by["zs_one_seed"]
    assert zs.raw_direction == REPRODUCED and zs.direction == ledger.NOT_DECISIVE and zs.p_holm is None
    assert zs.verdict == "direction examples only: not decisive" and "run 2 or more seeds" in zs.needs
    assert "vs chance 8.33 (12 classes of the classifier)" in zs.sides  # the metrics file's n_classes
    # a side at chance: floor scores 10.5 % of 2000 images over 10 classes (chance 10 %), its interval
    # [~9.2, ~11.9] not above 10: the row is not judged, and is outside Holm's family
    floor = by["above_floor"]
    # its claim asks no magnitude: that question stays not tested (the first line counts only questions asked)
    assert (floor.direction, floor.magnitude) == (ledger.AT_CHANCE, NOT_TESTED) and floor.verdict == ledger.AT_CHANCE
    assert "floor not above chance by the 95 % interval" in floor.reason and floor.p_holm is None
    assert "vs chance 10 (10 classes in the test labels)" in floor.sides
    small = by["small"]  # +0.5 points with seed sd ~0.6: not resolved, and what it would take
    assert small.direction == NOT_RESOLVED and small.ours == pytest.approx(0.5)
    n = int(re.match(r"at our estimate \+0\.50: (\d+) seeds a side", small.needs).group(1))
    assert 4 <= n <= 200 and "80 % power" in small.needs, small.needs  # 3 a side already ran
    # at the paper's +10 the power calculation says 2 a side; 3 ran without a verdict: the plan says 4
    assert "at the paper's +10.00: 4 seeds a side (the plan's 2 already ran without a verdict)" in small.needs
    count = by["count"]  # 3 of 3 sets ahead: a sign test over 3 sets cannot reach 2.5 % (0.5^3 = 0.125)
    assert count.direction == NOT_RESOLVED and count.ours == 3 and count.lo == 3 and count.p == 0.125
    assert "ahead on 3, behind on 0" in count.measured
    assert "3 of 3 significant on the paper's side and 0 on the other" in count.measured
    assert count.needs.startswith("unreachable here: 3 sets") and "the paper's own 3 of 3 gives p = 0.12" in count.needs
    # the count's interval: the sets ahead under the sets' resamples (+0.5 points each, seed sd ~0.9: uncertain
    # on every set, so wide); printed beside it, the sets significant on their own after Holm over the sets
    small, rev = by["count_small"], by["count_reversed"]
    assert small.direction == NOT_RESOLVED and small.ours == 3 and small.lo <= 1 and small.hi == 3
    assert "0 of 3 significant on the paper's side and 0 on the other" in small.measured
    assert (rev.lo, rev.hi, rev.direction) == (0, 0, NOT_RESOLVED) and rev.count_signs == (0, 3)
    # two gains compared: (kNN a - b) - (linear a - b) = 15 - 10; each run's two scores resampled on the same
    # images; the seeds' spread is that of the per-run differences (5, 5, 5: none)
    gain, back = by["gain"], by["gain_reversed"]
    assert gain.ours == pytest.approx(5.0) and back.ours == pytest.approx(-5.0) and gain.unit == "points"
    assert gain.direction == REPRODUCED and back.direction == CONTRADICTED
    assert (gain.lo, gain.hi) == pytest.approx((-back.hi, -back.lo), rel=1e-9) and 0 < gain.lo < 5 < gain.hi
    assert "gains +15.00 and +10.00" in gain.measured
    cf = by["count_floor"]  # every set has a side at chance: no set carries a sign
    assert cf.direction == ledger.AT_CHANCE and cf.count_signs == (0, 0) and "every set has a side" in cf.reason
    assert cf.magnitude == NOT_TESTED
    assert "at chance, no sign: digits, fashion_mnist, heldout_pairs" in cf.measured
    ari = by["ari"]  # ARI resampled over the test images with their fixed assignments, inits' spread added
    assert ari.direction == REPRODUCED and ari.unit == "score (ARI, AMI, NEMD)" and ari.lo > 0.3
    assert "k-means initialisations' spread included" in ari.seed_note
    ami = by["ami"]  # AMI resampled the same way, each resample's expected mutual information its own
    assert ami.direction == REPRODUCED and ami.unit == "score (ARI, AMI, NEMD)" and ami.lo > 0.3
    nk = by["no_examples"]
    assert nk.verdict == NOT_RUN and "nokeep: no per-example results for linear on digits" in nk.reason
    assert nk.ours == pytest.approx(5.0)  # the point stands without an interval
    assert by["absent"].verdict == NOT_RUN and "target table_nowhere is not declared" in by["absent"].reason
    assert by["untestable"].verdict == ledger.UNAVAILABLE and by["untestable"].reason == "no such run here"
    # costs: shares paired within each run (extraction 1 / 3 of the training phase), overhead between runs
    assert by["share"].ours == pytest.approx(100 / 3, rel=0.03) and by["share"].direction == NOT_TESTED
    assert by["share"].runs == "a (3 seeds)" and by["share"].hi - by["share"].lo < 5
    assert by["overhead"].ours == pytest.approx(100 * 1.101 / 3.001, rel=0.05)
    for cid in ("share", "share_far", "kmeans_only", "overhead"):
        assert by[cid].magnitude == NOT_RESOLVED and "the test alone" in by[cid].magnitude_why, cid
    # Holm over the direction tests that ran, the family being one paper's claims; the adjusted p decides
    tested = [r for r in rows if r.p_holm is not None]
    assert {r.claim.id for r in tested} == {"planted", "planted_avg", "identical", "reversed", "small", "one_seed",
                                            "count", "count_small", "count_reversed", "ari", "ami", "other_paper",
                                            "gain", "gain_reversed", "knn_one_seed", "nemd", "best", "best_wrong",
                                            "most", "toy"}
    planted_family = [r for r in tested if r.claim.paper == "planted"]
    assert [r.p_holm for r in planted_family] == pytest.approx(holm([r.p for r in planted_family]))
    assert by["other_paper"].p_holm == by["other_paper"].p  # a family of one
    for r in tested:
        assert r.direction == (r.raw_direction if r.p_holm < 0.025 else NOT_RESOLVED), r.claim.id
    assert p.holm == REPRODUCED and small.holm == NOT_RESOLVED

    # the files: every claim once, never a blank verdict; the json for DVC; the forest plot
    frame = pd.read_csv(files.csv)
    assert list(frame["id"]) == [r.claim.id for r in rows] and frame["verdict"].notna().all()
    assert set(frame["direction"]) <= set(ledger.VERDICTS) and set(frame["magnitude"]) <= set(ledger.VERDICTS)
    js = json.loads(files.json.read_text())
    assert js["planted"]["direction"] == REPRODUCED and js["planted"]["margin"] == 5.0
    md = files.md.read_text()
    assert "+10.00 [" in md and f"{len(rows)} distinct claims, 4 not run, 0 skipped, 1 unavailable" in md
    assert "| not resolved; not the paper's scale" in md  # a point's magnitude: no 90 % interval printed
    # the first line counts decisive rows only: the not-decisive and at-chance ones apart
    assert ("direction (24 tested): 10 decisive (7 reproduced, 3 contradicted, Holm within each paper), "
            "10 not resolved, 1 examples only: not decisive, 1 one value a side: not decisive, 2 at chance: not "
            "judged") in md
    # each question counted over the rows whose claim asks it, as the rows give it: the at-chance rows ask no
    # magnitude, so the magnitudes are the 8 claims with a magnitude test (3 differences and counts, 4 costs, the
    # equilibrium)
    asked = [r for r in rows if r.claim.magnitude != "none" and r.magnitude not in ledger.NOT_JUDGED]
    assert len(asked) == 8 and "magnitude (8 tested): 0 decisive (0 reproduced, 0 contradicted), 8 not resolved" in md
    assert "m = 5: [5, 15]" in md and "what it would take" in md
    # each margin beside the seed spread its interval used: planted's own seeds (a's 3, b's 1), not c's
    assert "(m = 5: [5, 15]); the seed spread in its interval: these runs' own seeds (3 and 1): pooled seed sd" in md
    assert files.png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "reproduced" in files.rst.read_text()


@pytest.mark.parametrize("planted", [True], ids=["paper_scale"], indirect=True)
def test_planted_ledger_decides_magnitudes_at_the_papers_scale(planted):
    """The same planted results declared at the paper's scale: magnitudes are decided where seeds were
    measured, each by the rule on its own 90 % interval; one seed a side still decides none."""
    cfg, _ = planted
    rows, _ = run_ledger(cfg, Results(cfg))
    by = {r.claim.id: r for r in rows}
    assert by["share"].magnitude == REPRODUCED  # 33.3 % within 31.0 +- 7.75
    assert by["share_far"].magnitude == CONTRADICTED  # 33.3 % against 60 +- 10
    assert by["kmeans_only"].magnitude == CONTRADICTED  # 3.3 % against "only" 2.3 + 0.6
    assert by["overhead"].magnitude == REPRODUCED  # +36.7 % within 34.8 +- 8.7
    p = by["planted"]
    assert p.magnitude == ledger.magnitude_verdict("equivalence", p.lo90, p.hi90, 10.0, 5.0)
    assert p.magnitude_why == ""
    assert by["one_seed"].magnitude == NOT_RESOLVED and "not measured" in by["one_seed"].magnitude_why
    assert "paper_scale: true" in rule_text(cfg)


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
    assert "interval in brackets (seeds with a small-sample t correction" in caption
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
    assert rec.tags["protoclip.claim.planted"] == "direction reproduced, magnitude not resolved"
    assert rec.tags["protoclip.claim.planted.direction"] == REPRODUCED
    assert rec.tags["protoclip.claim.planted.magnitude"] == NOT_RESOLVED
    assert rec.tags["protoclip.claim.absent"] == NOT_RUN
    assert rec.metrics["claim/planted/ours"] == pytest.approx(10.0) and "claim/planted/ci_low" in rec.metrics
    assert rec.metrics["claim/planted/margin"] == 5.0 and rec.metrics["claim/planted/ci90_low"] > \
        rec.metrics["claim/planted/ci_low"] and 0 < rec.metrics["claim/planted/p_holm"] < 0.025
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
    # a recall's chance: k of the 25 images (an image's captions are one target)
    assert chance_of("retrieval", "text_to_image_R@5", examples, {}) == (pytest.approx(20.0), "25 candidates")


def test_init_variance_is_the_sample_variance_of_the_initialisations():
    """metrics.json keeps numpy's std (ddof 0) over n_init initialisations: the ledger's term is their sample
    variance (ddof 1) on n_init - 1 df; no spread written (one initialisation, an older file): no term."""
    aris = np.array([0.61, 0.58, 0.66, 0.60, 0.63, 0.55, 0.64, 0.59, 0.62, 0.57])
    var, df = init_variance({"n_init": 10, "ari": 0.61, "ari_std": float(aris.std())}, "ari")
    assert var == pytest.approx(float(np.var(aris, ddof=1)), rel=1e-12) and df == 9
    assert init_variance({"ari": 0.61}, "ari") is None and init_variance({"n_init": 1, "ari_std": 0.0}, "ari") is None


def test_clustering_interval_holds_the_kmeans_initialisations(planted):
    """The ARI difference of a0 - b (one run each), computed naively here: the kept assignments' ARIs on 400
    image resamples (the examples' variance), plus each run's sample variance over its 10 initialisations'
    ARIs recomputed from the assignments (not metrics.json), t with Welch-Satterthwaite's df (9 + 9 summed
    for the inits, infinite for the examples). Also a two-level resampling, each draw picking one
    initialisation of each run at random: the ledger's interval is no narrower than it (within noise), and
    wider than the examples' alone."""
    from sklearn.metrics import adjusted_rand_score

    cfg, _ = planted
    engine = ClaimEngine(cfg, Results(cfg))
    col = next(c for c in cfg.paper_targets()[0].columns if c.label == "ARI digits")
    est, *_ = engine.column_parts(["a0"], ["b"], col, ["digits"])
    lo, hi = est.interval(0.95)
    labels = np.arange(N) % 10
    inits_a, inits_b = init_assignments(labels, 0.8, 450), init_assignments(labels, 0.5, 400)
    var_inits = sum(np.var([adjusted_rand_score(labels, c) for c in inits], ddof=1) for inits in (inits_a, inits_b))
    rng = np.random.default_rng(7)
    diffs, examples_only = [], []
    for _ in range(400):
        idx = rng.integers(0, N, N)
        ca, cb = inits_a[rng.integers(N_INIT)], inits_b[rng.integers(N_INIT)]
        diffs.append(adjusted_rand_score(labels[idx], ca[idx]) - adjusted_rand_score(labels[idx], cb[idx]))
        examples_only.append(adjusted_rand_score(labels[idx], inits_a[0][idx])
                             - adjusted_rand_score(labels[idx], inits_b[0][idx]))
    total = np.var(examples_only, ddof=1) + var_inits
    nu = total ** 2 / ((var_inits / 2) ** 2 / 9 + (var_inits / 2) ** 2 / 9)  # each run's share, equal split
    half = stats.t.ppf(0.975, nu) * np.sqrt(total)
    assert (hi - lo) / 2 == pytest.approx(half, rel=0.1), (lo, hi, half)
    naive = np.quantile(diffs, [0.025, 0.975])
    kept = np.quantile(examples_only, [0.025, 0.975])
    assert hi - lo > 0.9 * (naive[1] - naive[0]) and hi - lo > 1.3 * (kept[1] - kept[0])
    assert lo < est.point < hi and "k-means initialisations" in est.seed_note


def test_ledger_in_a_real_mlflow_store(planted):
    """`protoclip report`'s claims run in the project's SQLite MLflow store: found by the verdict tag, with our
    estimate, interval and the paper's number as metrics and the ledger files as artifacts."""
    import mlflow

    from protoclip.tracking import claims_run

    cfg, _ = planted
    run_ledger(cfg, Results(cfg))
    with claims_run(cfg.paths) as tracker:
        log_ledger(cfg, tracker)
    mlflow.set_tracking_uri(cfg.paths.mlflow_uri)
    found = mlflow.search_runs(experiment_names=[cfg.paths.mlflow_experiment], output_format="list",
                               filter_string="tags.`protoclip.claim.planted.direction` = 'reproduced'")
    assert len(found) == 1 and found[0].info.run_name == "claims"
    run = found[0]
    assert run.data.tags["protoclip.kind"] == "claims"
    assert run.data.tags["protoclip.claim.identical"] == "direction not resolved"
    assert run.data.metrics["claim/planted/paper"] == 10.0 and run.data.metrics["claim/planted/ours"] == \
        pytest.approx(10.0)
    arts = {a.path for a in mlflow.tracking.MlflowClient().list_artifacts(run.info.run_id, "claims")}
    assert {"claims/claims.md", "claims/claims.csv", "claims/claims.png"} <= arts
