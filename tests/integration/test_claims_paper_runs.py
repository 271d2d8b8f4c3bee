"""Every claim of config/claims.yaml is judged from the runs config/paper.yaml plans, or says why it cannot be.

The paper configuration declares other targets than the offline default (table_methods_paper, not table_methods):
a claim's ``paper_config`` names its rows and columns there (protoclip.claims.config.ClaimConfig.resolved). Here
config/paper.yaml is loaded with an overlay that declares every corpus and evaluation set (empty files and
folders in a tmp dir: planning reads only whether they exist), and each claim's two run families are checked
against the DAG's stages (protoclip.dag.stages.stages): a train job for each trained run, and an evaluation job
of each of the claim's columns' paper sets running the column's task.
"""
from __future__ import annotations

import re

import pytest

from protoclip.claims.config import ClaimConfig, PaperComparison
from protoclip.config.strict import read_yaml
from protoclip.dag.stages import stages, trained
from protoclip.errors import ConfigError
from protoclip.project import load_config
from protoclip.report.paper_targets import first_configured
from testkit import REPO

PAPER = REPO / "config" / "paper.yaml"
# the related papers' claims the offline default judges from table_methods: at paper scale from
# table_methods_paper (PCL against its instance term alone: pcl_in1k_instance_only)
RELATED_JUDGED = {"xclip_zeroshot", "nclip_zeroshot", "nclip_linear_imagenet", "xclip_linear_imagenet",
                  "xclip_retrieval", "nclip_retrieval", "xclip_time", "multitoken_zeroshot", "multitoken_time",
                  "pauc_vs_pcl_linear", "pauc_nemd", "pcl_knn", "pcl_ami", "pcl_instance_only", "pcl_vs_instance"}


def overlay(tmp) -> dict:
    """Every corpus of prepare.user_data a one-line file, every evaluation set an empty folder."""
    paper = read_yaml(PAPER)
    user_data = []
    for u in paper["prepare"]["user_data"]:
        path = tmp / "corpora" / u["name"] / ("00000.tar" if u["format"] == "wds" else "train.csv")
        path.parent.mkdir(parents=True)
        path.write_text("filepath,caption\n")
        user_data.append(dict(u, path=str(path)))
    datasets = {}
    for name, d in paper["evaluate"]["datasets"].items():
        (tmp / "eval" / name).mkdir(parents=True)
        datasets[name] = dict(d, path=str(tmp / "eval" / name))
    return {"paths": {"data_dir": str(tmp / "data"), "results_dir": str(tmp / "results")},
            "prepare": {"user_data": user_data}, "evaluate": {"datasets": datasets}}


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    cfg = load_config(PAPER, overlay(tmp_path_factory.mktemp("paper")))
    assert not cfg.runs_without_data()  # every corpus declared: every run gets its jobs
    return cfg, {s.name: s for s in stages(cfg, str(PAPER))}


def family(cfg, target, label, pinned) -> list[str]:
    base = first_configured(cfg, pinned) if pinned else next(r.run for r in target.rows if r.label == label)
    return cfg.run_group(base)


def sides(c, target) -> list[tuple[str | None, list[str]]]:
    """The rows a claim compares: a and b, and a best / most claim's grid rows (its `rows`, else every other)."""
    grid = c.rows or [r.label for r in target.rows if r.run and r.label not in (c.a, c.b)]
    out = [(c.a, c.a_runs), (c.b, c.b_runs)] + [(r, []) for r in (grid if c.kind in ("best", "most") else [])]
    return [(label, pinned) for label, pinned in out if label or pinned]


