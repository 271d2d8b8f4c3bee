"""The episodic trainer shared by every training method (ProtoCLIP Sec. III-D, IV-A, Table I): per episode, sample
m items, let the method prepare the episode (``Method.begin_episode``: ProtoCLIP's k-means and PBT), then train on
its batches with the method's loss. Split as nanoGPT's loop is: :func:`restore`, :func:`run_episode` and
:func:`end_episode` over a :class:`Session`, the decisions pure functions (:func:`stop_decision`,
:func:`episode_record`); the entry point is :func:`train`. MLflow is never imported here: metrics go to the
``Tracker`` the stage passes in.
"""
from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ContextManager

import numpy as np
from open_clip.modified_resnet import ModifiedResNet
import torch
import yaml
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from protoclip.data.loading.batch import Batch
from protoclip.data.loading.device_augment import DeviceAugment
from protoclip.data.loading.transforms import image_form
from protoclip.files.atomic import write_text
from protoclip.errors import ConfigError
from protoclip.config.strict import to_dict
from protoclip.jobs.devices import resolve_device
from protoclip.files.layout import TrainFiles
from protoclip.prototypes.episode import NonFiniteFeaturesError
from protoclip.files.provenance import provenance
from protoclip.files.records import TrainLog
from protoclip.tracking import Tracker
from protoclip.train.checkpoint import (check_state_finite, kept_checkpoint, restore_rng,
                                       resume_key, rng_state, save_checkpoint)
from protoclip.train.config import TrainConfig
from protoclip.train.curves import Curves
from protoclip.train.distributed import (DistInfo, barrier, broadcast_object, destroy, env_world, gather_object,
                                        init_from_env, seed_rank, sync_buffers)
from protoclip.train.episode import episode_size_for
from protoclip.train.loader import RunLoader
from protoclip.train.methods.base import EpisodeData, Method, build_method
from protoclip.train.schedule import Schedule, early_stop_update, per_rank_batch, trained_batches_per_episode
from protoclip.train.step_log import NonFiniteLossError, StepWindow

log = logging.getLogger(__name__)

IMAGE_GROUPS = ("image_decay", "image_no_decay")  # groups whose LR locked-image tuning zeroes
# the resolved schedule's numbers logged as MLflow params (the curves' x axis is the global step)
SCHEDULE_PARAMS = ("dataset_size", "episode_size", "n_episodes", "steps_per_episode", "warmup_steps", "total_steps")


def resolved_precision(precision: str, device: torch.device) -> str:
    """What ``precision`` computes in on ``device``: ``fp16``, ``bf16`` (``auto`` on CUDA) or ``fp32``."""
    if precision == "fp16":
        if device.type != "cuda":
            raise ConfigError(f"precision: fp16 runs on CUDA only (autocast + GradScaler), the device is {device}")
        return "fp16"
    return "bf16" if precision == "bf16" or (precision == "auto" and device.type == "cuda") else "fp32"


def autocast_factory(precision: str, device: torch.device) -> Callable[[], ContextManager]:
    """bf16 autocast on CUDA for ``auto``/``bf16``; fp16 autocast for ``fp16`` (CUDA only, with the GradScaler
    of :func:`build_scaler`); fp32 (no autocast) on CPU or for ``fp32``.

    bf16 needs no GradScaler (same exponent range as fp32); fp16 does (gradients underflow without one).
    """
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(resolved_precision(precision, device))
    if dtype is None:
        return contextlib.nullcontext
    return lambda: torch.autocast(device_type=device.type, dtype=dtype)


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """``cfg.optimizer`` over the model's named groups; weight decay only on ``*_decay`` groups (Table I: 0.5).

    adamw: torch.optim.AdamW (decoupled weight decay; ProtoCLIP Table I, nCLIP, the temperature paper). sgd:
    torch.optim.SGD with ``momentum``, no dampening or Nesterov and the weight decay added to the gradient, as
    MoCo's and PCL's code build it (``torch.optim.SGD(params, lr, momentum=0.9, weight_decay=1e-4)``)."""
    groups = model.param_groups(cfg.weight_decay)
    for g in groups:
        if "name" not in g:
            raise ValueError("model.param_groups() must name every group ('image_decay', ...)")
        g["initial_lr"] = cfg.lr
    # fused: one kernel over all parameters instead of a Python-level foreach (faster on CPU too,
    # bench/README.md); same update rule as the default implementation. A fused optimizer also takes the
    # found_inf flag on the device (masked_step)
    fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for g in groups for p in g["params"])
    if cfg.optimizer == "sgd":
        sgd = torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, nesterov=False, fused=fused or None)
        # momentum buffers made now, as zeros: fused SGD's first step allocates them with torch.empty_like and, when
        # that step is skipped (masked_step's found_inf: a non-finite or fp16-overflowing first step), later steps
        # would read the uninitialised memory; with zeros (dampening 0) the first update is the same, buf = g
        for p in (p for g in groups for p in g["params"]) if cfg.momentum > 0 else ():
            sgd.state[p]["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return sgd
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, fused=fused or None)


