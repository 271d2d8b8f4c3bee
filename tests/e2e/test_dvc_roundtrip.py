"""End to end: `snakemake` on a tiny project in a temp git + DVC repository records every output in dvc.lock
(`dvc status` clean, `dvc repro` does nothing), `dvc push` to a local-folder remote uploads them, and a fresh clone
with `dvc pull` has everything: `snakemake -n` finds nothing to do, even with file times rewritten.

The tiny project: 40 drawn PNGs as a user_data CSV (no Debian downloads), no offline eval set (the held-out pairs
are evaluated), one CLIP run of 2 episodes, and a configured external set whose path does not exist (reported
skipped).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

from testkit.processes import project_env, run
from testkit.workflow import workflow_copy

TINY_RUN = {"method": "clip", "teacher": None, "data": ["tiny"], "model": "tiny-rn", "head_hidden": 32,
            "head_out": 16, "epochs": 2.0, "episode_size": 16, "batch_size": 8, "warmup_episodes": 1,
            "lock_image_epoch": None, "num_workers": 0, "device": "cpu"}


GIT = dict(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")


def sh(cwd: Path, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    # the project's own copy of the code (fixed for the test: the stages' code fingerprints are of the code run)
    return run(list(cmd), cwd, env=project_env(PYTHONPATH=str(cwd / "src"), **GIT), check=check)


def snakemake(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return sh(cwd, sys.executable, "-m", "snakemake", "--cores", "1", *args, check=check)


def dvc(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return sh(cwd, sys.executable, "-m", "dvc", *args, check=check)


def tiny_config(external: Path) -> dict:
    return {
        "paths": {"data_dir": "data", "results_dir": "results", "mlflow_uri": "sqlite:///results/mlflow.db",
                  "mlflow_experiment": "roundtrip"},
        "prepare": {"image_size": 64, "offline_sources": [], "eval_sets": [],
                    "user_data": [{"name": "tiny", "format": "csv", "path": "userdata/pairs.csv",
                                   "split": "auto"}]},
        "train": {},
        "runs": {"clip_a": TINY_RUN},
        "evaluate": {"batch_size": 64, "device": "cpu",
                     "datasets": {"heldout_pairs": {"kind": "offline", "tasks": ["retrieval"]},
                                  "cifar10": {"kind": "torchvision", "path": str(external)}}},
    }


def make_project(root: Path, tiny_pairs: list[dict], remote: Path) -> None:
    workflow_copy(root, code=True, dvc=True)
    (root / "userdata").mkdir()
    lines = ["filepath,caption"]
    for i, p in enumerate(tiny_pairs):
        shutil.copy(p["path"], root / "userdata" / f"{i:03d}.png")
        lines.append(f"{i:03d}.png,{p['caption']}")
    (root / "userdata" / "pairs.csv").write_text("\n".join(lines) + "\n")
    (root / "config").mkdir()
    (root / "config" / "config.yaml").write_text(yaml.safe_dump(tiny_config(root / "data/external/cifar10"),
                                                                sort_keys=False))
    sh(root, "git", "init", "-q")
    dvc(root, "init", "-q")
    dvc(root, "remote", "add", "-d", "local", str(remote))
    sh(root, "protoclip", "dvc-yaml", "--config", "config/config.yaml")
    sh(root, "git", "add", "-A")
    sh(root, "git", "commit", "-q", "-m", "tiny project")


def outputs(root: Path) -> dict[str, bytes]:
    """Every file under data/prepared and results/ that a stage outputs (not the MLflow store, not logs, not caches)."""
    out = {}
    for top in ("data/prepared", "results/runs", "results/tables"):
        for p in sorted((root / top).rglob("*")):
            # not outputs: checkpoints/ (work in progress of --resume), features/ (the evaluation's feature cache,
            # kept out of DVC unless evaluate.track_features), Snakemake's mtime carrier in a folder (.dvcignore)
            if p.is_file() and not {"checkpoints", "features"} & set(p.parts) and p.name != ".snakemake_timestamp":
                out[str(p.relative_to(root))] = p.read_bytes()
    return out


def test_snakemake_outputs_are_dvc_tracked_and_survive_push_clone_pull(tmp_path, tiny_pairs):
    root, remote, clone = tmp_path / "proj", tmp_path / "remote", tmp_path / "clone"
    make_project(root, tiny_pairs, remote)

    run = snakemake(root)
    assert "dvc.lock records" in run.stderr, run.stderr[-3000:]
    assert (root / "results/runs/clip_a/model.pt").is_file()
    metrics = json.loads((root / "results/runs/clip_a/metrics.json").read_text())
    assert "R@1" in json.dumps(metrics["retrieval"]["heldout_pairs"])
    assert metrics["zeroshot"]["cifar10"]["skipped"].startswith("skipped: cifar10 not found")

    lock = yaml.safe_load((root / "dvc.lock").read_text())["stages"]
    stages = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]
    assert set(lock) == set(stages)  # every stage recorded, the skipped set has none
    assert "evaluate_clip_a_cifar10" not in stages and "evaluate_clip_a_heldout_pairs" in stages
    # the code a stage runs: its command's fingerprint, the value the Snakemake rule's `code` param holds
    code = yaml.safe_load((root / "code-fingerprints.yaml").read_text())
    assert lock["train_clip_a"]["params"]["code-fingerprints.yaml"] == {"train": code["train"]}
    assert "Data and pipelines are up to date" in dvc(root, "status").stdout
    assert "Stage 'train_clip_a' didn't change, skipping" in dvc(root, "repro", "--dry").stdout + \
        dvc(root, "repro", "--dry").stderr
    assert "Nothing to be done" in snakemake(root, "-n").stdout

    dvc(root, "push", "-q")
    sh(root, "git", "add", "dvc.lock")
    sh(root, "git", "commit", "-q", "-m", "lock")
    made = outputs(root)

    sh(tmp_path, "git", "clone", "-q", str(root), str(clone))
    dvc(clone, "pull", "-q")
    assert outputs(clone) == made  # data and results restored byte for byte
    assert "Data and pipelines are up to date" in dvc(clone, "status").stdout
    # dvc pull writes files in its own order and a clone has no Snakemake metadata; Snakemake 9 always reruns a
    # job whose input is newer than its output, so `make pull` ends with `snakemake --touch --forceall` (once dvc
    # status is clean): file times in DAG order and every job's params recorded, nothing recomputed
    touch = snakemake(clone, "--touch", "--forceall")
    assert "Data and pipelines are up to date" in dvc(clone, "status").stdout
    dry = snakemake(clone, "-n")
    assert "Nothing to be done" in dry.stdout, dry.stdout + dry.stderr + touch.stderr[-2000:]
    assert outputs(clone) == made

    # the same after dvc checkout with an input made newer than its job's outputs (model.pt: over Snakemake's
    # 1 MB checksum limit, so only its time counts; small files are compared by the checksums --touch recorded)
    later = time.time() + 60
    os.utime(clone / "results/runs/clip_a/model.pt", (later, later))
    dvc(clone, "checkout", "--force", "-q")
    assert "updated input files" in snakemake(clone, "-n").stdout  # what --touch is for
    assert dvc(clone, "status", "-q").returncode == 0
    snakemake(clone, "--touch", "--forceall")
    dry = snakemake(clone, "-n")
    assert "Nothing to be done" in dry.stdout, dry.stdout + dry.stderr

    # a changed setting is seen: the evaluation of the held-out pairs (only) reruns, then collect and report
    cfg = yaml.safe_load((clone / "config/config.yaml").read_text())
    cfg["evaluate"]["datasets"]["heldout_pairs"]["tasks"] = ["retrieval", "knn"]
    (clone / "config/config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    dry = snakemake(clone, "-n")
    jobs = dry.stdout.split("Job stats:")[1].split("total")[0]
    assert "evaluate        1" in jobs and "train" not in jobs, jobs

    # ... and running it records just the jobs that ran (onsuccess commits what this run made, not every stage)
    sh(clone, sys.executable, "-m", "protoclip.cli", "dvc-yaml", "--config", "config/config.yaml")
    run = snakemake(clone)
    ran = re.findall(r"dvc\.lock records (\d+) stage", run.stderr)
    assert ran == ["3"], (ran, run.stderr[-2000:])  # evaluate (held-out pairs), collect, report
    assert "Data and pipelines are up to date" in dvc(clone, "status").stdout
    assert "Nothing to be done" in snakemake(clone, "-n").stdout
