"""Step records kept on the device and read back once per log interval (open_clip's ``--log-every-n-steps``), so
that a training step never reads a value back to the host. A non-finite loss term or gradient norm is reported at
the read-back; until then the fused optimizer's ``found_inf`` flag skips the updates from the bad step on, so the
weights are those before it. The design: docs/methods.md, "protoclip.train.step_log".
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

import torch

from protoclip.train.checkpoint import TrainingStopped, kept_checkpoint


class NonFiniteLossError(TrainingStopped):
    """A loss term, the gradient norm or the episode's features became NaN/Inf; the message names the step,
    the episode and the term."""


def scalar64(v: torch.Tensor) -> torch.Tensor:
    """A one-element tensor as a detached float64 0-d tensor on its device (exact for every float dtype:
    float64 holds every bf16/fp32/fp64 value, so the numbers logged are those ``float(t)`` gave)."""
    return v.detach().reshape(()).to(torch.float64)


class StepWindow:
    """The step records since the last read-back and the device flag that masks updates after a bad step.

    ``every``: read back after this many steps (``train.log_every_steps``); ``write_every``: the log keeps the
    records of steps divisible by it (``train.log_every``); ``write``: appends a record to the train log;
    ``checkpoint``: the checkpoint path named in the stop message; ``overflow_skips``: fp16 (a non-finite
    gradient norm is a GradScaler overflow, not a stop).
    """

    def __init__(self, every: int, write_every: int, write: Callable[[dict], None], checkpoint: Path,
                 device: torch.device, overflow_skips: bool = False):
        self.every, self.write_every, self.write, self.checkpoint = every, write_every, write, checkpoint
        self.device, self.overflow_skips = device, overflow_skips
        self.pending: list[tuple[dict[str, Any], list[str], list[str], torch.Tensor]] = []
        self.halted = torch.zeros((), dtype=torch.float32, device=device)  # 1 from the first bad step on

    # ---- per step, on the device ----
    def loss_flag(self, terms: dict[str, torch.Tensor], loss: torch.Tensor, info: Any
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """(the float64 vector [loss, *terms], its non-finite flag agreed across DDP ranks, as float32 0/1)."""
        head = torch.stack([scalar64(loss), *(scalar64(v) for v in terms.values())])
        bad = (~torch.isfinite(head).all()).to(torch.float32)
        if info.enabled:
            torch.distributed.all_reduce(bad, op=torch.distributed.ReduceOp.MAX)
        return head, bad

    def found_inf(self, loss_bad: torch.Tensor, grad_norm: torch.Tensor) -> torch.Tensor:
        """The optimizer's skip flag for this step (float32 0-d): the window's first bad step and all after it;
        under fp16 also this step's gradient overflow (skipped, not halting)."""
        grad_bad = (~torch.isfinite(grad_norm)).to(torch.float32)
        if self.overflow_skips:
            self.halted = torch.maximum(self.halted, loss_bad)
            return torch.maximum(self.halted, grad_bad)
        self.halted = torch.maximum(self.halted, torch.maximum(loss_bad, grad_bad))
        return self.halted

    def push(self, rec: dict[str, Any], terms: list[str], head: torch.Tensor, loss_bad: torch.Tensor) -> None:
        """Hold one step's record (tensor values on the device; ``head`` = [loss, *terms] of
        :meth:`loss_flag`) until the next :meth:`flush`."""
        keys = [k for k, v in rec.items() if isinstance(v, torch.Tensor)]
        values = torch.cat([torch.stack([scalar64(rec[k]) for k in keys]), head, loss_bad.to(torch.float64)[None]])
        self.pending.append((rec, keys, terms, values))

    def due(self) -> bool:
        return len(self.pending) >= self.every

    # ---- at the log interval: one read-back ----
    def flush(self, sums: dict[str, float]) -> None:
        """Read the held steps back (one transfer), stop at the first non-finite one, write the kept lines and
        add every record's floats to the episode ``sums``.

        Called every ``train.log_every_steps`` steps and at the episode's end (whose record sums every step),
        before the episode's checkpoint, so no checkpoint is written after a bad step. The check, in step order,
        reports what a per-step check did: the first step whose loss terms (then the total) are not finite,
        naming the term, its episode and value, or else the first non-finite gradient norm
        (:class:`NonFiniteLossError`); under fp16 a non-finite gradient norm is the GradScaler's overflow, not a
        stop.
        """
        if not self.pending:
            return
        flat = torch.cat([p[3] for p in self.pending]).tolist()
        pending, self.pending = self.pending, []
        at = 0
        records = []
        for rec, keys, terms, values in pending:
            row = flat[at:at + len(values)]
            at += len(values)
            head, any_rank_bad = row[len(keys):-1], row[-1]
            self._check(rec, dict(zip(keys, row)), terms, head, any_rank_bad)
            records.append({k: (row[keys.index(k)] if k in keys else v) for k, v in rec.items()})
        self.halted.zero_()
        for rec in records:
            if rec["step"] % self.write_every == 0:
                self.write(rec)
            add_to_sums(sums, rec)

    def _check(self, rec: dict[str, Any], values: dict[str, float], terms: list[str], head: list[float],
               any_rank_bad: float) -> None:
        step, episode = rec["step"], rec["episode"]
        named = dict(zip(terms, head[1:]))
        named["total"] = head[0]
        bad = [n for n, v in named.items() if not math.isfinite(v)]
        if not bad and any_rank_bad > 0:
            bad = ["(on another rank)"]
        if bad:
            shown = ", ".join(f"{n}={named.get(n, float('nan'))}" for n in bad)
            raise NonFiniteLossError(f"non-finite loss at step {step} (episode {episode}): term {bad[0]!r} "
                                     f"({shown}); stopped, {kept_checkpoint(self.checkpoint)}")
        grad_norm = values["grad_norm"]
        if not math.isfinite(grad_norm) and not self.overflow_skips:
            # finite loss, overflowing gradient: its update (and the window's later ones) was skipped
            raise NonFiniteLossError(f"non-finite gradient norm at step {step} (episode {episode}): "
                                     f"{grad_norm}; stopped, {kept_checkpoint(self.checkpoint)}")


def add_to_sums(sums: dict[str, float], rec: dict[str, Any]) -> None:
    """Accumulate a step record's float values (the episode means' numerators)."""
    for k, v in rec.items():
        if k not in ("kind", "step", "episode") and isinstance(v, float):
            sums[k] = sums.get(k, 0.0) + v


__all__ = ["NonFiniteLossError", "StepWindow", "add_to_sums", "scalar64"]
