"""`protoclip teacher`: PCA-reduced external-teacher features of the training captions, cached once.

    protoclip teacher --config config/config.yaml [--name roberta-large]

:func:`run_teacher` is the stage's entry: of the project config it reads the ``teacher`` section and the layout,
and hands them to :func:`protoclip.teacher.cache.build_cache`; the command first takes the job's free GPU slots.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from protoclip.files.layout import Layout
from protoclip.jobs import launch
from protoclip.teacher.config import TeacherProject

if TYPE_CHECKING:  # the encoders import torch: loaded only once the job holds its GPUs
    from protoclip.teacher.encoders import TextTeacher


def run_teacher(cfg: TeacherProject, teacher: TextTeacher | None = None) -> Path:
    """Write the cache of ``cfg.teacher.name`` (:func:`protoclip.teacher.cache.build_cache`); returns its path.
    ``teacher`` overrides loading the named model (tests, or a model already in memory)."""
    from protoclip.teacher.cache import build_cache  # heavy: torch, after `main` placed the job on its GPUs

    return build_cache(cfg.teacher, Layout.from_config(cfg), teacher)


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.add_argument("--name", help="teacher model name or path (default: teacher.name of the config)")


def main(args: argparse.Namespace) -> int:
    cfg = args.cfg
    if args.name:
        cfg.teacher.name = args.name
    with launch.place(cfg.gpus, launch.teacher_gpus(cfg), who=f"teacher {cfg.teacher.name}"):
        run_teacher(cfg)
    return 0
