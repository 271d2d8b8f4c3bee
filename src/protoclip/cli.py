"""`protoclip <stage>`: the one entry point every Snakemake rule and DVC stage calls.

It parses the command line, loads the config and runs the command's module (:data:`COMMANDS`: ``protoclip --help``
lists them, ``protoclip <command> --help`` gives each one's options). A user's error ends as one line, exit code 2;
any other exception is a bug and keeps its traceback.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from dataclasses import dataclass

from protoclip.jobs import forkserver, launch
from protoclip.errors import UserError
from protoclip.jobs.gpu_slots import SlotError


@dataclass(frozen=True)
class Command:
    """A ``protoclip`` subcommand: the module whose ``add_arguments(parser)`` and ``main(args)`` run it."""

    module: str
    help: str
    config: bool = True  # reads the project config (``--config``; ``args.cfg`` is the loaded config)


# the stages of the DAG first (each ``<package>/stage.py``), then the tools; a module is imported only when its
# command runs, so `protoclip report` never imports torch
COMMANDS: dict[str, Command] = {
    "prepare": Command("protoclip.data.stage",
                       "download pinned packages, build the offline default data and eval sets"),
    "teacher": Command("protoclip.teacher.stage", "cache PCA-reduced external-teacher caption features"),
    "train": Command("protoclip.train.stage", "train one configured run (clip, protoclip, nclip, xclip, ...)"),
    "evaluate": Command("protoclip.evaluate.stage", "evaluate a trained run"),
    "collect": Command("protoclip.evaluate.collect",
                       "gather a run's metrics files into results/runs/<run>/metrics.json"),
    "report": Command("protoclip.report.stage", "regenerate tables and figures from metrics files"),
    "toy-nemd": Command("protoclip.toy.stage", "PAUC's toy experiment: PCL vs PAUC on 3-D blobs, NEMD per class count"),
    "export": Command("protoclip.models.export_openclip",
                      "write a trained run as an open_clip model folder (open_clip local-dir:, CLIP_benchmark)"),
    "runs": Command("protoclip.dag.commands", "print the configured run names, one per line"),
    "dvc-yaml": Command("protoclip.dag.commands", "write dvc.yaml: the same stage commands as the Snakemake rules"),
    "launch": Command("protoclip.jobs.launch", "run a command on free GPU slots (CUDA_VISIBLE_DEVICES set for its process "
                      "tree)"),
    # the paper's sets whose download no reader takes; no config needed
    "birdsnap": Command("protoclip.data.corpus.paper_evalsets", "Birdsnap's download -> train/ test/ class folders "
                        "(kind: folder)", config=False),
    "ucf101": Command("protoclip.data.corpus.paper_evalsets", "UCF101 videos -> the middle frame of each, in class "
                      "folders (kind: folder)", config=False),
    "forkserver": Command("protoclip.jobs.forkserver", "run a command (snakemake) whose `protoclip train` / "
                          "`evaluate` jobs start as forks of one process that imported torch once", config=False),
    "schema": Command("protoclip.dag.schema", "write the config's JSON Schema and config/README.md from the "
                      "config classes", config=False),
}


class _Version(argparse.Action):
    """``--version``, worked out only when asked (it runs git)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="print the version, the code's commit and the main libraries', then exit")

    def __call__(self, parser, namespace, values, option_string=None):
        from protoclip.files.provenance import version_line  # heavy: importlib.metadata, only for --version

        print(version_line())
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="protoclip", description=__doc__.split("\n\n")[0])
    p.add_argument("--version", action=_Version)
    sub = p.add_subparsers(dest="stage", required=True)
    for name, command in COMMANDS.items():
        sub.add_parser(name, help=command.help, add_help=False)
    return p


def command_parser(name: str) -> tuple[argparse.ArgumentParser, object]:
    """The argument parser of command ``name`` and the module that runs it."""
    command = COMMANDS[name]
    module = importlib.import_module(command.module)
    p = argparse.ArgumentParser(prog=f"protoclip {name}", description=command.help)
    if command.config:
        p.add_argument("--config", default="config/config.yaml", help="project config (YAML)")
    module.add_arguments(p, name)
    return p, module


def main(argv: list[str] | None = None) -> int:
    """Run ``protoclip <argv>``; its exit code. A ``protoclip.errors.UserError``, a GPU placement that fails or a
    missing input is printed as one line naming the key or path, exit code 2; every other exception is a bug and
    keeps its traceback."""
    argv = sys.argv[1:] if argv is None else list(argv)
    stage = _parser().parse_args(argv[:1]).stage
    launch.follow_job()  # a workflow job's command ends with its job (PROTOCLIP_JOB_PID), not after it
    if (code := forkserver.delegate(argv)) is not None:  # run as a fork of `protoclip forkserver`'s process
        return code
    parser, module = command_parser(stage)
    args = parser.parse_args(argv[1:])
    args.stage, args.argv = stage, argv  # torchrun restarts `train` with the same argv
    launch.progress_for_logs()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    try:
        from protoclip.project import load_config  # heavy: numpy, a command handed to the fork server never needs it

        args.cfg = load_config(args.config) if COMMANDS[stage].config else None
        return module.main(args) or 0
    except SlotError as err:
        print(f"protoclip {stage}: GPU placement: {err}", file=sys.stderr)
        return 2
    # ConfigError, ModelFileError, an unreadable checkpoint, a training stopped on NaN/Inf, ...: the user's input
    # (or a diverged run), not a bug: one line, no traceback
    except UserError as err:
        message = " ".join(str(err).splitlines())  # one line, even for a message quoting a multi-line value
        print(f"protoclip {stage}: {err.kind}: {message}", file=sys.stderr)
        return 2
    except FileNotFoundError as err:  # a configured input (user data, teacher cache, model) is missing
        print(f"protoclip {stage}: input not found: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
