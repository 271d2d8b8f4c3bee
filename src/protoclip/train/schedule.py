"""Episode and learning-rate schedule of the episodic trainer (pure functions, no torch state): ProtoCLIP Sec. III-D's
n_episode = n_epoch * M / m episodes of m samples, Table I's warm-up + cosine LR, Sec. IV-A2's locked-image epoch,
and the related papers' step decay and step budgets. ``Schedule.from_config(cfg, dataset_size=len(ds),
world_size=1)`` -> ``.lr(step)``, ``.image_lr(step)``. The conventions where the papers are silent (global batch,
rounding, warm-up units, epochs of a step): docs/methods.md, "protoclip.train.schedule".
"""
from __future__ import annotations

import math
from dataclasses import dataclass


def n_episodes(epochs: float, dataset_size: int, episode_size: int) -> int:
    """Number of episodes, ``ceil(epochs * M / m)`` (Sec. III-D)."""
    if dataset_size < 1 or episode_size < 1:
        raise ValueError(f"dataset_size ({dataset_size}) and episode_size ({episode_size}) must be >= 1")
    if epochs <= 0:
        raise ValueError(f"epochs must be > 0, got {epochs}")
    # round() first: 4 * 1000 / 1000 may be 4.000000000000001 in floating point
    return max(1, math.ceil(round(epochs * dataset_size / episode_size, 9)))


def per_rank_batch(global_batch: int, world_size: int) -> int:
    """Each rank's batch of a global batch ``B`` on ``world_size`` ranks: ``B / world_size`` (exact: a batch
    that does not split evenly would change the contrastive problem's size on some ranks)."""
    if global_batch < 1 or world_size < 1:
        raise ValueError(f"batch_size ({global_batch}) and world size ({world_size}) must be >= 1")
    if global_batch % world_size:
        raise ValueError(f"batch_size {global_batch} (the global batch) is not a multiple of the {world_size} "
                         "ranks (GPUs) of the run")
    return global_batch // world_size


def steps_per_episode(episode_size: int, batch_size: int, world_size: int = 1) -> int:
    """Optimizer steps per episode: ``ceil(ceil(m / world) / batch)``; ``ceil(m / batch)`` on one process."""
    if episode_size < 1 or batch_size < 1 or world_size < 1:
        raise ValueError(f"episode_size ({episode_size}), batch_size ({batch_size}) and world_size "
                         f"({world_size}) must be >= 1")
    per_rank = math.ceil(episode_size / world_size)
    return math.ceil(per_rank / batch_size)


def trained_batches_per_episode(episode_size: int, batch_size: int, world_size: int = 1) -> int:
    """Batches of one episode the trainer takes a step on: those of >= 2 items (per rank).

    A batch of one item is skipped (BatchNorm cannot train on it and a contrastive loss has no negative), so
    this is :func:`steps_per_episode` less a final batch of one; 0 means the run would train nothing.
    """
    if batch_size < 2:
        return 0
    per_rank = math.ceil(episode_size / world_size)
    return per_rank // batch_size + (per_rank % batch_size >= 2)


def warmup_cosine_lr(step: int, base_lr: float, warmup_steps: int, total_steps: int, min_lr: float = 0.0) -> float:
    """Linear warm-up then cosine decay to ``min_lr``: the formula of open_clip's ``cosine_lr`` (the codebase
    ProtoCLIP is built on), ``base * (step + 1) / warmup`` during warm-up, then
    ``min + 0.5 * (1 + cos(pi * e / es)) * (base - min)``; ``min_lr`` 0 gives open_clip's formula exactly; nCLIP
    ends at 2e-6 (Table 14, nclip-xclip.txt l.558: "learning rate end 2e-6")."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    decay_steps = total_steps - warmup_steps
    if decay_steps <= 0:  # warm-up covers the whole run: stay at the peak
        return base_lr
    progress = min(step - warmup_steps, decay_steps) / decay_steps
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (base_lr - min_lr)


def step_decay_lr(step: int, base_lr: float, warmup_steps: int, milestones: tuple[float, ...], gamma: float,
                  steps_per_epoch: float) -> float:
    """Linear warm-up (as :func:`warmup_cosine_lr`) then ``base * gamma ** k``, k = the milestones (epochs)
    reached at ``step``, whose epoch is ``step / steps_per_epoch`` (PCL / MoCo step decay, pcl-protonce.txt
    l.150: "multiplied by 0.1 at 120 and 160 epochs"; docs/methods.md, "protoclip.train.schedule")."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    epoch = round(step / steps_per_epoch, 9)  # round(): 120 * 7 / 7.0 must read as epoch 120, not 119.999...
    return base_lr * gamma ** sum(epoch >= m for m in milestones)


