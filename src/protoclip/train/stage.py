"""`protoclip train --run <name>`: build data, model and teacher cache for one run, train, write outputs.

    from protoclip.project import load_config
    from protoclip.train.stage import run_train
    run_train(load_config("config/config.yaml"), "protoclip_tiny")            # -> results/runs/<run>/model.pt
    torchrun --nproc_per_node 2 -m protoclip.cli train --run protoclip_tiny    # DDP (gloo on CPU, nccl on GPU)

Reads the prepared manifest (train split, the run's ``data`` sources) and, for a ProtoCLIP run with a teacher
and ``external_weight > 0``, the teacher cache ``data/teacher/<teacher>.npz``. Writes
``results/runs/<run>/{config.yaml, train_log.jsonl, model.pt}`` and the work in progress under ``checkpoints/``
(last.pt, the log it continues, the MLflow run id). MLflow is reached only through
:func:`protoclip.tracking.training_run`: besides params and the training curves at the global step
(:mod:`protoclip.train.curves`: ``train/*`` per step, ``episode/*``), the run gets the validation curves ``val/*``
(:mod:`protoclip.train.validation`, ``train.validation``), provenance tags and, unless ``paths.mlflow_log_models`` is
false, a version of the model named after the run: with ``copy`` (or true) it holds one copy of the weights (the
open_clip export, or ``model.pt`` where open_clip cannot represent the model; :func:`log_model`), with ``reference``
none, naming ``model.pt`` by path and sha256 (:func:`register_model_reference`).

First the stage takes the run's lock (:mod:`protoclip.jobs.run_lock`: one process trains a run at a time; a second
waits, saying which process holds it), removes temp files that a killed earlier run of it left beside its
files, and decides once whether the run resumes (:func:`protoclip.train.checkpoint.resume_point`): the trainer
receives that checkpoint state or None. A run trained from scratch has its old model, checkpoint, logs and MLflow
id file removed before the data and the model are built, so a retrain that fails at any point leaves no model of
an older config behind.
"""
from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

from protoclip.jobs import run_lock
from protoclip.files.atomic import clean_stale_temps_of, write_json
from protoclip.errors import ConfigError
from protoclip.config.strict import to_dict
from protoclip.files.layout import Layout
from protoclip.tracking import Tracker, training_run
from protoclip.train.config import TrainConfig
from protoclip.train.distributed import DistInfo, env_world
from protoclip.train.checkpoint import check_state_finite, resume_key, resume_point
from protoclip.train.loop import train
from protoclip.train.validation import build_validator

if TYPE_CHECKING:  # the stage reads the project config it is given; the assembler stands above it
    from protoclip.project import ProjectConfig

log = logging.getLogger(__name__)


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def load_teacher(layout: Layout, tcfg: TrainConfig, sample_ids: Sequence[str]) -> np.ndarray:
    """The run's cached teacher features, rows aligned with ``sample_ids`` (the training set's order).

    A missing cache is a :class:`ConfigError` naming the path and the command that builds it; training ids
    absent from the cache (a stale cache) stop here, before any training, through ``teacher.cache.lookup``.
    The cache is read in blocks (``aligned_features``): only the run's rows are held, not the whole cache.
    """
    from protoclip.teacher.cache import aligned_features

    path = layout.teacher_features(tcfg.teacher)
    if not path.exists():
        raise ConfigError(f"run '{tcfg.name}': teacher cache for '{tcfg.teacher}' not found at {path}; build it with "
                          f"`protoclip teacher --config <config>` (with teacher.name: {tcfg.teacher})")
    aligned = np.ascontiguousarray(aligned_features(path, sample_ids), dtype=np.float32)
    log.info("teacher %s: %d x %d features (%s)", tcfg.teacher, *aligned.shape, path)
    return aligned


def resolve_sources(cfg: ProjectConfig, tcfg: TrainConfig) -> list[str]:
    """Manifest sources of the run: ``offline`` stands for every configured offline source."""
    out: list[str] = []
    for name in tcfg.data:
        for src in (cfg.prepare.offline_sources if name == "offline" else [name]):
            if src not in out:
                out.append(src)
    return out


