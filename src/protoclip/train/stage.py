"""`protoclip train --run <name>`: build data, model and teacher cache for one run, train, and write its outputs
(``results/runs/<run>/{config.yaml, train_log.jsonl, model.pt}``, the work in progress under ``checkpoints/``).
:func:`run_train` narrows the project config to what the training reads (:class:`TrainJob`), holds the run's
lock, decides once whether the run resumes, and reaches MLflow only through :mod:`protoclip.tracking`.
"""
from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np
import torch

from protoclip.config.strict import to_dict
from protoclip.data.loading.pairs import ImageTextDataset, release_unused_memory
from protoclip.data.loading.training_set import (ROW_COLUMNS, resolve_sources, rows_digest, training_pairs,
                                                 training_rows)
from protoclip.data.config import PrepareProject
from protoclip.errors import ConfigError
from protoclip.evaluate.config import EvaluateConfig, EvaluateProject
from protoclip.files.atomic import clean_stale_temps_of, write_json
from protoclip.files.hashing import json_sha256, sha256_file
from protoclip.files.layout import Layout, PathsConfig
from protoclip.files.provenance import git_commit
from protoclip.jobs import launch, run_lock
from protoclip.models import get_tokenizer, save_model
from protoclip.models.export_openclip import export_or_copy
from protoclip.registry import method_class
from protoclip.teacher.cache import run_features
from protoclip.tracking import Tracker, register_model, training_run
from protoclip.train.checkpoint import check_state_finite, resume_key, resume_point
from protoclip.train.config import TrainConfig
from protoclip.train.distributed import DistInfo, env_world
from protoclip.train.loop import train
from protoclip.train.validation import build_validator

log = logging.getLogger(__name__)


@runtime_checkable
class TrainProject(PrepareProject, EvaluateProject, Protocol):
    """The project config as the train stage reads it (protoclip.project.ProjectConfig; see
    protoclip.config.protocols): the run's resolved settings, ``paths``, the offline sources of ``prepare``, the
    evaluation sets that validation reads, and what the MLflow run is tagged with (its targets)."""

    def run(self, name: str) -> TrainConfig: ...


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def provenance_tags(config: dict, data_digest: str, model_sha256: str) -> dict[str, str]:
    """What made a model, as MLflow tags of its run and registered version: the code's commit, the sha256 of the
    resolved run config (canonical JSON of ``config.yaml``'s dict), the training rows' digest and the model's."""
    return {"protoclip.code_commit": git_commit(), "protoclip.config_sha256": json_sha256(config),
            "protoclip.data_digest": data_digest, "protoclip.model_sha256": model_sha256}


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


@dataclass
class TrainJob:
    """One run's training with the sections of the project config that its parts read, and no more: the run's
    own config, where the files are, the manifest sources it trains on (``offline`` resolved), the evaluation
    sets its validation reads, and the ``paths`` settings of its model's MLflow version and checkpoint."""

    tcfg: TrainConfig
    layout: Layout
    sources: list[str]  # protoclip.data.loading.training_set.resolve_sources
    evaluate: EvaluateConfig
    paths: PathsConfig
    config_file: Path  # the config the run was loaded from (a reference version names it)

    @property
    def run(self) -> str:
        return self.tcfg.name

    @cached_property
    def config(self) -> dict:
        """The one dict of the run's config in this stage: the resume key, ``config.yaml`` and ``model.pt``."""
        return to_dict(self.tcfg)

    def start(self, resume: bool, info: DistInfo) -> dict | None:
        """The stage's start, and its one decision: clean stale temp files, read the checkpoint when ``resume``,
        and for a training from scratch remove the old files (main rank). Returns the accepted checkpoint state,
        or None (from scratch)."""
        layout, run = self.layout, self.run
        if info.is_main:
            clean_stale_temps_of(train_outputs(layout, run))
        state = resume_point(layout.checkpoint(run), resume_key(self.config)) if resume else None
        if state is None and info.is_main:
            start_fresh(layout, run)
        return state

    def dataset(self, image_size: int, tokenizer) -> ImageTextDataset:
        """The run's training pairs, read through its method's training augmentation."""
        tcfg = self.tcfg
        transform = method_class(tcfg.method).train_transform(tcfg, image_size)
        return training_pairs(self.layout, self.sources, transform, tokenizer, run=tcfg.name, data=tcfg.data,
                              fraction=tcfg.subset_fraction, seed=tcfg.seed,
                              image_cache_bytes=tcfg.image_cache_mb * 2**20)

    def log_training_data(self, tracker: Tracker) -> str:
        """The run's training rows of the manifest as an MLflow dataset input; returns their digest
        (:func:`protoclip.data.loading.training_set.rows_digest`)."""
        df = training_rows(self.layout, self.sources)
        digest = rows_digest(df)
        tracker.log_dataset(df[ROW_COLUMNS], name=f"manifest:{'+'.join(self.tcfg.data)}:train", digest=digest[:32],
                            source=str(self.layout.manifest))
        del df
        release_unused_memory()
        return digest

    def teacher(self, ids) -> np.ndarray:
        """The run's teacher features, rows aligned with the training pairs' ``ids``."""
        return run_features(self.layout.teacher_features(self.tcfg.teacher), self.tcfg.teacher, self.run, ids)

    def train(self, state: dict | None, tracker: Tracker) -> Path:
        """Build the model, its data, teacher rows and validator, train, and write the model (``state``: the
        accepted checkpoint or None). Returns the path of ``model.pt``."""
        tcfg, layout, run = self.tcfg, self.layout, self.run
        info = env_world()
        seed_everything(tcfg.seed)  # same seed on every rank: identical initial weights
        model = method_class(tcfg.method).build_model(tcfg)
        tokenizer = get_tokenizer(tcfg.model, context_length=model.context_length)
        dataset = self.dataset(model.image_size, tokenizer)
        data_digest = self.log_training_data(tracker) if info.rank == 0 else ""
        teacher = self.teacher(dataset.ids) if tcfg.reads_teacher() else None  # the ids as the dataset's column
        validator = (build_validator(self.evaluate, layout, tcfg, model.image_size, tokenizer) if info.is_main
                     else None)
        model = train(model, dataset, tcfg, layout.train_files(run), state=state, teacher=teacher, tracker=tracker,
                      validator=validator)
        out = layout.model(run)
        check_state_finite(model, None, step=None, episode=None, checkpoint=layout.checkpoint(run), what=str(out))
        if info.rank == 0:
            self.finish(model, out, data_digest, tracker)
        return out

    def finish(self, model, out: Path, data_digest: str, tracker: Tracker) -> None:
        """Main rank, after training: write ``model.pt``, tag the MLflow run with its provenance (evaluate finds
        the run by the model's sha256), log the run's files, register the model, drop the finished checkpoint.

        The model version (:func:`protoclip.tracking.register_model`, unless ``paths.mlflow_log_models`` is false)
        is named after the run: with ``copy`` (or true) it holds one copy of the weights (the open_clip export, or
        ``model.pt`` where open_clip cannot represent the model), with ``reference`` none, naming ``model.pt`` by
        path and sha256."""
        layout, run = self.layout, self.run
        save_model(out, model, self.config, eval_spec=method_class(self.tcfg.method).eval_spec(self.tcfg))
        tags = provenance_tags(self.config, data_digest, sha256_file(out))
        tracker.set_tags(tags)
        for path in (layout.run_config(run), layout.train_log(run)):
            tracker.log_artifact(path)
        register_model(tracker, self.paths.mlflow_model_mode, out, run, tags, self.config_file, export_or_copy)
        log.info("run %s: model written to %s", run, out)
        if not self.paths.keep_finished_checkpoints and layout.checkpoint(run).exists():
            layout.checkpoint(run).unlink()
            log.info("run %s: checkpoint removed (paths.keep_finished_checkpoints: false)", run)