def test_every_claim_maps_to_runs_the_paper_dag_plans(planned):
    cfg, jobs = planned
    targets = {t.id: t for t in cfg.paper_targets()}
    judged, unavailable = set(), set()
    for c in cfg.paper_claims():
        if c.unavailable:  # the reason is printed in the ledger's row: it names what is missing
            assert len(c.unavailable.split()) >= 4, c.id
            unavailable.add(c.id)
            continue
        if c.kind == "toy":  # PAUC's toy table: the toy stage writes it, the report stage reads it
            toy = [o.path for o in jobs["toy_nemd"].outs if o.path.endswith(".csv")]
            assert toy and jobs["report"].deps["toy"] == toy, c.id
            judged.add(c.id)
            continue
        assert c.target in targets, (c.id, c.target)
        target = targets[c.target]
        columns = [next(col for col in target.columns if col.label == label) for label in c.columns]
        for label, pinned in sides(c, target):
            runs = family(cfg, target, label, pinned)
            assert runs, (c.id, label, pinned)
            for run in runs:
                assert not trained(cfg, run) or f"train_{run}" in jobs, (c.id, run)
                for col in columns:
                    assert col.datasets, (c.id, col.label)  # the paper's own sets, not offline stand-ins
                    for d in col.datasets:
                        job = jobs.get(f"evaluate_{run}_{d}")
                        assert job is not None and f"--task {col.task}" in job.args, (c.id, run, d, col.task)
        judged.add(c.id)
    assert judged | unavailable == {c.id for c in cfg.paper_claims()}
    assert RELATED_JUDGED <= judged
    by = {c.id: c for c in cfg.paper_claims()}
    assert {by[i].target for i in RELATED_JUDGED} == {"table_methods_paper", "table_pauc_in100_paper"}
    assert by["pauc_nemd"].target == "table_pauc_in100_paper"  # only its two runs are evaluated on ImageNet-100
    # unavailable offline (no target scores the sphere runs), judged from the paper's Table 2 analog
    assert by["temperature_fixed_sphere"].target == "table_temperature_2_paper"
    assert by["xclip_flickr_r1"].columns == ["Flickr30K retrieval mean R@k"]  # no Flickr30K offline
    assert {r for r, d in (re.match(r"--run (\S+) --dataset (\S+)", s.args).groups() for s in jobs.values()
                           if s.command == "evaluate") if d == "imagenet100"} == {"pcl_in100", "pauc_in100"}
    # each paper's own baseline: nCLIP's CLIP for nCLIP / xCLIP, Table 5's CLIP for the multi-token run
    assert by["xclip_zeroshot"].b == "CLIP (nCLIP recipe)" and by["multitoken_zeroshot"].b == "CLIP (Table 5 recipe)"
    assert by["pcl_knn"].b == "PCL v2 instance term only (MoCo v2), ImageNet-1K" and not by["pcl_knn"].b_runs


def test_the_offline_default_keeps_its_own_comparison():
    """config/config.yaml declares table_methods: the claims keep their offline rows there."""
    by = {c.id: c for c in load_config(REPO / "config" / "config.yaml").paper_claims()}
    for cid in RELATED_JUDGED:
        assert by[cid].target == "table_methods" and not by[cid].unavailable, cid
    assert by["xclip_zeroshot"].b == "CLIP" and by["xclip_zeroshot"].columns == ["Zero-shot (coarse labels)"]


def claim(**kw) -> ClaimConfig:
    base = dict(id="c", paper="P", source="p.txt", line=1, where="T", quote="q", paper_value=2.0, paper_text="+2",
                target="offline_t", a="A", b="B", columns=["col"], margin=1.0, margin_why="half")
    c = ClaimConfig(**{**base, **kw})
    c.validate()
    return c


def test_resolution_picks_the_declared_target():
    alt = PaperComparison(target="paper_t", a="A paper", b="B paper", columns=["paper col"], note="paper runs")
    c = claim(paper_config=alt, note="offline runs")
    assert c.resolved({"offline_t", "paper_t"}) is c  # its own target wins where declared
    p = c.resolved({"paper_t"})
    assert (p.target, p.a, p.b, p.columns, p.note) == ("paper_t", "A paper", "B paper", ["paper col"], "paper runs")
    assert (p.quote, p.paper_value, p.margin) == (c.quote, c.paper_value, c.margin)  # one claim, one number
    gone = claim(paper_config=PaperComparison(unavailable="no such data set at paper scale"))
    assert gone.resolved(set()).unavailable == "no such data set at paper scale"
    # unavailable offline, judged where the paper configuration's target is declared
    later = claim(target=None, a=None, b=None, columns=[], unavailable="offline: no such run", paper_config=alt)
    assert later.resolved(set()).unavailable == "offline: no such run"
    assert later.resolved({"paper_t"}).unavailable is None and later.resolved({"paper_t"}).a == "A paper"
    with pytest.raises(ValueError, match="needs `b`"):  # the paper comparison is checked in every config
        claim(paper_config=PaperComparison(target="paper_t", a="A paper", columns=["paper col"]))


def test_a_paper_comparison_naming_no_row_stops_the_load(tmp_path):
    """A paper_config row that the paper configuration's target lacks stops loading, as an offline typo does."""
    import yaml

    claims = read_yaml(REPO / "config" / "claims.yaml")["claims"]
    bad = next(c for c in claims if c["id"] == "xclip_zeroshot")
    bad["paper_config"]["b"] = "CLIP (no such recipe)"
    (tmp_path / "claims.yaml").write_text(yaml.safe_dump({"claims": claims}, allow_unicode=True))
    with pytest.raises(ConfigError, match="no row or column 'CLIP \\(no such recipe\\)'"):
        load_config(PAPER, {"claims": {"files": [str(tmp_path / "claims.yaml")]}})


