"""`protoclip toy-nemd`: PAUC's toy experiment (PCL vs PAUC on 3-D blobs, NEMD per class count).

    protoclip toy-nemd --config config/config.yaml   # -> results/toy/

The work is :func:`protoclip.toy.pauc_nemd.run_toy_nemd`.
"""
from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    """The stage reads only ``--config``."""


def main(args: argparse.Namespace) -> int:
    from protoclip.toy.pauc_nemd import run_toy_nemd

    run_toy_nemd(args.cfg)
    return 0
