"""Episode-end checkpoints: everything an exact resume needs (``results/runs/<run>/checkpoints/last.pt``), written
atomically so that a run killed mid-write keeps the previous complete checkpoint, and the one resume decision
(:func:`resume_point`). Also the stops that keep the last good state (:class:`TrainingStopped`).
"""
from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from protoclip.files.atomic import save_torch
from protoclip.errors import UserError

log = logging.getLogger(__name__)

CHECKPOINT_VERSION = 1
REQUIRED_KEYS = ("model", "optimizer", "rng", "episode", "step", "extra")  # what a resume reads
# settings that do not change the result: a checkpoint written with other values may be resumed
RESUME_INDIFFERENT = ("num_workers", "log_every", "log_every_steps", "gpu", "device", "checkpoint_interval_s", "validation")


class CheckpointError(UserError):
    """``last.pt`` exists but is not a readable protoclip training checkpoint; the message names the file."""

    kind = "checkpoint error"


class TrainingStopped(UserError):
    """Training stopped to keep the last good state (non-finite loss, gradient, weights or features); the
    message names step, episode and the term or tensor. The CLI prints it as one line, exit 2."""

    kind = "training stopped"


def resume_key(config: dict) -> dict:
    """The part of a run's config (``to_dict(TrainConfig)``) a checkpoint must share with the run resuming it."""
    return {k: v for k, v in config.items() if k not in RESUME_INDIFFERENT}


def rng_state() -> dict[str, Any]:
    """The python, numpy and torch (CPU + every CUDA device) RNG states."""
    state: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(),
                             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Inverse of :func:`rng_state`."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class NonFiniteStateError(TrainingStopped):
    """Model weights or optimizer state became NaN/Inf; the message names step, episode and tensor."""


def kept_checkpoint(path: str | Path) -> str:
    """The end of a stop message: which checkpoint is kept, only when there is one."""
    path = Path(path)
    return f"last good checkpoint kept at {path}" if path.exists() else "no checkpoint was written yet"


def first_non_finite(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> str | None:
    """Name of the first parameter, buffer or optimizer-state tensor holding NaN/Inf, or None."""
    for name, t in model.named_parameters():
        if not torch.isfinite(t.detach()).all():
            return f"parameter '{name}'"
    for name, t in model.named_buffers():  # BatchNorm statistics; attention masks hold -inf by design
        if t.is_floating_point():
            bad = torch.isnan(t).any() if name.endswith("mask") else not torch.isfinite(t).all()
            if bad:
                return f"buffer '{name}'"
    if optimizer is not None:
        names = {id(p): n for n, p in model.named_parameters()}
        for p, st in optimizer.state.items():
            for key, t in st.items():
                if torch.is_tensor(t) and t.is_floating_point() and not torch.isfinite(t).all():
                    return f"optimizer state '{key}' of '{names.get(id(p), '?')}'"
    return None


def check_state_finite(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, *, step: int | None,
                       episode: int | None, checkpoint: str | Path, what: str = "checkpoint") -> None:
    """Refuse to save non-finite weights or optimizer state as a good ``what`` (checkpoint / final model).

    A finite loss and gradient norm do not make the update finite (e.g. an episode of a single step, whose
    check runs before ``optimizer.step``; an Adam second moment of 0 with eps 0), so the trainer calls this
    right before every save. Raises :class:`NonFiniteStateError` naming step, episode and the tensor.
    """
    bad = first_non_finite(model, optimizer)
    if bad is not None:
        when = f"after step {step} (episode {episode})" if step is not None else "at the end of training"
        raise NonFiniteStateError(f"non-finite {bad} {when}; {what} not saved; stopped, "
                                  f"{kept_checkpoint(checkpoint)}")


def save_checkpoint(path: str | Path, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    episode: int, step: int, scaler: Any = None, prototypes: Any = None,
                    extra: dict[str, Any] | None = None) -> Path:
    """Write the checkpoint atomically. ``episode`` is the index of the next episode to run.

    It holds the model and optimizer state, the grad scaler (when one is used), the python / numpy / torch (CPU
    and CUDA) RNG states, the index of the next episode, the global step and the last episode's prototypes;
    written with :func:`protoclip.files.atomic.save_torch`, so a kill mid-write keeps the previous file::

        save_checkpoint(path, model=m, optimizer=opt, episode=e + 1, step=s, prototypes=p,
                        extra={"config": resume_key(config)})
        state = resume_point(path, resume_key(config))  # None: train from scratch
        restore_rng(state["rng"])
    """
    state = {
        "version": CHECKPOINT_VERSION,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict() if scaler is not None else None,
        "rng": rng_state(),
        "episode": int(episode),
        "step": int(step),
        "prototypes": prototypes,
        "extra": extra or {},
    }
    save_torch(path, state)  # atomic and byte-deterministic
    log.debug("checkpoint: episode %d step %d -> %s", episode, step, path)
    return Path(path)


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint`.

    Missing: ``FileNotFoundError``. Empty, cut or foreign (another format, another version, keys missing):
    :class:`CheckpointError` naming the file and the cause in one line.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint to resume from: {path}")
    how = f"delete it to train from scratch (`rm {path}`)"
    try:
        # weights_only=False: the file also holds RNG states (numpy arrays, python tuples) that we wrote ourselves
        state = torch.load(path, map_location=map_location, weights_only=False)
    except FileNotFoundError:
        raise
    except Exception as err:  # noqa: BLE001  torch/pickle/zip raise many types for an empty, cut or foreign file
        cause = (str(err).strip().splitlines() or [""])[0][:200]
        raise CheckpointError(f"{path}: not a readable training checkpoint ({type(err).__name__}: {cause}); "
                              f"{how}") from None
    if not isinstance(state, dict) or state.get("version") != CHECKPOINT_VERSION:
        found = f"version {state.get('version')!r}" if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(f"{path}: not a protoclip training checkpoint (version {CHECKPOINT_VERSION}, found "
                              f"{found}); {how}")
    missing = [k for k in REQUIRED_KEYS if k not in state]
    if missing:
        raise CheckpointError(f"{path}: training checkpoint without {', '.join(missing)}; {how}")
    return state


def resume_point(path: str | Path, key: dict, map_location: str | torch.device = "cpu") -> dict[str, Any] | None:
    """The one resume check: the checkpoint's state when it continues a run of config ``key``
    (:func:`resume_key`), else None (train from scratch, logged why).

    No checkpoint, or one written with another config, trains from scratch, because the workflow always passes
    ``--resume`` and a changed config must retrain. A checkpoint that cannot be read (empty, cut, another tool's
    file) stops with a :class:`CheckpointError` naming it (exit 2): our own writes are atomic, so such a file was
    damaged or replaced from outside, and starting over would silently discard training that a restored copy
    could continue; the message says to delete the file to train from scratch.
    """
    try:
        state = load_checkpoint(path, map_location=map_location)
    except FileNotFoundError:  # also when rank 0 removed it first for a retrain (their answer is None too)
        log.warning("resume requested but no checkpoint at %s: starting from scratch", path)
        return None
    if state["extra"].get("config") != key:
        # the workflow always passes --resume: a changed config must retrain, not continue (or, for a
        # finished run, silently return the old weights)
        log.warning("checkpoint %s was written with another config: training from scratch", path)
        return None
    return state