def budget_episodes(steps: int, steps_per_ep: int) -> int:
    """Episodes a budget of ``steps`` optimizer steps draws: ``ceil(steps / steps_per_episode)`` (the last one
    is cut at ``steps``: docs/methods.md, "protoclip.train.schedule")."""
    if steps < 1 or steps_per_ep < 1:
        raise ValueError(f"steps ({steps}) and steps_per_episode ({steps_per_ep}) must be >= 1")
    return math.ceil(steps / steps_per_ep)


def warmup_steps(warmup_episodes: int, steps_per_ep: int, warmup_samples: int | None, batch_size: int,
                 world_size: int = 1, warmup_iterations: int | None = None) -> int:
    """Warm-up length in optimizer steps: ``warmup_iterations`` (the config's ``warmup_steps``) when given, else
    ``ceil(warmup_samples / (batch * world))`` when ``warmup_samples`` is given (independent of the episode
    size), else ``warmup_episodes * steps_per_episode``. Why samples: docs/methods.md, "protoclip.train.schedule"."""
    if warmup_iterations is not None:
        if warmup_iterations < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_iterations}")
        return warmup_iterations
    if warmup_samples is not None:
        if warmup_samples < 0:
            raise ValueError(f"warmup_samples must be >= 0, got {warmup_samples}")
        return math.ceil(warmup_samples / (batch_size * world_size))
    return warmup_episodes * steps_per_ep


def epoch_at_step(step: int, batch_size: int, dataset_size: int, world_size: int = 1) -> float:
    """Epochs of data seen before optimizer step ``step``: ``step * batch * world / M``."""
    return step * batch_size * world_size / dataset_size


def image_lr_factor(step: int, batch_size: int, dataset_size: int, lock_image_epoch: float | None,
                    world_size: int = 1) -> float:
    """1.0 before ``lock_image_epoch``, 0.0 from it on (locked-image tuning, Sec. IV-A2); 1.0 when None."""
    if lock_image_epoch is None:
        return 1.0
    return 0.0 if epoch_at_step(step, batch_size, dataset_size, world_size) >= lock_image_epoch else 1.0


def early_stop_update(state: dict | None, value: float | None, patience: int, min_delta: float = 0.0) -> dict:
    """One episode of the early-stop rule; returns the new state ``{"best", "bad", "stopped"}`` (JSON-able).

    ProtoCLIP Sec. IV-A2: "Same as XDC, we employ early stop to prevent over-fitting", with no criterion
    given. Our rule (a choice, documented in TrainConfig.early_stop): stop once the monitored episode value
    (lower is better) has not improved on its best by more than ``min_delta`` for ``patience`` consecutive
    episodes. A missing or non-finite value neither improves nor counts as a bad episode.
    """
    if patience < 1:
        raise ValueError(f"patience must be >= 1, got {patience}")
    new = {"best": None, "bad": 0, "stopped": False, **(state or {})}
    if value is None or not math.isfinite(value) or new["stopped"]:
        return new
    if new["best"] is None or value < new["best"] - min_delta:
        new["best"], new["bad"] = float(value), 0
    else:
        new["bad"] += 1
    new["stopped"] = new["bad"] >= patience
    return new


