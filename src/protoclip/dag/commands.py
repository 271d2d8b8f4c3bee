"""`protoclip runs` (the configured run names) and `protoclip dvc-yaml` (dvc.yaml from the stage graph, and the
code fingerprints its stages read as params, code-fingerprints.yaml beside it)."""
from __future__ import annotations

import argparse
from pathlib import Path

from protoclip.dag.code_version import FINGERPRINTS, write_fingerprints
from protoclip.files.atomic import write_text


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    if name == "dvc-yaml":
        p.add_argument("--output", default="dvc.yaml")


def main(args: argparse.Namespace) -> int:
    if args.stage == "runs":
        print("\n".join(args.cfg.run_names()))
        return 0
    from protoclip.dag.stages import dvc_yaml_text  # heavy: pandas, only dvc-yaml reads the stage table

    write_text(args.output, dvc_yaml_text(args.cfg, args.config))
    write_fingerprints(Path(args.output).parent / FINGERPRINTS)
    return 0
