"""Paper numbers are printed as the paper prints them, in every table format (41.30 stays 41.30, 27.2 stays 27.2,
56.0 stays 56.0), and Tables V-VIII carry the paper's "+/-" rows (ProtoCLIP minus CLIP, as printed) with ours
(the difference of our means) beside them. The expected strings come from reading paper_numbers.yaml with YAML's
BaseLoader (every scalar a string) and from the paper text, not from the report code."""
from __future__ import annotations

import html
import re

import numpy as np
import pandas as pd
import pytest
import yaml

from protoclip.project import load_config
from testkit import REPO
from testkit.reports import PAPER_TXT, metric_value, project_copy, synthesize

YAML = REPO / "src" / "protoclip" / "report" / "paper_numbers.yaml"
LITERAL = yaml.load(YAML.read_text("utf-8"), Loader=yaml.BaseLoader)
DIFF_TABLES = ("table_V", "table_VI", "table_VII", "table_VIII")


def md_rows(md: str) -> dict[str, dict[str, str]]:
    """{row label: {column header: cell}} of the markdown table in a report .md file."""
    lines = [ln for ln in md.splitlines() if ln.startswith("|")]
    split = lambda ln: [c.strip() for c in ln.strip().strip("|").split("|")]
    header = split(lines[0])
    return {cells[0]: dict(zip(header, cells)) for cells in map(split, lines[2:])}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    from protoclip.report.stage import run_report

    tmp = tmp_path_factory.mktemp("printing")
    cfg = load_config(project_copy(tmp))
    synthesize(cfg)
    run_report(cfg)
    return cfg, tmp / "results" / "tables"


def test_every_paper_number_is_printed_as_transcribed_in_every_format(report):
    cfg, tables = report
    checked = 0
    for t in cfg.paper_targets():
        entry = LITERAL.get(t.paper_key or t.id) or {}
        if t.kind != "table" or not entry.get("rows"):
            continue
        md = md_rows((tables / f"{t.id}.md").read_text())
        csv = pd.read_csv(tables / f"{t.id}.csv", header=[0, 1], index_col=0, dtype=str, keep_default_na=False)
        page = (tables / f"{t.id}.html").read_text()
        tex_cells = {c.strip().rstrip("\\").strip() for ln in (tables / f"{t.id}.tex").read_text().splitlines()
                     for c in ln.split("&")}
        for row in t.rows:
            for col in t.columns:
                printed = (entry["rows"].get(row.paper_key) or {}).get(col.paper_key)
                if printed is None:
                    continue
                assert md[row.label][f"{col.label} (paper)"] == printed, (t.id, row.label, col.label)
                assert csv.loc[row.label, (col.label, "paper")] == printed, (t.id, row.label, col.label)
                assert f"<td>{html.escape(printed)}</td>" in page, (t.id, printed)
                assert printed in tex_cells, (t.id, printed)
                checked += 1
    # the cases the issue names: trailing zeros kept, Table IV's quoted 27.2 not padded to 27.20
    t3 = md_rows((tables / "table_III.md").read_text())
    assert t3["CLIP"]["ImageNet linear (paper)"] == "41.30"
    t4 = md_rows((tables / "table_IV.md").read_text())
    assert t4["▷ DeCLIP [33] (2.9M, 31 ep)"]["ImageNet zero-shot top-1 (paper)"] == "27.2"
    assert md_rows((tables / "table_V.md").read_text())["RN50 CLIP"]["K-NN IN (paper)"] == "56.0"
    assert checked > 300


def test_difference_rows_follow_each_protoclip_row_with_ours_and_the_papers(report):
    cfg, tables = report
    t5 = pd.read_csv(tables / "table_V.csv", header=[0, 1], index_col=0, dtype=str, keep_default_na=False)
    labels = list(t5.index)
    assert labels[labels.index("RN50 ProtoCLIP") + 1] == "RN50 ProtoCLIP - CLIP"
    assert labels[labels.index("RN101 ProtoCLIP") + 1] == "RN101 ProtoCLIP - CLIP"
    diff = t5.loc["RN50 ProtoCLIP - CLIP"]
    assert diff[("K-NN IN", "paper")] == "+0.8" and diff[("Zero-shot IN", "paper")] == "-0.7"  # as printed
    # ours: mean over seeds of each run group's mean over the offline stand-ins, then the difference
    sets = ["heldout_pairs", "fashion_mnist", "digits"]

    def group_mean(base):
        return np.mean([np.mean([metric_value(r, "linear", d, "top1") for d in sets]) for r in cfg.run_group(base)])

    expect = group_mean("protoclip_tiny") - group_mean("clip_tiny")
    assert diff[("Linear 9 Avg.", "ours")] == f"{expect:+.2f}"
    assert t5.loc["RN101 ProtoCLIP - CLIP", ("Linear IN", "ours")] == "-"  # RN101 rows are not configured
    for t in DIFF_TABLES:
        md = md_rows((tables / f"{t}.md").read_text())
        for label, d in LITERAL[t]["differences"].items():
            for col, printed in d["values"].items():
                assert md[label][f"{col} (paper)"] == printed, (t, label, col)