def subsample_pairs(df, fraction: float, seed: int):
    """The first ceil(fraction * n) rows of a seeded permutation (nested across fractions), in manifest order."""
    if fraction >= 1.0:
        return df
    import numpy as np

    keep = np.random.default_rng(seed).permutation(len(df))[: max(1, int(np.ceil(fraction * len(df))))]
    return df.iloc[np.sort(keep)].reset_index(drop=True)


def build_dataset(cfg: ProjectConfig, layout: Layout, tcfg: TrainConfig, image_size: int, tokenizer):
    """The run's training pairs (manifest train split of its sources, the run's augmentation) and their ids."""
    from protoclip.data.loading.pairs import ImageTextDataset, load_manifest, release_unused_memory
    from protoclip.registry import method_class

    if not layout.manifest.exists():
        raise ConfigError(f"run '{tcfg.name}': manifest not found at {layout.manifest}; build it with "
                          "`protoclip prepare --config <config>`")
    df = load_manifest(layout, sources=resolve_sources(cfg, tcfg), split="train",
                       columns=["id", "path", "caption", "sha256", "offset", "size"])  # what the dataset reads
    if len(df) == 0:
        raise ConfigError(f"run '{tcfg.name}': no training pairs for sources {tcfg.data} in {layout.manifest}")
    df = subsample_pairs(df, tcfg.subset_fraction, tcfg.seed)
    dataset = ImageTextDataset(df, method_class(tcfg.method).train_transform(tcfg, image_size), tokenizer,
                               image_cache_bytes=tcfg.image_cache_mb * 2**20)
    del df
    release_unused_memory()  # the manifest read's pages, before the training (and its forked workers) start
    return dataset, dataset.ids  # the ids as the dataset's flat column, not a Python string per pair


def train_run(cfg: ProjectConfig, tcfg: TrainConfig, config: dict, state: dict | None, tracker: Tracker) -> Path:
    """Everything of :func:`run_train` after the resume decision (``state``: the accepted checkpoint or None)
    and inside the MLflow context (the tracker is given). ``config``: ``to_dict(tcfg)``."""
    from protoclip.files.hashing import sha256_file
    from protoclip.models import get_tokenizer, save_model
    from protoclip.registry import method_class

    run = tcfg.name
    layout = Layout.from_config(cfg)
    info = env_world()
    seed_everything(tcfg.seed)  # same seed on every rank: identical initial weights
    model = method_class(tcfg.method).build_model(tcfg)
    tokenizer = get_tokenizer(tcfg.model, context_length=model.context_length)
    dataset, ids = build_dataset(cfg, layout, tcfg, model.image_size, tokenizer)
    data_digest = log_training_data(cfg, layout, tcfg, tracker) if info.rank == 0 else ""
    teacher = load_teacher(layout, tcfg, ids) if tcfg.reads_teacher() else None
    validator = build_validator(cfg, tcfg, model.image_size, tokenizer) if info.is_main else None
    model = train(model, dataset, tcfg, layout.train_files(run), state=state, teacher=teacher, tracker=tracker,
                  validator=validator)
    out = layout.model(run)
    check_state_finite(model, None, step=None, episode=None, checkpoint=layout.checkpoint(run), what=str(out))
    if info.rank == 0:
        save_model(out, model, config, eval_spec=method_class(tcfg.method).eval_spec(tcfg))
        # evaluate finds this MLflow run by the sha256 of the model it evaluates (protoclip.tracking)
        tags = provenance_tags(config, data_digest, sha256_file(out))
        tracker.set_tags(tags)
        for path in (layout.run_config(run), layout.train_log(run)):
            tracker.log_artifact(path)
        mode = cfg.paths.mlflow_model_mode
        if mode == "copy" and tracker.run_id:
            log_model(tracker, out, run, tags)
        elif mode == "reference" and tracker.run_id:
            register_model_reference(tracker, out, run, tags, config_file=project_path(Path(cfg.source)))
        log.info("run %s: model written to %s", run, out)
        if not cfg.paths.keep_finished_checkpoints and layout.checkpoint(run).exists():
            layout.checkpoint(run).unlink()
            log.info("run %s: checkpoint removed (paths.keep_finished_checkpoints: false)", run)
    return out


