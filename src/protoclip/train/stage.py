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
from protoclip.train.checkpoint import check_state_finite
from protoclip.train.loop import train

log = logging.getLogger(__name__)


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def uses_teacher(tcfg: TrainConfig) -> bool:
    return tcfg.method == "protoclip" and tcfg.teacher is not None and tcfg.loss.external_weight > 0


def load_teacher(layout: Layout, tcfg: TrainConfig, sample_ids: list[str]) -> np.ndarray:
    """The run's cached teacher features, rows aligned with ``sample_ids`` (the training set's order).

    A missing cache is a :class:`ConfigError` naming the path and the command that builds it; training ids
    absent from the cache (a stale cache) stop here, before any training, through ``teacher.cache.lookup``.
    """
    from protoclip.teacher.cache import load_teacher_features, lookup

    path = layout.teacher_features(tcfg.teacher)
    if not path.exists():
        raise ConfigError(f"run '{tcfg.name}': teacher cache for '{tcfg.teacher}' not found at {path}; build it with "
                          f"`protoclip teacher --config <config>` (with teacher.name: {tcfg.teacher})")
    ids, feats, _meta = load_teacher_features(path)
    aligned = np.ascontiguousarray(lookup(ids, feats, sample_ids), dtype=np.float32)
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


def build_dataset(cfg: ProjectConfig, layout: Layout, tcfg: TrainConfig, image_size: int, tokenizer):
    """The run's training pairs (manifest train split of its sources, the run's augmentation) and their ids."""
    from protoclip.data.pairs import ImageTextDataset, load_manifest
    from protoclip.data.transforms import train_transform

    if not layout.manifest.exists():
        raise ConfigError(f"run '{tcfg.name}': manifest not found at {layout.manifest}; build it with "
                          "`protoclip prepare --config <config>`")
    df = load_manifest(layout, sources=resolve_sources(cfg, tcfg), split="train")
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
    seed_everything(tcfg.seed)  # same seed on every rank: identical initial weights
    model = build_model(tcfg.model, head_hidden=tcfg.head_hidden, head_out=tcfg.head_out,
                        init_temperature=tcfg.loss.init_temperature, embed_dim=tcfg.embed_dim,
                        context_length=tcfg.context_length)
    dataset, ids = build_dataset(cfg, layout, tcfg, model.image_size,
                                 get_tokenizer(tcfg.model, context_length=model.context_length))
    teacher = load_teacher(layout, tcfg, ids) if uses_teacher(tcfg) else None
    model = train(model, dataset, tcfg, layout, run, teacher=teacher, tracker=tracker, resume=resume)
    out = layout.model(run)
    check_state_finite(model, None, step=None, episode=None, checkpoint=layout.checkpoint(run), what=str(out))
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