def build_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler | None:
    """open_clip's GradScaler for ``precision: fp16`` (init scale 2^16, halved on an overflow, doubled after
    2000 clean steps); None otherwise."""
    return torch.amp.GradScaler(device.type) if precision == "fp16" else None


def masked_step(optimizer: torch.optim.Optimizer, found_inf: torch.Tensor) -> None:
    """``optimizer.step()``, skipped where ``found_inf`` (a 0-d float32 tensor on the device) is 1, without a host
    read: fused AdamW and fused SGD take the flag as GradScaler gives it (the update, weight decay, step count and
    SGD's momentum buffer of a flagged step are left as they were; a 0 flag changes no number). Another optimizer
    reads the flag (one sync)."""
    if getattr(optimizer, "_step_supports_amp_scaling", False):
        optimizer.found_inf, optimizer.grad_scale = found_inf, None  # gradients already unscaled
        try:
            optimizer.step()
        finally:
            del optimizer.found_inf, optimizer.grad_scale
    elif not bool(found_inf):
        optimizer.step()


def channels_last_(model: torch.nn.Module, device: torch.device) -> bool:
    """A ResNet image tower on CUDA in channels_last memory format (cuDNN's NHWC convolutions under autocast);
    returns whether the training images are to follow. CPU runs and ViTs are left as they are."""
    visual = getattr(getattr(model, "clip", None), "visual", None)
    if device.type != "cuda" or not isinstance(visual, ModifiedResNet):
        return False
    visual.to(memory_format=torch.channels_last)
    return True


def set_lrs(optimizer: torch.optim.Optimizer, lr: float, image_lr: float) -> None:
    for g in optimizer.param_groups:
        g["lr"] = image_lr if g.get("name") in IMAGE_GROUPS else lr