def provenance_tags(config: dict, data_digest: str, model_sha256: str) -> dict[str, str]:
    """What made a model, as MLflow tags of its run and registered version: the code's commit, the sha256 of the
    resolved run config (canonical JSON of ``config.yaml``'s dict), the training rows' digest and the model's."""
    from protoclip.files.hashing import json_sha256
    from protoclip.files.provenance import git_commit

    config_digest = json_sha256(config)
    return {"protoclip.code_commit": git_commit(), "protoclip.config_sha256": config_digest,
            "protoclip.data_digest": data_digest, "protoclip.model_sha256": model_sha256}


def log_model(tracker: Tracker, model_path: Path, run: str, tags: dict[str, str]) -> str | None:
    """One copy of the run's weights as the MLflow run's ``model`` artifacts, registered as a version of the model
    named after the run: the open_clip export where open_clip can represent the model (the files of ``protoclip
    export``, so that ``local-dir:`` reads the downloaded version as is), else ``model.pt`` itself. ``model.pt``
    stays in the run's folder (``protoclip.model_sha256`` names it): a second copy would double the run's disk."""
    import shutil
    import tempfile

    from protoclip.models.export_openclip import ExportError, export_openclip

    with tempfile.TemporaryDirectory(prefix=f"protoclip-model-{run}-") as tmp:
        folder = Path(tmp) / "model"
        try:
            export_openclip(model_path, folder)
            open_clip = "local-dir"
        except ExportError as err:  # e.g. nCLIP's similarity: the version holds model.pt
            folder.mkdir(parents=True, exist_ok=True)
            shutil.copy2(model_path, folder / model_path.name)
            open_clip = f"no: {err}"
        version = tracker.log_model(folder, run, {**tags, "protoclip.run": run, "protoclip.open_clip": open_clip[:500]},
                                    description=f"protoclip training run '{run}': "
                                    + ("its open_clip export (open_clip_config.json, open_clip_model.safetensors)"
                                       if open_clip == "local-dir" else "model.pt"))
    if version is not None:
        log.info("run %s: model registered in MLflow as models:/%s/%s", run, run, version)
    return version


def project_path(path: Path) -> str:
    """``path`` as the project names it: relative to the working folder (the project's root, where the stages run)
    when it lies below it, else absolute; POSIX separators."""
    import os

    absolute = Path(os.path.abspath(path))
    try:
        return absolute.relative_to(Path.cwd()).as_posix()
    except ValueError:
        return absolute.as_posix()


def register_model_reference(tracker: Tracker, model_path: Path, run: str, tags: dict[str, str],
                             config_file: str = "config/config.yaml") -> str | None:
    """A version of the model named after the run that holds no copy of the weights (``paths.mlflow_log_models:
    reference``): its tags ``protoclip.model_path`` (``model.pt`` relative to the project) and
    ``protoclip.model_sha256`` name the file, and its description says so and how to get the open_clip form."""
    path = project_path(model_path)
    export = f"protoclip export --config {config_file} --run {run}"
    version = tracker.register_reference(
        run, {**tags, "protoclip.run": run, "protoclip.model_path": path, "protoclip.open_clip": export},
        description=f"protoclip training run '{run}': no files in MLflow; the weights are {path} (sha256 "
                    f"{tags.get('protoclip.model_sha256', '?')}); `{export}` writes their open_clip form where "
                    "open_clip can represent the model")
    if version is not None:
        log.info("run %s: model registered in MLflow as models:/%s/%s (a reference to %s, no copy)", run, run,
                 version, path)
    return version


def log_training_data(cfg: ProjectConfig, layout: Layout, tcfg: TrainConfig, tracker: Tracker) -> str:
    """The run's training rows of the manifest as an MLflow dataset input (digest: sha256 of ids + image hashes,
    returned)."""
    import hashlib

    from protoclip.data.loading.pairs import load_manifest, release_unused_memory

    df = load_manifest(layout, sources=resolve_sources(cfg, tcfg), split="train",
                       columns=["id", "source", "caption", "sha256"])
    h = hashlib.sha256()  # of "\n".join(f"{id} {sha256}"), row by row (not one string of the whole corpus)
    for k, (i, s) in enumerate(zip(df["id"], df["sha256"])):
        h.update(f"{chr(10) if k else ''}{i} {s}".encode())
    digest = h.hexdigest()
    tracker.log_dataset(df[["id", "source", "caption", "sha256"]], name=f"manifest:{'+'.join(tcfg.data)}:train",
                        digest=digest[:32], source=str(layout.manifest))
    del df
    release_unused_memory()
    return digest


