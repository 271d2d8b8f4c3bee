"""A copy of the workflow in a temporary project, for tests that run Snakemake or DVC on it."""
from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from testkit import REPO
from testkit.corpus import SOURCE


def workflow_copy(root: Path, *, config: bool = False, code: bool = False, dvc: bool = False) -> Path:
    """``root`` (made here) holding the Snakefile, workflow/ and environment.yml; with ``config`` the shipped config/,
    with ``code`` src/protoclip (what DVC stages depend on), with ``dvc`` .dvcignore and .gitignore."""
    root.mkdir(parents=True)
    items = ["Snakefile", "workflow", "environment.yml"] + (["config"] if config else []) + \
        ([".dvcignore", ".gitignore"] if dvc else [])
    for item in items:
        src = REPO / item
        (shutil.copytree if src.is_dir() else shutil.copy)(src, root / item)
    if code:
        shutil.copytree(REPO / "src" / "protoclip", root / "src" / "protoclip",
                        ignore=shutil.ignore_patterns("__pycache__"))
    return root


def ci_fixture_config(ci_yaml: Path, experiments: list[str]) -> dict:
    """``ci_yaml`` (config/ci.yaml) on the fixture corpus (testkit.corpus, 96 training pairs; digits held out) with
    ``experiments`` only (their runs and targets), episodes of 48 in batches of 16 after every run's own overrides,
    and the fixture's Fashion-MNIST stand-in; no model copies in MLflow and no finished run's checkpoint (a tiny
    run's model.pt and open_clip export are ~100 MB of temporary disk). The paper's sets stay where ci.yaml looks
    for them (data/external/: absent, skipped)."""
    cfg = yaml.safe_load(ci_yaml.read_text())
    cfg["experiments"] = experiments
    cfg["prepare"].update(offline_sources=[], eval_sets=["digits"], heldout_fraction=0.2, user_data=[
        {"name": SOURCE, "format": "csv", "path": "userdata/pairs.csv", "label_key": "label"}])
    cfg["train_force"] = {**cfg["train_force"], "data": [SOURCE], "episode_size": 48, "batch_size": 16}
    cfg.setdefault("paths", {}).update(mlflow_log_models=False, keep_finished_checkpoints=False)
    cfg["evaluate"]["datasets"]["fashion_mnist"] = {"kind": "offline", "path": "fixtures/fashion_mnist.npz"}
    return cfg
