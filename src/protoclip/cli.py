"""`protoclip <stage>`: the one entry point every Snakemake rule and DVC stage calls.

    protoclip prepare  --config config/config.yaml
    protoclip teacher  --config config/config.yaml [--name roberta-large]
    protoclip train    --config config/config.yaml --run protoclip_tiny_s0 [--resume]
    protoclip evaluate --config config/config.yaml --run protoclip_tiny_s0 [--task knn] [--dataset digits]
    protoclip collect  --config config/config.yaml --run protoclip_tiny_s0   # metrics files -> metrics.json
    protoclip report   --config config/config.yaml
    protoclip export   --config config/config.yaml --run clip_tiny_s0 [--out DIR]   # open_clip local-dir: folder
    protoclip toy-nemd --config config/config.yaml  # PAUC's NEMD toy experiment (results/toy/)
    protoclip runs     --config config/config.yaml      # list the configured runs
    protoclip dvc-yaml --config config/config.yaml      # regenerate dvc.yaml from the same stage commands
    protoclip launch   --config config/config.yaml --gpus 2 -- <command>   # a command on 2 free GPUs
    protoclip birdsnap --src /data/birdsnap --out data/external/birdsnap   # Birdsnap's lists -> class folders
    protoclip ucf101   --src /data/ucf101 --out data/external/ucf101       # UCF101 test videos -> middle frames
    protoclip schema   [--check]   # the config's JSON Schema (workflow/schemas/) and config/README.md, generated

`train`, `evaluate` and `teacher` place themselves on free GPUs first (protoclip.launch): a run with ``gpu: k``
takes k GPU slots and restarts as k torchrun ranks. `train` first holds its run (protoclip.run_lock: one trainer
per run; a second waits with one line naming the holder). A command whose environment names its job's process
(``PROTOCLIP_JOB_PID``, set by the train rule) ends when that process or the job's shell ends
(protoclip.launch.follow_job).

Stages are pure functions of (config, inputs) -> outputs; this module only parses the command line,
loads and validates the config, and turns a user error raised anywhere in a stage (a bad config value, an
unreadable data or model file: any ``protoclip.errors.UserError``) or a missing input into a one-line message
naming the key or path, with exit code 2. Every other exception is a bug and keeps its traceback.
"""
from __future__ import annotations

import argparse
import os
import logging
import sys

from protoclip import launch, run_lock
from protoclip.config import load_config
from protoclip.errors import UserError
from protoclip.gpu_slots import SlotError
from protoclip.layout import Layout