def train_outputs(layout: Layout, run: str) -> list[Path]:
    """Every file the train stage writes for ``run`` (their killed writes' temp files are cleaned at start)."""
    return [layout.run_config(run), layout.train_log(run), layout.model(run), layout.checkpoint(run),
            layout.train_log_work(run), layout.mlflow_run_file(run)]


def start_fresh(layout: Layout, run: str) -> None:
    """Before a training from scratch: remove what an earlier training of the run left (model, checkpoint, both
    logs, its MLflow run id), so that a retrain that fails leaves no model of another config behind."""
    removed = [p for p in (layout.model(run), layout.checkpoint(run), layout.train_log(run),
                           layout.train_log_work(run), layout.mlflow_run_file(run)) if p.exists()]
    for path in removed:
        path.unlink()
    if removed:
        log.info("training %s from scratch: removed %s", run, ", ".join(str(p) for p in removed))


def prepare_run_dir(layout: Layout, run: str, config: dict, resume: bool, info: DistInfo) -> dict | None:
    """The stage's start, and its one decision: clean stale temp files, read the checkpoint when ``resume``,
    and for a training from scratch remove the old files (main rank). Returns the accepted checkpoint state, or
    None (from scratch)."""
    if info.is_main:
        clean_stale_temps_of(train_outputs(layout, run))
    state = resume_point(layout.checkpoint(run), resume_key(config)) if resume else None
    if state is None and info.is_main:
        start_fresh(layout, run)
    return state


def run_train(cfg: ProjectConfig, run: str, resume: bool = False, targets: list[str] | None = None) -> Path:
    """Train run ``run`` of ``cfg``; returns the path of the final ``model.pt``.

    MLflow: a training from scratch is a new MLflow run, a resumed one continues its own (the id kept in
    ``checkpoints/mlflow.json``). ``targets``: the table / figure targets this run belongs to (MLflow tags).
    """
    tcfg = cfg.run(run)  # unknown run -> ConfigError before anything starts
    if tcfg.pretrained.enabled:
        raise ConfigError(f"run '{run}' is a released checkpoint (pretrained: {tcfg.pretrained.tag}): nothing to "
                          f"train; evaluate it (protoclip evaluate --run {run})")
    config = to_dict(tcfg)  # the one dict of the config in this stage: resume key and model.pt
    layout = Layout.from_config(cfg)
    info = env_world()
    with run_lock.hold_run(layout.train_lock(run), f"train {run}"):  # no-op where the caller holds it
        state = prepare_run_dir(layout, run, config, resume, info)
        if not info.is_main:  # only rank 0 talks to MLflow
            return train_run(cfg, tcfg, config, state, Tracker())
        id_file = layout.mlflow_run_file(run)
        with training_run(cfg, run, id_file if state is not None else None, targets) as tracker:
            if tracker.run_id:
                write_json(id_file, {"run_id": tracker.run_id})
            return train_run(cfg, tcfg, config, state, tracker)


# --------------------------------------------------------------------------- `protoclip train`
def add_arguments(p, name: str) -> None:
    p.add_argument("--run", required=True, help="run name from the experiment files")
    p.add_argument("--resume", action="store_true", help="continue from the last complete episode")


def main(args) -> int:
    """Hold the run, then its GPUs (a job waiting for another process's training holds no GPU meanwhile); a run
    on k > 1 GPUs restarts this same command as k torchrun ranks."""
    from protoclip.jobs import launch

    cfg = args.cfg
    k = launch.train_gpus(cfg.run(args.run))
    with run_lock.hold_run(Layout.from_config(cfg).train_lock(args.run), f"train {args.run}"), \
            launch.place(cfg.gpus, k, ranks=max(k, 1), who=f"train {args.run}") as placement:
        if placement.ranks > 1:
            return launch.run_ranks(placement, args.argv)
        run_train(cfg, args.run, resume=args.resume)
    return 0
