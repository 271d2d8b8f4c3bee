"""`protoclip prepare`: the pinned packages and user data -> caption pairs, manifest, report, eval sets.

    protoclip prepare --config config/config.yaml

:func:`run_prepare` is the stage's entry: of the project config it reads the ``prepare`` section and the layout,
and hands them to :func:`protoclip.data.corpus.prepare.prepare_corpus`.
"""
from __future__ import annotations

import argparse

from protoclip.data.config import PrepareProject
from protoclip.data.corpus.prepare import prepare_corpus
from protoclip.files.layout import Layout


def run_prepare(cfg: PrepareProject) -> dict:
    """Build (or confirm up to date) every prepared output of ``cfg.prepare``; returns the report dict."""
    return prepare_corpus(cfg.prepare, Layout.from_config(cfg))


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    """The stage reads only ``--config``."""


def main(args: argparse.Namespace) -> int:
    run_prepare(args.cfg)
    return 0
