"""A copy of the workflow in a temporary project, for tests that run Snakemake or DVC on it."""
from __future__ import annotations

import shutil
from pathlib import Path

from testkit import REPO


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