@dataclass(frozen=True)
class Schedule:
    """The resolved schedule of one run (all counts in optimizer steps)."""

    base_lr: float
    dataset_size: int  # M
    episode_size: int  # m (already capped at M)
    batch_size: int  # per rank (the config's global batch / world_size: per_rank_batch)
    world_size: int
    n_episodes: int
    steps_per_episode: int
    warmup_steps: int
    lock_image_epoch: float | None
    budget_steps: int | None = None  # a `steps` budget: the run stops after this many steps (else n_episodes')
    lr_schedule: str = "cosine"  # cosine | step
    min_lr: float = 0.0  # the cosine's final LR
    milestones: tuple[float, ...] = ()  # the step schedule's epochs
    gamma: float = 0.1  # the step schedule's factor

    @property
    def total_steps(self) -> int:
        return self.budget_steps if self.budget_steps is not None else self.n_episodes * self.steps_per_episode

    @property
    def steps_per_epoch(self) -> float:
        """Optimizer steps of one epoch as the step schedule counts it: ``M / m`` episodes (docs/methods.md,
        "protoclip.train.schedule")."""
        return self.steps_per_episode * self.dataset_size / self.episode_size

    @classmethod
    def build(cls, *, base_lr: float, epochs: float, dataset_size: int, episode_size: int, batch_size: int,
              warmup_episodes: int, lock_image_epoch: float | None, world_size: int = 1,
              warmup_samples: int | None = None, steps: int | None = None, warmup_iterations: int | None = None,
              lr_schedule: str = "cosine", min_lr: float = 0.0, milestones: tuple[float, ...] = (),
              gamma: float = 0.1) -> "Schedule":
        """``steps`` (optimizer steps) replaces ``epochs`` when given; ``warmup_iterations`` (the config's
        ``warmup_steps``) replaces the other warm-up units."""
        spe = steps_per_episode(episode_size, batch_size, world_size)
        n_ep = budget_episodes(steps, spe) if steps is not None else n_episodes(epochs, dataset_size, episode_size)
        return cls(base_lr=base_lr, dataset_size=dataset_size, episode_size=episode_size, batch_size=batch_size,
                   world_size=world_size, n_episodes=n_ep, steps_per_episode=spe,
                   warmup_steps=warmup_steps(warmup_episodes, spe, warmup_samples, batch_size, world_size,
                                             warmup_iterations),
                   lock_image_epoch=lock_image_epoch, budget_steps=steps, lr_schedule=lr_schedule, min_lr=min_lr,
                   milestones=tuple(milestones), gamma=gamma)

    @classmethod
    def from_config(cls, cfg, dataset_size: int, world_size: int = 1) -> "Schedule":
        """The schedule of a TrainConfig ``cfg`` (read by attribute: this module imports no config) on a data set
        of ``dataset_size`` items over ``world_size`` ranks; m capped at M, the per-rank batch B / world."""
        if dataset_size < 1 or world_size < 1 or cfg.batch_size % world_size:
            raise ValueError(f"dataset_size ({dataset_size}) and world_size ({world_size}) must be >= 1, and "
                             f"batch_size {cfg.batch_size} a multiple of the world size")
        return cls.build(base_lr=cfg.lr, epochs=cfg.epochs, dataset_size=dataset_size,
                         episode_size=min(cfg.episode_size, dataset_size), batch_size=cfg.batch_size // world_size,
                         warmup_episodes=cfg.warmup_episodes, lock_image_epoch=cfg.lock_image_epoch,
                         world_size=world_size, warmup_samples=cfg.warmup_samples, steps=cfg.steps,
                         warmup_iterations=cfg.warmup_steps, lr_schedule=cfg.lr_schedule, min_lr=cfg.min_lr,
                         milestones=tuple(cfg.lr_milestones), gamma=cfg.lr_gamma)

    def lr(self, step: int) -> float:
        """LR of every non-image parameter group at ``step``."""
        if self.lr_schedule == "step":
            return step_decay_lr(step, self.base_lr, self.warmup_steps, self.milestones, self.gamma,
                                 self.steps_per_epoch)
        return warmup_cosine_lr(step, self.base_lr, self.warmup_steps, self.total_steps, self.min_lr)

    def image_lr(self, step: int) -> float:
        """LR of the image-encoder groups: :meth:`lr` times the locked-image factor."""
        return self.lr(step) * image_lr_factor(step, self.batch_size, self.dataset_size, self.lock_image_epoch,
                                               self.world_size)

    def epoch(self, step: int) -> float:
        return epoch_at_step(step, self.batch_size, self.dataset_size, self.world_size)