def run_train(cfg: TrainProject, run: str, resume: bool = False, targets: list[str] | None = None) -> Path:
    """Train run ``run`` of ``cfg``; returns the path of the final ``model.pt``.

    The stage narrows ``cfg`` to the sections the training reads (:class:`TrainJob`) and opens the MLflow run:
    a training from scratch is a new MLflow run, a resumed one continues its own (the id kept in
    ``checkpoints/mlflow.json``). ``targets``: the table / figure targets this run belongs to (MLflow tags).

    First the stage takes the run's lock (:mod:`protoclip.jobs.run_lock`: one process trains a run at a time; a
    second waits, saying which process holds it), removes temp files that a killed earlier run of it left beside
    its files, and decides once whether the run resumes (:meth:`TrainJob.start`); the trainer receives that
    checkpoint state or None. Reads the prepared manifest (train split, the run's ``data`` sources) and, for a
    run that reads the external teacher (ProtoCLIP with a teacher and ``external_weight > 0``), the teacher cache
    ``data/teacher/<teacher>.npz``. Besides params and the training curves (:mod:`protoclip.train.curves`), the
    MLflow run gets the validation curves ``val/*`` (:mod:`protoclip.train.validation`), provenance tags and a
    model version (:meth:`TrainJob.finish`)::

        run_train(load_config("config/config.yaml"), "protoclip_tiny")            # -> results/runs/<run>/model.pt
        torchrun --nproc_per_node 2 -m protoclip.cli train --run protoclip_tiny    # DDP (gloo on CPU, nccl on GPU)
    """
    tcfg = cfg.run(run)  # unknown run -> ConfigError before anything starts
    if tcfg.pretrained.enabled:
        raise ConfigError(f"run '{run}' is a released checkpoint (pretrained: {tcfg.pretrained.tag}): nothing to "
                          f"train; evaluate it (protoclip evaluate --run {run})")
    layout = Layout.from_config(cfg)
    job = TrainJob(tcfg, layout, resolve_sources(tcfg.data, cfg.prepare.offline_sources), cfg.evaluate, cfg.paths,
                   Path(cfg.source))
    info = env_world()
    with run_lock.hold_run(layout.train_lock(run), f"train {run}"):  # no-op where the caller holds it
        state = job.start(resume, info)
        if not info.is_main:  # only rank 0 talks to MLflow
            return job.train(state, Tracker())
        id_file = layout.mlflow_run_file(run)
        targets = cfg.run_targets(run) if targets is None else targets
        with training_run(cfg.paths, run, id_file if state is not None else None, targets) as tracker:
            if tracker.run_id:
                write_json(id_file, {"run_id": tracker.run_id})
            return job.train(state, tracker)


# --------------------------------------------------------------------------- `protoclip train`
def add_arguments(p, name: str) -> None:
    p.add_argument("--run", required=True, help="run name from the experiment files")
    p.add_argument("--resume", action="store_true", help="continue from the last complete episode")


def main(args) -> int:
    """Hold the run, then its GPUs (a job waiting for another process's training holds no GPU meanwhile); a run
    on k > 1 GPUs restarts this same command as k torchrun ranks."""
    cfg = args.cfg
    k = launch.train_gpus(cfg.run(args.run))
    with run_lock.hold_run(Layout.from_config(cfg).train_lock(args.run), f"train {args.run}"), \
            launch.place(cfg.gpus, k, ranks=max(k, 1), who=f"train {args.run}") as placement:
        if placement.ranks > 1:
            return launch.run_ranks(placement, args.argv)
        run_train(cfg, args.run, resume=args.resume)
    return 0
