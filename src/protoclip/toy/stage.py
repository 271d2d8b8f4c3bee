"""`protoclip toy-nemd`: PAUC's toy experiment (PCL vs PAUC on 3-D blobs, NEMD per class count).

    protoclip toy-nemd --config config/config.yaml   # -> results/toy/

:func:`run_toy_nemd` is the stage's entry: of the project config it reads the ``toy`` section and the layout, and
hands them to :func:`protoclip.toy.pauc_nemd.toy_nemd`.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from protoclip.files.layout import Layout
from protoclip.toy.config import ToyProject
from protoclip.toy.pauc_nemd import toy_nemd


def run_toy_nemd(cfg: ToyProject, layout: Layout | None = None) -> Path:
    """The figure and tables of the toy experiment of ``cfg.toy``; returns the figure's path."""
    return toy_nemd(cfg.toy, layout or Layout.from_config(cfg))


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    """The stage reads only ``--config``."""


def main(args: argparse.Namespace) -> int:
    run_toy_nemd(args.cfg)
    return 0
