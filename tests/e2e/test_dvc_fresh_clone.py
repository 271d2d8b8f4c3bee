"""End to end: `dvc repro` of one run's chain in a fresh clone of the repository, then Snakemake and DVC agree on
what is up to date: after the run (nothing to do / clean), after a comment edit under src/ (the same), after a
code edit of one stage's command (that stage, and Snakemake's jobs downstream of it).

The clone is ``git clone`` of this checkout's HEAD (its own src/ on PYTHONPATH: the code the stages run and the
edits touch); its config is config/ci.yaml with the fixture data of tests/e2e/test_pipeline_ci.py (drawn shapes as
user data, a fixture Fashion-MNIST, scikit-learn's digits: no downloads) and one experiment file; dvc.yaml is
generated for it by `protoclip dvc-yaml`, as docs/dvc.md says for a config other than the default.
Cost: 75 CPU s, 2.4 min wall on the 2-core dev machine shared with other test runs (load 8-10; 3.7 min at
worst): prepare, one training, three evaluations, collect, five Snakemake / DVC status calls, one `--touch`.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import yaml

from protoclip.dag.code_version import FINGERPRINTS
from testkit import REPO
from testkit.corpus import fixture_corpus, fixture_labelled_set
from testkit.processes import project_env, run
from testkit.workflow import ci_fixture_config

RUN = "clip_tiny_s0"
CONFIG = "config/ci_fixture.yaml"
GIT = dict(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")


def jobs_of(dry_run: str) -> dict[str, int]:
    """{rule: job count} of a `snakemake -n` output's job stats ({} when there is nothing to do)."""
    if "Job stats:" not in dry_run:
        return {}
    table = dry_run.split("Job stats:")[1].split("total")[0]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)\s*$", table, re.M)}


def test_fresh_clone_dvc_repro_and_both_tools_agree_on_up_to_date(tmp_path):
    clone = tmp_path / "clone"
    env = project_env(PYTHONPATH=str(clone / "src"), **GIT)

    def sh(*cmd: str, check: bool = True):
        return run(list(cmd), clone, env=env, check=check)

    run(["git", "clone", "-q", str(REPO), str(clone)], tmp_path, env=env)
    fixture_corpus(clone)
    (clone / "fixtures").mkdir()
    fixture_labelled_set(clone / "fixtures" / "fashion_mnist.npz")
    cfg = ci_fixture_config(clone / "config" / "ci.yaml", ["experiments/table_V.yaml"])  # its runs and targets
    (clone / CONFIG).write_text(yaml.safe_dump(cfg, sort_keys=False))
    sh("protoclip", "dvc-yaml", "--config", CONFIG)
    stages = yaml.safe_load((clone / "dvc.yaml").read_text())["stages"]
    summary = next(iter(stages[f"collect_{RUN}"]["metrics"]))
    chain = ["prepare", f"train_{RUN}", *(s for s in stages if s.startswith(f"evaluate_{RUN}_")), f"collect_{RUN}"]

    def dvc_status() -> dict:
        """{stage: what changed} of the chain ({}: up to date)."""
        return json.loads(sh(sys.executable, "-m", "dvc", "status", "--json", "--with-deps", f"collect_{RUN}").stdout)

    def snakemake_dry() -> dict[str, int]:  # also rewrites code-fingerprints.yaml from the code, as every call does
        return jobs_of(sh(sys.executable, "-m", "snakemake", summary, "-n", "--configfile", CONFIG).stdout)

    sh(sys.executable, "-m", "dvc", "repro", f"collect_{RUN}")
    assert (clone / summary).is_file()
    lock = yaml.safe_load((clone / "dvc.lock").read_text())["stages"]
    assert set(lock) == set(chain) and len(chain) == 6, sorted(lock)  # prepare, train, 3 evaluations, collect
    assert dvc_status() == {}
    assert snakemake_dry() == {}
    # Snakemake's metadata (the params its rerun trigger compares), as `make checkout` records it after `dvc pull`
    # (the target before --configfile, which takes every file name after it)
    sh(sys.executable, "-m", "snakemake", summary, "--cores", "1", "--touch", "--forceall", "--configfile", CONFIG)

    # a comment and a docstring: neither tool reruns anything
    prepare, loop = clone / "src/protoclip/data/corpus/prepare.py", clone / "src/protoclip/train/loop.py"
    code = yaml.safe_load((clone / FINGERPRINTS).read_text())
    prepare.write_text(prepare.read_text() + "\n# a comment\n")
    loop.write_text(loop.read_text().replace('"""', '"""Edited. ', 1))
    assert snakemake_dry() == {}
    assert dvc_status() == {}
    assert yaml.safe_load((clone / FINGERPRINTS).read_text()) == code

    # code of `prepare` only (data/corpus/prepare.py: imported by `protoclip prepare`, by no other stage's command): DVC
    # reports the prepare stage (its code param), Snakemake reruns it and, as it always does, every job after it
    prepare.write_text(prepare.read_text() + "EDITED = 1\n")
    assert snakemake_dry() == {"prepare": 1, "train": 1, "evaluate": 3, "collect": 1}
    edited = yaml.safe_load((clone / FINGERPRINTS).read_text())
    assert {k for k in code if edited[k] != code[k]} == {"prepare"}
    assert dvc_status() == {"prepare": [{"changed deps": {FINGERPRINTS: {"prepare": "modified"}}}]}
