"""`protoclip prepare`: the pinned packages and user data -> caption pairs, manifest, report, eval sets.

    protoclip prepare --config config/config.yaml

The work is :func:`protoclip.data.corpus.prepare.run_prepare`; this module is the stage's command line.
"""
from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    """The stage reads only ``--config``."""


def main(args: argparse.Namespace) -> int:
    from protoclip.data.corpus.prepare import run_prepare

    run_prepare(args.cfg)
    return 0
