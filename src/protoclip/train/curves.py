"""The training curves as MLflow shows them: every curve against the global optimizer step, open_clip's way, so that
a ProtoCLIP run and an open_clip run share one chart. Names the train log's ``step`` and ``episode`` records (which
keep their own keys) as MLflow's ``train/*``, ``episode/*`` and ``val/*`` metrics and sends them once per episode,
after its checkpoint, in one batch call. The keys and when they are sent: docs/mlflow.md, "Curves while training".
"""
from __future__ import annotations

import time
from typing import Any

COUNTERS = ("kind", "step", "episode", "epoch", "n_steps")  # record keys that count, not measure: never metrics
PARAMS = ("k",)  # episode-record settings constant over a run: MLflow params (prefixed "episode.")
# logit-scale curves derived from the temperatures: tau = 1 / exp(logit_scale) (protoclip.train.loop.temperatures)
SCALES = {"tau_clip": "logit_scale", "tau_proto": "proto_logit_scale"}


def step_metrics(rec: dict[str, Any]) -> dict[str, float]:
    """The ``train/*`` metrics of one read-back ``step`` record (counters left out)."""
    out = {f"train/{k}": float(v) for k, v in rec.items() if k not in COUNTERS and _number(v)}
    for tau, scale in SCALES.items():
        if _number(rec.get(tau)) and rec[tau] > 0:
            out[f"train/{scale}"] = 1.0 / float(rec[tau])
    return out


def episode_metrics(rec: dict[str, Any]) -> dict[str, float]:
    """The ``episode/*`` and ``val/*`` metrics of an ``episode`` record (counters, their means and params left
    out)."""
    out = {}
    for k, v in rec.items():
        if k in COUNTERS or k in PARAMS or k.removeprefix("mean/") in COUNTERS or not _number(v):
            continue
        out[k if k.startswith("val/") else f"episode/{k}"] = float(v)
    return out


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _setting(v: Any) -> Any:
    """A whole float (the episode record's ``k`` = 20.0) as the int it counts, so the param reads ``20``."""
    return int(v) if isinstance(v, float) and v.is_integer() else v


class Curves:
    """One training call's MLflow curves: the kept step records of the running episode, sent with its record.

    ``tracker``: a :class:`~protoclip.tracking.Tracker`; ``enabled``: whether this process logs (rank 0)."""

    def __init__(self, tracker: Any, enabled: bool = True):
        self.tracker, self.enabled = tracker, enabled
        self.rows: list[tuple[int, int, dict[str, float]]] = []  # (global step, time in ms, metrics)
        self.params_sent: set[str] = set()

    def add(self, rec: dict[str, Any]) -> None:
        """Hold a read-back ``step`` record (stamped with the time it was read back)."""
        if self.enabled:
            self.rows.append((rec["step"], int(time.time() * 1000), step_metrics(rec)))

    def end_episode(self, rec: dict[str, Any]) -> None:
        """Send the held steps and the ``episode`` record ``rec`` (at its ``step``) in one batch; its settings
        (:data:`PARAMS`) as params the first time this call sees them."""
        if not self.enabled:
            return
        params = {k: _setting(rec[k]) for k in PARAMS if k in rec and k not in self.params_sent}
        if params:
            self.tracker.log_params({"episode": params})
            self.params_sent.update(params)
        rows, self.rows = self.rows, []
        self.tracker.log_curves([*rows, (rec["step"], int(time.time() * 1000), episode_metrics(rec))])


__all__ = ["Curves", "episode_metrics", "step_metrics"]