def temperatures(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """tau = 1 / exp(logit_scale) of the CLIP and prototype temperatures (those the model has), on the device."""
    out = {}
    for attr, key in (("logit_scale", "tau_clip"), ("proto_logit_scale", "tau_proto")):
        p = getattr(model, attr, None)
        if p is not None:
            out[key] = torch.exp(-p.detach().float())
    return out


class TrainForward(torch.nn.Module):
    """The method's forward (model outputs + exponentiated logit scales), keeping only the outputs the loss uses.

    Under DDP every parameter the loss uses must be touched inside ``forward`` (one used only outside is
    marked ready twice), and every output must reach the loss (``find_unused_parameters`` walks the graph
    from the outputs: an output the loss ignores, e.g. h in a CLIP run, would leave its parameters waiting
    for a gradient that never comes).
    """

    def __init__(self, model: torch.nn.Module, method: Method):
        super().__init__()
        self.model, self.method, self.keep = model, method, set(method.outputs())

    def forward(self, images, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        out = self.method.forward(self.model, images, tokens)
        return {k: v for k, v in out.items() if k in self.keep}


def write_config(path: Path, config: dict) -> None:
    """The run's ``config.yaml``: the resolved TrainConfig as a dict (``to_dict``)."""
    write_text(path, yaml.safe_dump(config, sort_keys=False))


def require_training_steps(cfg: TrainConfig, dataset_size: int, episode_size: int, world_size: int) -> None:
    """Stop before training when no episode would hold a batch of >= 2 items: the run would take no optimizer
    step and write an untrained model (a batch of one is skipped, see the episode loop)."""
    try:
        batch = per_rank_batch(cfg.batch_size, world_size)  # cfg.batch_size is the global batch
    except ValueError as err:
        raise ConfigError(f"run '{cfg.name}': {err}") from None
    if trained_batches_per_episode(episode_size, batch, world_size) == 0:
        capped = f" (capped at the {dataset_size} training pairs)" if episode_size < cfg.episode_size else ""
        raise ConfigError(
            f"run '{cfg.name}': batch_size {cfg.batch_size} and episode_size {episode_size}{capped} over "
            f"{world_size} process(es) give no batch of >= 2 items, so no optimizer step would run; "
            "batch_size and the per-process episode share must be >= 2")


@dataclass
class Progress:
    """Where a run stands between episodes: what a checkpoint saves and :func:`restore` gives back."""

    episode: int = 0  # index of the next episode to run
    step: int = 0  # global optimizer step
    prototypes: Any = None  # the last episode's prototypes (kept in the checkpoint for inspection)
    early_stop: dict | None = None  # schedule.early_stop_update state; None until the first update

    @property
    def stopped(self) -> bool:
        return self.early_stop is not None and bool(self.early_stop["stopped"])


@dataclass(kw_only=True)
class Session:
    """What stays fixed during one :func:`train` call (built once, read by the episode helpers)."""

    cfg: TrainConfig
    run: str
    model: torch.nn.Module
    net: torch.nn.Module  # the method's forward, DDP-wrapped under torchrun
    optimizer: torch.optim.Optimizer
    method: Method
    sched: Schedule
    dataset: Dataset
    teacher: np.ndarray | None
    use_teacher: bool
    info: DistInfo
    device: torch.device
    autocast: Callable[[], ContextManager]
    tlog: TrainLog
    tracker: Tracker
    curves: Curves  # the tracker's per-step curves, sent per episode (protoclip.train.curves)
    checkpoint: Path
    resume_key: dict
    # protoclip.train.validation.Validator (its due(), and its call on the model -> val/* numbers) or None
    validator: Any = None
    loader: RunLoader | None = None  # the run's one DataLoader: both passes of every episode (run_loader)
    scaler: torch.amp.GradScaler | None = None  # precision: fp16 (build_scaler)
    channels_last: bool = False  # images in channels_last (a ResNet tower on CUDA, channels_last_)


def run_loader(cfg: TrainConfig, dataset: Dataset, sched: Schedule, info: DistInfo, device: torch.device,
               image_size: int, method: Method) -> RunLoader:
    """The run's one DataLoader (:mod:`protoclip.train.loader`): this rank's batches of both passes of every
    episode, its workers started once, stacking the images in the form of the method's training transform.
    ``extract_batch_size`` is global like ``batch_size`` (null: twice it)."""
    extract = cfg.extract_batch_size if cfg.extract_batch_size is not None else 2 * cfg.batch_size
    augment = DeviceAugment(cfg.augmentation, image_size) if cfg.augment_on == "device" else None
    return RunLoader(dataset, episode_size=sched.episode_size, seed=cfg.seed, batch_size=sched.batch_size,
                     extract_batch_size=per_rank_batch(extract, info.world_size), num_workers=cfg.num_workers,
                     info=info, device=device, n_episodes=sched.n_episodes, augment=augment,
                     form=image_form(method.train_transform(cfg, image_size)))


def setup_device(name: str) -> tuple[torch.device, DistInfo]:
    """The resolved device (under torchrun a bare ``cuda`` is this process's local GPU, set before nccl init)
    and the process group's rank info."""
    device = resolve_device(name)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", env_world().local_rank)
        torch.cuda.set_device(device)
    return device, init_from_env(device)


def restore(state: dict, model: torch.nn.Module, optimizer: torch.optim.Optimizer, method: Method) -> Progress:
    """Load a checkpoint's state (accepted by :func:`~protoclip.train.checkpoint.resume_point`) into the
    model, optimizer, method and the RNGs (``state`` is read, not changed); returns where the run stands."""
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    method.load_state_dict(state["extra"].get("method", {}))
    restore_rng(state["rng"])
    return Progress(state["episode"], state["step"], state["prototypes"], state["extra"].get("early_stop"))


def restore_rank_rng(state: dict, seed: int, info: DistInfo) -> None:
    """A resumed rank r > 0 continues its own RNG streams (``extra.rng_ranks`` of a checkpoint of the same world
    size); :func:`restore` gave it rank 0's. Otherwise (another world size) it reseeds as a fresh rank r."""
    if info.rank == 0:
        return
    ranks = state["extra"].get("rng_ranks")
    if ranks and len(ranks) == info.world_size:
        restore_rng(ranks[info.rank])
    else:
        seed_rank(seed, info)


def world_record(cfg: TrainConfig, info: DistInfo) -> dict[str, int]:
    """The resolved process count and batch sizes of the run (logged and saved with the run)."""
    return {"world_size": info.world_size, "per_rank_batch": per_rank_batch(cfg.batch_size, info.world_size),
            "global_batch": cfg.batch_size}  # batch_size is the global batch (train/schedule.py)


def train_step(s: Session, batch: Batch, prototypes: Any, step: int, episode: int, window: StepWindow) -> None:
    """One optimizer step on one batch; its ``step`` record stays on the device in ``window`` (no host read).

    A non-finite loss term or gradient norm is not raised here (that would wait for the device every step):
    the window flags it on the device, the fused update of that step and of the window's later steps is
    skipped (:func:`masked_step`), and :meth:`StepWindow.flush` stops the run naming the step and the term."""
    # locked-image tuning zeroes the LR only, as the paper states (Sec. IV-A2); BatchNorm running
    # statistics of the image encoder keep updating in train mode
    lr, image_lr = s.sched.lr(step), s.sched.image_lr(step)
    set_lrs(s.optimizer, lr, image_lr)
    batch = batch.on_device(s.device, torch.channels_last if s.channels_last else torch.preserve_format)
    with s.autocast():
        out = s.net(batch.images, batch.tokens)
    terms = s.method.terms(s.model, out, batch.positions.to(s.device, non_blocking=True), prototypes)
    loss = s.method.total(terms)
    head, loss_bad = window.loss_flag(terms, loss, s.info)
    s.optimizer.zero_grad(set_to_none=True)
    (loss if s.scaler is None else s.scaler.scale(loss)).backward()
    if s.scaler is not None:
        s.scaler.unscale_(s.optimizer)  # clip the true gradients; records the overflow for scaler.update()
    grad_norm = torch.nn.utils.clip_grad_norm_(s.model.parameters(), s.cfg.grad_clip)
    masked_step(s.optimizer, window.found_inf(loss_bad, grad_norm))
    if s.scaler is not None:
        s.scaler.update()
    s.method.after_step(s.model)
    window.push({"kind": "step", "step": step, "episode": episode, "epoch": s.sched.epoch(step), "lr": lr,
                 "image_lr": image_lr, "loss": loss, "grad_norm": grad_norm, **terms, **s.method.diagnostics(),
                 **temperatures(s.model)},
                list(terms), head, loss_bad)


def episode_record(episode: int, step: int, n_steps: int, sums: dict[str, float], stats: dict[str, float],
                   times: dict[str, float]) -> dict[str, Any]:
    """The ``episode`` record: step means, the method's episode statistics and the time split."""
    return {"kind": "episode", "episode": episode, "step": step, "n_steps": n_steps,
            **{f"mean/{k}": v / max(n_steps, 1) for k, v in sums.items()}, **stats,
            **{f"time/{k}": v for k, v in times.items()}}


def run_episode(s: Session, episode: int, step: int) -> tuple[dict[str, Any], int, Any]:
    """Sample episode ``episode``, let the method prepare it, train on its batches from global step ``step``.
    Returns the episode record, the next global step and the episode's prototypes."""
    indices = s.loader.indices(episode)
    data = EpisodeData(s.dataset, indices, s.loader.pass_of(episode, "extract"), s.info, s.device, s.autocast,
                       s.teacher, s.use_teacher)
    try:
        prototypes, stats, times = s.method.begin_episode(s.model, data, episode)
    except NonFiniteFeaturesError as err:  # weights broke in the last step of the previous episode
        raise NonFiniteLossError(f"non-finite features at step {step} (episode {episode}): {err}; stopped, "
                                 f"{kept_checkpoint(s.checkpoint)}") from None
    t0 = time.perf_counter()
    sums: dict[str, float] = {}
    n_steps = 0
    def keep(rec: dict[str, Any]) -> None:  # a step line the log keeps: also a point of the MLflow curves
        s.tlog.append(rec)
        s.curves.add(rec)

    window = StepWindow(s.cfg.log_every_steps, s.cfg.log_every, keep, s.checkpoint, s.device,
                        overflow_skips=s.scaler is not None)
    for batch in tqdm(s.loader.pass_of(episode, "train"), desc=f"episode {episode}", leave=False,
                      disable=not s.info.is_main):
        if len(batch) < 2:  # BatchNorm (heads, ResNet) cannot train on one sample; the same on every rank
            log.warning("episode %d: skipping a final batch of 1 item", episode)
            continue
        train_step(s, batch, prototypes, step, episode, window)
        if window.due():  # the one host read of the interval: check, write the kept lines, add to the sums
            window.flush(sums)
        step += 1
        n_steps += 1
        if step >= s.sched.total_steps:  # a `steps` budget ends inside its last episode (train.schedule)
            break
    window.flush(sums)  # the episode's last steps, before its record and checkpoint
    sync_buffers(s.model, s.info)  # identical BatchNorm statistics in every rank's checkpoint / final model
    # data_wait: the first-batch waits of the episode's passes (they overlap the phases, so not one of them)
    times = {**times, "train": time.perf_counter() - t0, "data_wait": s.loader.take_wait()}
    return episode_record(episode, step, n_steps, sums, stats, times), step, prototypes


def stop_decision(episode: int, n_episodes: int, stopped_early: bool, done_here: int,
                  stop_after_episodes: int | None) -> bool:
    """Whether the call ends after ``episode`` (the ``done_here``-th of this call, 1-based): the last scheduled
    episode, an early stop, or ``stop_after_episodes`` reached."""
    return (episode + 1 == n_episodes or stopped_early
            or (stop_after_episodes is not None and done_here >= stop_after_episodes))


def end_episode(s: Session, progress: Progress, records: list[dict[str, Any]], stopping: bool,
                save_due: bool) -> bool:
    """Log the episode's ``records`` (its episode record, an early stop), then checkpoint (when ``stopping`` or
    ``save_due``, rank 0's decision), then send the episode's curves to the tracker; wait for every rank.
    ``progress`` already points past the episode. Returns whether a checkpoint was written.

    The order keeps the log and the checkpoint consistent under a kill at any point: records the checkpoint
    does not cover yet are cut on resume and written again when the episode is redone, so none is lost or
    doubled; a checkpoint never covers an episode whose record is missing."""
    # the same decision on every rank (rank 0's clock), so that all check and wait at the barrier together
    save = broadcast_object(stopping or save_due, s.info)
    if save:
        # every rank checks (DDP keeps their weights identical), so all stop together instead of waiting at
        # the barrier for a rank 0 that refused to save
        check_state_finite(s.model, s.optimizer, step=progress.step - 1, episode=progress.episode - 1,
                           checkpoint=s.checkpoint)
    rng_ranks = gather_object(rng_state(), s.info) if save and s.info.enabled else None  # each rank's own streams
    for rec in records:
        s.tlog.append(rec)
    if save:
        if s.info.is_main:
            protos = progress.prototypes
            save_checkpoint(s.checkpoint, model=s.model, optimizer=s.optimizer, episode=progress.episode,
                            step=progress.step, prototypes=protos.to("cpu") if hasattr(protos, "to") else protos,
                            extra={"run": s.run, "config": s.resume_key, "method": s.method.state_dict(),
                                   "early_stop": progress.early_stop,
                                   **({"scaler": s.scaler.state_dict()} if s.scaler is not None else {}),
                                   **({"rng_ranks": rng_ranks} if rng_ranks else {})})
    if s.info.is_main:  # the episode's kept steps and its record, at the global step (one batch)
        s.curves.end_episode(records[0])
    barrier(s.info)
    return save


def wrap_for_ddp(model: torch.nn.Module, method: Method, device: torch.device, info: DistInfo) -> torch.nn.Module:
    """The method's forward, DDP-wrapped under torchrun (the module the training steps call)."""
    net: torch.nn.Module = TrainForward(model, method)
    if info.enabled:
        # e.g. CLIP runs leave the heads and tau_Proto without gradient, Proto-only runs tau_CLIP: only then
        # does DDP need the (slower) search for unused parameters
        net = torch.nn.parallel.DistributedDataParallel(
            net, device_ids=[device.index] if device.type == "cuda" else None,
            find_unused_parameters=method.find_unused_parameters())
    return net


def log_start(s: Session, progress: Progress, config: dict, config_path: Path, resumed: bool) -> None:
    """``config.yaml``, the log's ``start`` (or, resumed, ``resume``) record (provenance, resolved schedule and
    world size) and the MLflow params, at every (re)start."""
    world = world_record(s.cfg, s.info)
    log.info("run %s: %s on %s, %s%s; %d process(es), batch %d per process, global batch %d", s.run,
             s.cfg.model, s.device, resolved_precision(s.cfg.precision, s.device),
             ", channels_last" if s.channels_last else "", world["world_size"], world["per_rank_batch"],
             world["global_batch"])
    prov = provenance(s.cfg.seed)
    if s.info.is_main:
        write_config(config_path, config)
    sched = s.sched
    s.tlog.append({"kind": "resume" if resumed else "start", "episode": progress.episode, "step": progress.step, "provenance": prov,
                   "schedule": {"dataset_size": sched.dataset_size, "episode_size": sched.episode_size,
                                "n_episodes": sched.n_episodes, "steps_per_episode": sched.steps_per_episode,
                                "warmup_steps": sched.warmup_steps, "total_steps": sched.total_steps, **world}})
    if s.info.is_main:
        # the schedule as params: the episode and epoch of a curve's global step follow from them
        s.tracker.log_params({"train": config, "provenance": prov, "world": world,
                              "schedule": {k: getattr(sched, k) for k in SCHEDULE_PARAMS},
                              # what the method derives from the data, e.g. PCL's K list and negatives drawn
                              "resolved": s.method.resolved(sched.episode_size)})


def run_episodes(s: Session, progress: Progress, stop_after_episodes: int | None) -> None:
    """The episodes from ``progress`` on, until the schedule ends, early stop or ``stop_after_episodes``."""
    cfg, n_episodes = s.cfg, s.sched.n_episodes
    s.model.train()
    last_save = time.monotonic()
    episodes = range(progress.episode, n_episodes)
    for done_here, episode in enumerate(tqdm(episodes, desc=f"train {s.run}", disable=not s.info.is_main,
                                             initial=progress.episode, total=n_episodes), start=1):
        if progress.stopped:  # resuming a run that had stopped early
            break
        ep_rec, step, prototypes = run_episode(s, episode, progress.step)
        early_stop = progress.early_stop
        if cfg.early_stop.enabled:  # decided on rank 0 (episode means are per rank) and shared
            early_stop = broadcast_object(early_stop_update(early_stop, ep_rec.get(cfg.early_stop.metric),
                                                            cfg.early_stop.patience, cfg.early_stop.min_delta), s.info)
        progress = Progress(episode + 1, step, prototypes, early_stop)
        stopping = stop_decision(episode, n_episodes, progress.stopped, done_here, stop_after_episodes)
        if s.validator is not None and s.info.is_main and s.validator.due(episode, n_episodes, progress.stopped):
            ep_rec.update(s.validator(s.model))  # val/* and time/validation: logged with the episode
        records = [ep_rec]
        if progress.stopped:
            log.info("early stop after episode %d: %s has not improved on %.6g for %d episodes", episode,
                     cfg.early_stop.metric, early_stop["best"], early_stop["bad"])
            records.append({"kind": "early_stop", "episode": episode, "step": step, **early_stop})
        if end_episode(s, progress, records, stopping, time.monotonic() - last_save >= cfg.checkpoint_interval_s):
            last_save = time.monotonic()
        if stopping:
            break


def train(model: torch.nn.Module, dataset: Dataset, cfg: TrainConfig, files: TrainFiles, *,
          state: dict | None = None, teacher: np.ndarray | None = None, tracker: Tracker | None = None,
          stop_after_episodes: int | None = None, validator: Any = None) -> torch.nn.Module:
    """Train ``model`` on ``dataset`` (items ``(image, tokens, id)``) and return it (unwrapped).

    ``files``: where the run's config, log and checkpoint go. ``state``: None trains from scratch (the log starts
    empty); a checkpoint state that :func:`~protoclip.train.checkpoint.resume_point` accepted continues it (the
    log is cut back to what the checkpoint covers). The caller decides which, and removes an older training's
    files for a training from scratch (protoclip.train.stage). ``teacher``: cached external-teacher features
    [M, d], row i belonging to ``dataset[i]`` (the stage aligns the cache by id). ``stop_after_episodes`` ends
    the call after that many episodes of this call (checkpoint written): used to test resume. ``validator``: a
    :class:`~protoclip.train.validation.Validator` (the main process scores the model with it after the episodes
    it says, into their records) or None.

    Optimizer AdamW (decoupled weight decay only on the model's ``*_decay`` groups) or SGD (:func:`build_optimizer`),
    warm-up + cosine LR, the image groups' LR zeroed from ``lock_image_epoch`` (:mod:`protoclip.train.schedule`),
    grad-norm clipping, ``Method.after_step`` after every step (logit-scale clamps), bf16 autocast on CUDA (fp32
    on CPU; ``precision: fp16``: fp16 autocast and a GradScaler on CUDA). A step reads nothing back to the host:
    its record stays on the device until the log interval (:mod:`protoclip.train.step_log`).

    Files: ``config.yaml`` and the train log from the start, ``checkpoints/last.pt`` at episode ends (atomic; at
    most every ``checkpoint_interval_s`` seconds, and always after the final episode). An episode's records reach
    the log before the checkpoint that covers them, so a kill between the two only repeats the episode; a resumed
    run reaches the same weights and the same log as an uninterrupted run.

    Stops: a config whose episodes would hold no batch of two items stops before training with a
    :class:`~protoclip.errors.ConfigError` (:func:`require_training_steps`). A non-finite loss term, gradient norm
    or k-means feature stops the run with :class:`NonFiniteLossError` naming step, episode and term (at the next
    log interval; the updates from that step on are skipped on the device), non-finite weights or optimizer state
    before a save with :class:`~protoclip.train.checkpoint.NonFiniteStateError` (both
    :class:`~protoclip.train.checkpoint.TrainingStopped`: one line, exit 2 through the CLI); the last checkpoint
    is left as it was::

        model = train(model, dataset, cfg, layout.train_files(run), state=None, teacher=None, tracker=Tracker())
    """
    device, info = setup_device(cfg.device)
    if teacher is not None and (teacher.ndim != 2 or len(teacher) != len(dataset)):
        raise ValueError(f"teacher features must be [M={len(dataset)}, d] aligned with the data set, "
                         f"got {tuple(teacher.shape)}")
    M = len(dataset)
    m = episode_size_for(cfg.episode_size, M)
    require_training_steps(cfg, M, m, info.world_size)
    sched = Schedule.from_config(cfg, dataset_size=M, world_size=info.world_size)  # m capped at M, as above
    config = to_dict(cfg)  # the one dict of the config: config.yaml, MLflow params, the checkpoints' key
    key = resume_key(config)
    model.to(device)
    channels_last = channels_last_(model, device)
    optimizer = build_optimizer(model, cfg)
    autocast = autocast_factory(cfg.precision, device)
    scaler = build_scaler(cfg.precision, device)
    method = build_method(cfg, info)
    tlog = TrainLog(files.log, files.log_work, enabled=info.is_main)
    if state is not None:
        progress = restore(state, model, optimizer, method)
        if scaler is not None and "scaler" in state["extra"]:
            scaler.load_state_dict(state["extra"]["scaler"])
        restore_rank_rng(state, cfg.seed, info)
        tlog.resume_at(progress.episode, progress.step)
        log.info("resumed %s at episode %d / %d (step %d)", cfg.name, progress.episode, sched.n_episodes,
                 progress.step)
    else:
        progress = Progress()
        tlog.begin()
        seed_rank(cfg.seed, info)  # rank r > 0: its own augmentation stream (the weights are built already)
    tracker = tracker or Tracker()
    s = Session(cfg=cfg, run=cfg.name, model=model, net=wrap_for_ddp(model, method, device, info),
                optimizer=optimizer, method=method, sched=sched, dataset=dataset, teacher=teacher,
                use_teacher=cfg.reads_teacher() and teacher is not None, info=info, device=device,
                autocast=autocast, tlog=tlog, tracker=tracker, curves=Curves(tracker, enabled=info.is_main),
                checkpoint=files.checkpoint, resume_key=key, validator=validator, scaler=scaler,
                channels_last=channels_last,
                loader=run_loader(cfg, dataset, sched, info, device, model.image_size, method))
    log_start(s, progress, config, files.config, resumed=state is not None)
    try:
        run_episodes(s, progress, stop_after_episodes)
    finally:
        s.loader.close()  # the workers end with the training (or its error)
    tlog.publish()  # train_log.jsonl = the checkpoint's log, whatever happened to the output file meanwhile
    destroy(info)  # the process group ends with the training (a no-op for one process)
    return model
