"""`protoclip train --run <name>`: build data, model and teacher cache for one run, train, write outputs.

    from protoclip.config import load_config
    from protoclip.train.stage import run_train
    run_train(load_config("config/config.yaml"), "protoclip_tiny")            # -> results/runs/<run>/model.pt
    torchrun --nproc_per_node 2 -m protoclip.cli train --run protoclip_tiny    # DDP (gloo on CPU, nccl on GPU)

Reads the prepared manifest (train split, the run's ``data`` sources) and, for a ProtoCLIP run with a teacher
and ``external_weight > 0``, the teacher cache ``data/teacher/<teacher>.npz``. Writes
``results/runs/<run>/{config.yaml, train_log.jsonl, checkpoints/last.pt, model.pt}``. MLflow is reached only
through :func:`protoclip.tracking.tracked_run`.
"""
from __future__ import annotations

import logging
import random
from pathlib import Path

import numpy as np
import torch

from protoclip.config import ConfigError, ProjectConfig, to_dict
from protoclip.layout import Layout
from protoclip.tracking import Tracker, tracked_run
from protoclip.train.config import TrainConfig
from protoclip.train.distributed import env_world
from protoclip.train.loop import TeacherFeatures, train

log = logging.getLogger(__name__)


def seed_everything(seed: int, rank: int = 0) -> None:
    """Seed python, numpy and torch (same seed on every rank: identical initial weights)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def uses_teacher(tcfg: TrainConfig) -> bool:
    return tcfg.method == "protoclip" and tcfg.teacher is not None and tcfg.loss.external_weight > 0


def load_teacher(layout: Layout, tcfg: TrainConfig) -> TeacherFeatures:
    """The run's teacher cache; a clear error naming the path and the command that builds it."""
    from protoclip.teacher.cache import load_teacher_features

    path = layout.teacher_features(tcfg.teacher)
    if not path.exists():
        raise ConfigError(f"run '{tcfg.name}': teacher cache for '{tcfg.teacher}' not found at {path}; build it with "
                          f"`protoclip teacher --config <config>` (teacher.name: {tcfg.teacher})")
    ids, feats, meta = load_teacher_features(path)
    log.info("teacher %s: %d features of dim %d (%s)", tcfg.teacher, len(ids), feats.shape[1], path)
    return TeacherFeatures([str(i) for i in ids], np.asarray(feats, dtype=np.float32))


def build_dataset(cfg: ProjectConfig, layout: Layout, tcfg: TrainConfig, image_size: int, tokenizer):
    """The run's training pairs: manifest train split of its sources, with the run's augmentation."""
    from protoclip.data.pairs import ImageTextDataset, load_manifest
    from protoclip.data.transforms import train_transform

    df = load_manifest(layout, sources=tcfg.data, split="train")
    if len(df) == 0:
        raise ConfigError(f"run '{tcfg.name}': no training pairs for sources {tcfg.data} in {layout.manifest}")
    dataset = ImageTextDataset(df, train_transform(image_size, tcfg.augmentation), tokenizer)
    return dataset, [str(i) for i in df["id"].tolist()]


def train_run(cfg: ProjectConfig, run: str, tracker: Tracker, resume: bool = False) -> Path:
    """Everything of :func:`run_train` except the MLflow context (the tracker is given)."""
    from protoclip.models import build_model, get_tokenizer, save_model

    tcfg = cfg.run(run)
    layout = Layout.from_config(cfg)
    info = env_world()
    teacher = load_teacher(layout, tcfg) if uses_teacher(tcfg) else None
    seed_everything(tcfg.seed, info.rank)
    model = build_model(tcfg.model, head_hidden=tcfg.head_hidden, head_out=tcfg.head_out,
                        init_temperature=tcfg.loss.init_temperature)
    dataset, ids = build_dataset(cfg, layout, tcfg, model.image_size, get_tokenizer(tcfg.model))
    model = train(model, dataset, ids, tcfg, layout, run, teacher=teacher, tracker=tracker, resume=resume)
    out = layout.model(run)
    if info.rank == 0:
        save_model(out, model, to_dict(tcfg))
        for path in (layout.run_dir(run) / "config.yaml", layout.train_log(run)):
            tracker.log_artifact(path)
        log.info("run %s: model written to %s", run, out)
    return out


def run_train(cfg: ProjectConfig, run: str, resume: bool = False) -> Path:
    """Train run ``run`` of ``cfg``; returns the path of the final ``model.pt``."""
    cfg.run(run)  # unknown run -> ConfigError before anything starts
    if env_world().rank != 0:  # only rank 0 talks to MLflow
        return train_run(cfg, run, Tracker(), resume=resume)
    with tracked_run(cfg, run, "train") as tracker:
        return train_run(cfg, run, tracker, resume=resume)