def test_snakemake_dry_run_plans_the_claims_runs(tmp_path, planned):
    """`snakemake -n` with the same overlay plans each claim's train jobs and the evaluations its columns read."""
    import yaml

    from testkit.processes import snakemake
    from testkit.workflow import workflow_copy

    cfg, jobs = planned
    root = workflow_copy(tmp_path / "project", config=True)
    (root / "overlay.yaml").write_text(yaml.safe_dump(overlay(tmp_path / "data")))
    out = snakemake(root, "--configfile", "config/paper.yaml", "overlay.yaml", "-n", "--forceall", "--cores", "4",
                    "--resources", "gpu=1")
    text = out.stdout + out.stderr
    dry = {(rule, wc) for rule, wc in re.findall(r"^rule (\w+):\n(?:    .*\n)*?    wildcards: (.*)$", text, re.M)}
    evaluations = [re.match(r"--run (\S+) --dataset (\S+)", s.args).groups() for s in jobs.values()
                   if s.command == "evaluate"]
    targets = {t.id: t for t in cfg.paper_targets()}
    claim_runs = {run for c in cfg.paper_claims() if not c.unavailable and c.kind != "toy"
                  for label, pinned in sides(c, targets[c.target])
                  for run in family(cfg, targets[c.target], label, pinned)}
    for run in claim_runs:
        if trained(cfg, run):
            assert ("train", f"run={run}") in dry, run
        for dataset in [d for r, d in evaluations if r == run]:
            assert ("evaluate", f"run={run}, dataset={dataset}") in dry, (run, dataset)


# issue 59's headline claims, each on the line the paper prints it (its quote and number: test_claims.py's
# test_every_claim_quotes_its_line_and_its_number_is_the_papers): (id, line, judged in the offline default, judged in
# the paper configuration); the others carry `unavailable` with the data, run or rule they lack
HEADLINES_59 = {
    "protoclip.txt": [("t4_rows34_linear", 303, True, True), ("t4_rows34_zeroshot", 303, True, True),
                      ("t4_rows34_top5", 303, True, True), ("t4_rows34_retrieval_matched", 303, True, True),
                      ("t5_rn101_matched_zeroshot", 340, False, True),
                      ("t5_rn101_retrieval_advantage", 340, False, True),
                      ("t11_no_augmentation_best_retrieval", 446, True, True),
                      ("t11_simclr_degenerates_linear", 447, True, True),
                      ("t11_simclr_degenerates_zeroshot", 447, True, True),
                      ("t11_simclr_degenerates_retrieval", 447, True, True), ("t4_data_efficiency", 303, False, False)],
    "nclip-xclip.txt": [("xclip_finetune", 33, False, False), ("nclip_sts", 226, False, False),
                        ("nclip_multilabel", 150, False, False), ("xclip_small_batch", 238, False, False)],
    "clip-temperature-multi-class-tokens.txt": [
        ("temperature_batch_and_noise", 126, False, False), ("temperature_biased_init", 93, False, False),
        ("multitoken_eccv_map", 489, False, False), ("multitoken_vs_single_token", 851, False, False),
        ("multitoken_half_tokens", 992, False, False)],
    "pcl-protonce.txt": [("pcl_instance_only", 196, True, True), ("pcl_detection", 244, False, False),
                         ("pcl_balanced_clusters", 126, False, False)],
    "pauc-nemd.txt": [("pauc_in1k_vs_pcl_v2", 173, False, True)],
}


def test_issue59_headline_claims_are_declared_on_their_lines(planned):
    """Each is in the ledger on its line; judged where its runs are configured (a target's rows and a rule able to
    fail: a direction, or a magnitude bound), else unavailable with the reason. The offline default has no RN101 run:
    those rows read "not run" there from the runs' absence, not from `unavailable`."""
    paper_cfg, _ = planned
    offline_cfg = load_config(REPO / "config" / "config.yaml")
    for source, claims in HEADLINES_59.items():
        for cid, line, judged_offline, judged_paper in claims:
            for cfg, judged in ((offline_cfg, judged_offline), (paper_cfg, judged_paper)):
                c = next(c for c in cfg.paper_claims() if c.id == cid)
                assert (c.source, c.line) == (source, line), cid
                if c.unavailable:
                    assert not judged and len(c.unavailable.split()) >= 6, (cid, cfg.source)
                    continue
                assert c.direction != "none" or c.magnitude in ("at_least", "at_most"), cid
                target = next(t for t in cfg.paper_targets() if t.id == c.target)
                runs = [family(cfg, target, label, pinned) for label, pinned in ((c.a, c.a_runs), (c.b, c.b_runs))]
                assert all(runs) == judged, (cid, cfg.source, runs)
    # the v2 pair of PCL Table 3 is the number judged; Table 7's v1 ablation is its other citation
    v2 = next(c for c in offline_cfg.paper_claims() if c.id == "pcl_instance_only")
    assert (v2.paper_value, v2.margin, [a.line for a in v2.also]) == (0.1, 0.05, [327])