@pytest.mark.skipif(not PAPER_TXT.exists(), reason="the paper text is not on this machine")
@pytest.mark.parametrize("table", DIFF_TABLES)
def test_transcribed_differences_are_the_papers_printed_rows(table):
    """Each `differences` entry is, in order and as text, the "+/-" row under its ProtoCLIP row in the paper text."""
    text = PAPER_TXT.read_text()
    start = text.index(f"TABLE {table.split('_')[1]}\n")
    block = text[start:].split("\n\n", 3)
    rows = [[c.strip() for c in ln.strip().strip("|").split("|")]
            for part in block[1:3] for ln in part.splitlines() if ln.startswith("|")]
    printed = [[c for c in r if c] for r in rows if not r[0] and not r[1] and any(re.fullmatch(r"[+-]\d+\.\d+", c)
                                                                                 for c in r)]
    ours = [list(d["values"].values()) for d in LITERAL[table]["differences"].values()]
    assert ours == printed
    for d in LITERAL[table]["differences"].values():  # each is ProtoCLIP minus CLIP, up to the paper's rounding
        for col, v in d["values"].items():
            a, b = LITERAL[table]["rows"][d["minuend"]][col], LITERAL[table]["rows"][d["subtrahend"]][col]
            assert abs(float(a) - float(b) - float(v)) <= 0.1 + 1e-9, (table, col)


def test_fig_9_shows_phase_times_as_shares_of_clips_epoch_time(report):
    from protoclip.report.figures import time_split_per_epoch, time_split_shares
    from protoclip.report.values import Results

    cfg, tables = report
    fig9 = next(t for t in cfg.paper_targets() if t.id == "fig_9")
    base, shares = time_split_shares(time_split_per_epoch(cfg, Results(cfg), fig9))
    # synthesize(): run i of cfg.run_names() logs 3 episodes of extract 1 + i, k-means 0.1, PBT 0.01, train 3 + i
    # seconds (CLIP runs: train only)
    names = cfg.run_names()
    clip_runs, proto_runs = cfg.run_group("clip_tiny"), cfg.run_group("protoclip_tiny")
    clip_epoch = np.mean([3 * (3.0 + names.index(r)) for r in clip_runs]) / cfg.run(clip_runs[0]).epochs
    extract = np.mean([3 * (1.0 + names.index(r)) for r in proto_runs]) / cfg.run(proto_runs[0]).epochs
    assert base == "clip"
    assert shares["ProtoCLIP"]["extract"] == pytest.approx(100 * extract / clip_epoch)
    assert shares["CLIP"]["train"] == pytest.approx(100.0) and shares["CLIP"]["extract"] == 0.0
    caption = (tables.parent / "report" / "fig_9.rst").read_text()
    assert "ambiguous" in caption and "CLIP's epoch time" in caption


def test_table_xi_no_augmentation_row_is_like_for_like_with_the_papers(report):
    """The paper's "No Augmentation" numbers are Table III's "- w/o augmentation" run (no external teacher): the
    row is filled by that same run, and its label says so."""
    cfg, tables = report
    t11 = next(t for t in cfg.paper_targets() if t.id == "table_XI")
    row = next(r for r in t11.rows if r.paper_key == "No Augmentation")
    t3 = next(t for t in cfg.paper_targets() if t.id == "table_III")
    assert row.run == next(r.run for r in t3.rows if r.label == "- w/o augmentation")
    rc = cfg.run(cfg.run_group(row.run)[0])
    assert rc.teacher is None and rc.augmentation == "none" and rc.method == "protoclip"
    md = md_rows((tables / "table_XI.md").read_text())
    assert md[row.label]["ImageNet Linear Acc. (paper)"] == "44.39" and "no external teacher" in row.label
    assert LITERAL["table_III"]["rows"]["- w/o augmentation"]["ImageNet linear"] == "44.39"


def test_the_report_uses_the_jobs_threads_else_every_cpu_it_may_run_on():
    """Snakemake exports OMP_NUM_THREADS = the rule's threads: the ledger's AMI resamples use that many
    processes; by hand (unset or unreadable) every CPU of the process's affinity."""
    import os

    from protoclip.report.stage import job_cpus

    assert job_cpus({"OMP_NUM_THREADS": "3"}) == 3
    assert job_cpus({"OMP_NUM_THREADS": "0"}) == 1
    assert job_cpus({}) == job_cpus({"OMP_NUM_THREADS": "many"}) == len(os.sched_getaffinity(0))
