"""`protoclip teacher`: PCA-reduced external-teacher features of the training captions, cached once.

    protoclip teacher --config config/config.yaml [--name roberta-large]

The work is :func:`protoclip.teacher.cache.run_teacher`; the job first takes its free GPU slots.
"""
from __future__ import annotations

import argparse

from protoclip.jobs import launch


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.add_argument("--name", help="teacher model name or path (default: teacher.name of the config)")


def main(args: argparse.Namespace) -> int:
    cfg = args.cfg
    if args.name:
        cfg.teacher.name = args.name
    with launch.place(cfg.gpus, launch.teacher_gpus(cfg), who=f"teacher {cfg.teacher.name}"):
        from protoclip.teacher.cache import run_teacher

        run_teacher(cfg)
    return 0