class _Version(argparse.Action):
    """``--version``, worked out only when asked (it runs git)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="print the version, the code's commit and the main libraries', then exit")

    def __call__(self, parser, namespace, values, option_string=None):
        from protoclip.provenance import version_line

        print(version_line())
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="protoclip", description=__doc__.split("\n\n")[0])
    p.add_argument("--version", action=_Version)
    sub = p.add_subparsers(dest="stage", required=True)

    def stage(name: str, help: str) -> argparse.ArgumentParser:
        s = sub.add_parser(name, help=help)
        s.add_argument("--config", default="config/config.yaml", help="project config (YAML)")
        return s

    stage("prepare", "download pinned packages, build the offline default data and eval sets")
    s = stage("teacher", "cache PCA-reduced external-teacher caption features")
    s.add_argument("--name", help="teacher model name or path (default: teacher.name of the config)")
    s = stage("train", "train one configured run (clip, protoclip, nclip, xclip, ...)")
    s.add_argument("--run", required=True, help="run name from the experiment files")
    s.add_argument("--resume", action="store_true", help="continue from the last complete episode")
    s = stage("evaluate", "evaluate a trained run")
    s.add_argument("--run", required=True)
    s.add_argument("--task", action="append", help="task(s) to run (default: every configured task)")
    s.add_argument("--dataset", action="append", help="data set(s) to run (default: every configured set)")
    s = stage("collect", "gather a run's metrics files into results/runs/<run>/metrics.json")
    s.add_argument("--run", required=True)
    stage("report", "regenerate tables and figures from metrics files")
    s = stage("export", "write a trained run as an open_clip model folder (open_clip local-dir:, CLIP_benchmark)")
    s.add_argument("--run", required=True)
    s.add_argument("--out", help="output folder (default: <results_dir>/export/<run>)")
    stage("toy-nemd", "PAUC's toy experiment: PCL vs PAUC on 3-D blobs, NEMD per class count")
    stage("runs", "print the configured run names, one per line")
    s = stage("dvc-yaml", "write dvc.yaml: the same stage commands as the Snakemake rules")
    s.add_argument("--output", default="dvc.yaml")
    s = stage("launch", "run a command on free GPU slots (CUDA_VISIBLE_DEVICES set for its process tree)")
    s.add_argument("--gpus", type=int, required=True, help="GPUs the command needs (0: it sees none)")
    s.add_argument("command", nargs=argparse.REMAINDER, help="-- command and its arguments")
    # the paper's sets whose download no reader takes (protoclip.data.paper_evalsets); no config needed
    s = sub.add_parser("birdsnap", help="Birdsnap's download -> train/ test/ class folders (kind: folder)")
    s.add_argument("--src", required=True, help="folder with species.txt, images.txt, test_images.txt")
    s.add_argument("--images", help="the downloaded images (default: <src>/download/images)")
    s.add_argument("--out", required=True, help="output folder (the set's `path`)")
    s = sub.add_parser("ucf101", help="UCF101 videos -> the middle frame of each, in class folders (kind: folder)")
    s.add_argument("--src", required=True, help="folder with UCF-101/ and ucfTrainTestlist/")
    s.add_argument("--out", required=True, help="output folder (the set's `path`)")
    s.add_argument("--split", type=int, default=1, choices=(1, 2, 3), help="official split (CLIP, ProtoCLIP: 1)")
    s.add_argument("--train", action="store_true", help="also the training videos (only the probes read them)")
    s = sub.add_parser("schema", help="write the config's JSON Schema and config/README.md from the config classes")
    s.add_argument("--root", default=".", help="repository root (default: the working directory)")
    s.add_argument("--check", action="store_true", help="write nothing; exit 1 if a generated file is stale")
    return p


LOG_PROGRESS_INTERVAL = "30"  # seconds between progress-bar updates when stderr is a log file, not a terminal


def progress_for_logs(stream=None) -> bool:
    """When ``stream`` (stderr) is not a terminal (a Snakemake rule's ``| tee`` log, a SLURM log), tqdm bars
    update every 30 s instead of ten times a second, so a rule log holds a few progress lines, not thousands
    of carriage-return frames (tqdm >= 4.66 reads ``TQDM_*`` defaults from the environment; an explicit
    ``TQDM_MININTERVAL`` wins). Returns whether it applied."""
    stream = sys.stderr if stream is None else stream
    if getattr(stream, "isatty", lambda: False)():
        return False
    os.environ.setdefault("TQDM_MININTERVAL", LOG_PROGRESS_INTERVAL)
    return True


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _parser().parse_args(argv)
    launch.follow_job()  # a workflow job's command ends with its job (PROTOCLIP_JOB_PID), not after it
    progress_for_logs()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    try:
        if args.stage == "schema":  # no config needed: made from the config classes
            from protoclip.config_schema import write_generated

            stale = write_generated(args.root, check=args.check)
            for path in stale:
                print(f"protoclip schema: {path} {'is stale: run `protoclip schema`' if args.check else 'written'}",
                      file=sys.stderr if args.check else sys.stdout)
            return 1 if args.check and stale else 0
        if args.stage in ("birdsnap", "ucf101"):
            from protoclip.data import paper_evalsets

            if args.stage == "birdsnap":
                counts = paper_evalsets.prepare_birdsnap(args.src, args.out, args.images)
            else:
                counts = paper_evalsets.prepare_ucf101(args.src, args.out, args.split, args.train)
            print(f"protoclip {args.stage}: wrote {args.out}: {counts}")
            return 0
        cfg = load_config(args.config)
        if args.stage == "prepare":
            from protoclip.data.prepare import run_prepare

            run_prepare(cfg)
        elif args.stage == "teacher":
            from protoclip.teacher.cache import run_teacher

            if args.name:
                cfg.teacher.name = args.name
            placement = launch.place(cfg.gpus, launch.teacher_gpus(cfg), who=f"teacher {cfg.teacher.name}")  # noqa: F841
            run_teacher(cfg)
        elif args.stage == "train":
            k = launch.train_gpus(cfg.run(args.run))
            # the run before the GPUs: a job waiting for another process's training holds no GPU meanwhile
            with run_lock.hold_run(Layout.from_config(cfg).train_lock(args.run), f"train {args.run}"):
                placement = launch.place(cfg.gpus, k, ranks=max(k, 1), who=f"train {args.run}")  # noqa: F841
                if placement.ranks > 1:  # k GPUs: torchrun with k ranks of this same command
                    return launch.run_ranks(placement, argv)
                from protoclip.train.stage import run_train

                run_train(cfg, args.run, resume=args.resume)
        elif args.stage == "evaluate":
            placement = launch.place(cfg.gpus, launch.evaluate_gpus(cfg, args.run), who=f"evaluate {args.run}")  # noqa: F841
            from protoclip.evaluate.stage import run_evaluate

            run_evaluate(cfg, args.run, tasks=args.task, datasets=args.dataset)
        elif args.stage == "collect":
            from protoclip.evaluate.stage import run_collect

            run_collect(cfg, args.run)
        elif args.stage == "report":
            from protoclip.report.tables import run_report
            from protoclip.report.claims import log_ledger
            from protoclip.tracking import claims_run, log_report

            run_report(cfg)
            Layout.from_config(cfg).figures.mkdir(parents=True, exist_ok=True)  # an output even with no figure
            log_report(cfg)  # the tables and figures as artifacts of a `report` MLflow run
            with claims_run(cfg) as tracker:  # the claims ledger: a tag and metrics per claim
                log_ledger(cfg, tracker)
        elif args.stage == "export":
            from protoclip.models.export_openclip import ExportError, run_export

            try:
                print(run_export(cfg, args.run, args.out))
            except ExportError as err:  # a method open_clip cannot represent: one line, no traceback
                print(f"protoclip export: cannot export: {err}", file=sys.stderr)
                return 2
        elif args.stage == "toy-nemd":
            from protoclip.toy.pauc_nemd import run_toy_nemd

            run_toy_nemd(cfg)
        elif args.stage == "runs":
            print("\n".join(cfg.run_names()))
        elif args.stage == "dvc-yaml":
            from protoclip.atomic import write_text
            from protoclip.dag.stages import dvc_yaml_text

            write_text(args.output, dvc_yaml_text(cfg, args.config))
        elif args.stage == "launch":
            command = args.command[1:] if args.command[:1] == ["--"] else args.command
            if not command:
                print("protoclip launch: no command given (protoclip launch --gpus K -- <command>)", file=sys.stderr)
                return 2
            placement = launch.place(cfg.gpus, args.gpus, who=" ".join(command)[:200])  # noqa: F841 (holds)
            launch.exec_command(command)  # the slots' lock files stay open in it (and its children)
    except SlotError as err:
        print(f"protoclip {args.stage}: GPU placement: {err}", file=sys.stderr)
        return 2
    # ConfigError, ModelFileError, an unreadable checkpoint, a training stopped on NaN/Inf, ...: the user's input
    # (or a diverged run), not a bug: one line, no traceback
    except UserError as err:
        message = " ".join(str(err).splitlines())  # one line, even for a message quoting a multi-line value
        print(f"protoclip {args.stage}: {err.kind}: {message}", file=sys.stderr)
        return 2
    except FileNotFoundError as err:  # a configured input (user data, teacher cache, model) is missing
        print(f"protoclip {args.stage}: input not found: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
