"""The episodic trainer shared by every training method (ProtoCLIP Sec. III-D, IV-A, Table I).

Per episode: sample m items (:mod:`protoclip.train.episode`), let the method prepare the episode
(``Method.begin_episode``: for ``method: protoclip`` extract h^I, h^T with the current model, k-means per
modality (+ teacher) and PBT; nothing for CLIP), then train on the episode's batches with the method's loss
(``Method.terms`` / ``Method.total``, see :mod:`protoclip.train.methods`). Optimizer AdamW (decoupled weight decay only on the
model's ``*_decay`` groups), warm-up + cosine LR, the image groups' LR zeroed from ``lock_image_epoch``,
grad-norm clipping, ``Method.after_step`` after every step (logit-scale clamps), bf16 autocast on CUDA (fp32 on CPU).

Outputs under ``layout.run_dir(run)``: ``config.yaml`` and ``train_log.jsonl`` from the start, and
``checkpoints/last.pt`` at episode ends (atomic; at most every ``checkpoint_interval_s`` seconds, and always after
the final episode). ``resume=True`` continues from the checkpoint and
reaches the same weights as an uninterrupted run. A non-finite loss term stops the run with
:class:`NonFiniteLossError` naming step and term, non-finite weights or optimizer state before a save with
:class:`~protoclip.train.checkpoint.NonFiniteStateError`; the last checkpoint is left as it was.

    from protoclip.train.loop import train
    model = train(model, dataset, cfg, layout, run, teacher=None, tracker=Tracker())
    # teacher: None or float32 [len(dataset), d] rows aligned with the data set (see protoclip.train.stage)

MLflow is never imported here: metrics go to the ``Tracker`` the stage passes in.
"""
from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path
from typing import Callable, ContextManager

import numpy as np
import torch
import yaml
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from protoclip.atomic import write_text
from protoclip.config import to_dict
from protoclip.devices import resolve_device
from protoclip.layout import Layout
from protoclip.provenance import provenance
from protoclip.tracking import Tracker
from protoclip.train.checkpoint import (check_state_finite, kept_checkpoint, load_checkpoint, restore_rng,
                                       save_checkpoint)
from protoclip.train.config import TrainConfig
from protoclip.train.distributed import DistInfo, barrier, broadcast_object, env_world, init_from_env, sync_buffers
from protoclip.train.episode import episode_loader, episode_size_for, sample_episode
from protoclip.records import TrainLog
from protoclip.train.methods import EpisodeData, Method, build_method
from protoclip.train.schedule import Schedule, early_stop_update

log = logging.getLogger(__name__)

IMAGE_GROUPS = ("image_decay", "image_no_decay")  # groups whose LR locked-image tuning zeroes


class NonFiniteLossError(RuntimeError):
    """A loss term became NaN/Inf; the message names the step and the term."""


def autocast_factory(precision: str, device: torch.device) -> Callable[[], ContextManager]:
    """bf16 autocast on CUDA for ``auto``/``bf16``; fp32 (no autocast) on CPU or for ``fp32``.

    bf16 needs no GradScaler (same exponent range as fp32), so the trainer never builds one.
    """
    use_bf16 = precision == "bf16" or (precision == "auto" and device.type == "cuda")
    if use_bf16:
        return lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW over the model's named groups; weight decay only on ``*_decay`` groups (Table I: 0.5)."""
    groups = model.param_groups(cfg.weight_decay)
    for g in groups:
        if "name" not in g:
            raise ValueError("model.param_groups() must name every group ('image_decay', ...)")
        g["initial_lr"] = cfg.lr
    # fused: one kernel over all parameters instead of a Python-level foreach (CPU: 17 ms vs 61 ms per step for
    # tiny-rn's 12.7M parameters on one core, bench/README.md); same update rule as the default implementation
    fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for g in groups for p in g["params"])
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, fused=fused or None)


def set_lrs(optimizer: torch.optim.Optimizer, lr: float, image_lr: float) -> None:
    for g in optimizer.param_groups:
        g["lr"] = image_lr if g.get("name") in IMAGE_GROUPS else lr


def temperatures(model: torch.nn.Module) -> dict[str, float]:
    """tau = 1 / exp(logit_scale) of the CLIP and prototype temperatures (those the model has)."""
    out = {}
    for attr, key in (("logit_scale", "tau_clip"), ("proto_logit_scale", "tau_proto")):
        p = getattr(model, attr, None)
        if p is not None:
            out[key] = float(torch.exp(-p.detach().float()))
    return out


def check_finite(terms: dict[str, torch.Tensor], step: int, episode: int, info: DistInfo,
                 checkpoint: Path) -> None:
    """Stop with a message naming the step and the first non-finite term (agreed across DDP ranks)."""
    bad = [name for name, v in terms.items() if not torch.isfinite(v.detach()).all()]
    if info.enabled:
        flag = torch.tensor([float(len(bad))], device=next(iter(terms.values())).device)
        torch.distributed.all_reduce(flag)
        if flag.item() > 0 and not bad:
            bad = ["(on another rank)"]
    if bad:
        values = ", ".join(f"{n}={float(terms[n].detach()) if n in terms else float('nan')}" for n in bad)
        raise NonFiniteLossError(
            f"non-finite loss at step {step} (episode {episode}): term {bad[0]!r} ({values}); "
            f"stopped, {kept_checkpoint(checkpoint)}")


def to_device(x, device: torch.device):
    """A batch field (a tensor, or a list/tuple of tensors for multi-view methods) on ``device``."""
    if isinstance(x, (list, tuple)):
        return type(x)(to_device(v, device) for v in x)
    return x.to(device, non_blocking=True)


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


# settings that do not change the result: a checkpoint written with other values may be resumed
RESUME_INDIFFERENT = ("num_workers", "log_every", "gpu", "device", "checkpoint_interval_s")


def resume_key(cfg: TrainConfig) -> dict:
    """The part of the config a checkpoint must share with the run that resumes it."""
    return {k: v for k, v in to_dict(cfg).items() if k not in RESUME_INDIFFERENT}


def write_config(path: Path, cfg: TrainConfig) -> None:
    write_text(path, yaml.safe_dump(to_dict(cfg), sort_keys=False))


def train(model: torch.nn.Module, dataset: Dataset, cfg: TrainConfig, layout: Layout,
          run: str, *, teacher: np.ndarray | None = None, tracker: Tracker | None = None,
          resume: bool = False, stop_after_episodes: int | None = None) -> torch.nn.Module:
    """Train ``model`` on ``dataset`` (items ``(image, tokens, id)``) and return it (unwrapped).

    ``teacher``: cached external-teacher features [M, d], row i belonging to ``dataset[i]`` (the stage aligns
    the cache by id). ``stop_after_episodes`` ends the call after that many episodes of this call (checkpoint
    written): used to test resume.
    """
    tracker = tracker or Tracker()
    device = resolve_device(cfg.device)
    if device.type == "cuda" and device.index is None:  # one GPU per torchrun process, set before nccl init
        device = torch.device("cuda", env_world().local_rank)
        torch.cuda.set_device(device)
    info = init_from_env(device)
    if teacher is not None and (teacher.ndim != 2 or len(teacher) != len(dataset)):
        raise ValueError(f"teacher features must be [M={len(dataset)}, d] aligned with the data set, "
                         f"got {tuple(teacher.shape)}")
    use_teacher = cfg.reads_teacher() and teacher is not None
    M = len(dataset)
    m = episode_size_for(cfg.episode_size, M)
    sched = Schedule.build(base_lr=cfg.lr, epochs=cfg.epochs, dataset_size=M, episode_size=m,
                           batch_size=cfg.batch_size, warmup_episodes=cfg.warmup_episodes,
                           lock_image_epoch=cfg.lock_image_epoch, world_size=info.world_size,
                           warmup_samples=cfg.warmup_samples)
    autocast = autocast_factory(cfg.precision, device)
    ckpt_path = layout.checkpoint(run)
    tlog = TrainLog(layout.train_log(run), enabled=info.is_main)

    model.to(device)
    optimizer = build_optimizer(model, cfg)
    method = build_method(cfg, info)
    start_episode, step, prototypes, stop_state = 0, 0, None, None
    state = load_checkpoint(ckpt_path, map_location=device) if resume and ckpt_path.exists() else None
    if state is not None and state["extra"].get("config") != resume_key(cfg):
        # the workflow always passes --resume: a changed config must retrain, not continue (or, for a
        # finished run, silently return the old weights)
        log.warning("checkpoint %s was written with another config: training %s from scratch", ckpt_path, run)
        state = None
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_episode, step, prototypes = state["episode"], state["step"], state["prototypes"]
        method.load_state_dict(state["extra"].get("method", {}))
        stop_state = state["extra"].get("early_stop")
        restore_rng(state["rng"])
        tlog.truncate_to(start_episode, step)
        log.info("resumed %s at episode %d / %d (step %d)", run, start_episode, sched.n_episodes, step)
    else:
        if resume and not ckpt_path.exists():
            log.warning("resume requested but no checkpoint at %s: starting from scratch", ckpt_path)
        tlog.reset()
    if info.is_main:
        write_config(layout.run_config(run), cfg)
    prov = provenance(cfg.seed)
    tlog.append({"kind": "start", "episode": start_episode, "step": step, "provenance": prov,
                 "schedule": {"dataset_size": M, "episode_size": m, "n_episodes": sched.n_episodes,
                              "steps_per_episode": sched.steps_per_episode, "warmup_steps": sched.warmup_steps,
                              "world_size": info.world_size}})
    if info.is_main:
        tracker.log_params({"train": to_dict(cfg), "provenance": prov})

    net: torch.nn.Module = TrainForward(model, method)
    if info.enabled:
        # e.g. CLIP runs leave the heads and tau_Proto without gradient, Proto-only runs tau_CLIP: only then
        # does DDP need the (slower) search for unused parameters
        net = torch.nn.parallel.DistributedDataParallel(
            net, device_ids=[device.index] if device.type == "cuda" else None,
            find_unused_parameters=method.find_unused_parameters())
    model.train()
    done_here = 0
    last_save = time.monotonic()
    for episode in tqdm(range(start_episode, sched.n_episodes), desc=f"train {run}", disable=not info.is_main,
                        initial=start_episode, total=sched.n_episodes):
        if stop_state is not None and stop_state["stopped"]:  # resuming a run that had stopped early
            break
        indices = sample_episode(M, m, cfg.seed, episode)
        loader = episode_loader(dataset, indices, info, cfg.batch_size, cfg.num_workers, device)
        prototypes, ep_stats, times = method.begin_episode(
            model, EpisodeData(dataset, indices, loader, info, device, autocast, teacher, use_teacher), episode)
        times = {**times, "train": 0.0}
        t0 = time.perf_counter()
        sums: dict[str, float] = {}
        n_steps = 0
        for images, tokens, pos in tqdm(loader, desc=f"episode {episode}", leave=False, disable=not info.is_main):
            if len(pos) < 2:  # BatchNorm (heads, ResNet) cannot train on one sample; the same on every rank
                log.warning("episode %d: skipping a final batch of 1 item", episode)
                continue
            # locked-image tuning zeroes the LR only, as the paper states (Sec. IV-A2); BatchNorm running
            # statistics of the image encoder keep updating in train mode
            lr, image_lr = sched.lr(step), sched.image_lr(step)
            set_lrs(optimizer, lr, image_lr)
            images, tokens = to_device(images, device), to_device(tokens, device)
            with autocast():
                out = net(images, tokens)
            terms = method.terms(model, out, pos.to(device), prototypes)
            loss = method.total(terms)
            check_finite({**terms, "total": loss}, step, episode, info, ckpt_path)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            if not torch.isfinite(grad_norm):  # finite loss, overflowing gradient: stop before the weights break
                raise NonFiniteLossError(f"non-finite gradient norm at step {step} (episode {episode}): "
                                         f"{float(grad_norm)}; stopped, {kept_checkpoint(ckpt_path)}")
            optimizer.step()
            method.after_step(model)
            rec = {"kind": "step", "step": step, "episode": episode, "epoch": sched.epoch(step), "lr": lr,
                   "image_lr": image_lr, "loss": float(loss.detach()), "grad_norm": float(grad_norm),
                   **{k: float(v.detach()) for k, v in terms.items()}, **method.diagnostics(),
                   **temperatures(model)}
            if step % cfg.log_every == 0:
                tlog.append(rec)
            for k, v in rec.items():
                if k not in ("kind", "step", "episode") and isinstance(v, float):
                    sums[k] = sums.get(k, 0.0) + v
            step += 1
            n_steps += 1
        sync_buffers(model, info)  # identical BatchNorm statistics in every rank's checkpoint / final model
        times["train"] = time.perf_counter() - t0
        ep_rec = {"kind": "episode", "episode": episode, "step": step, "n_steps": n_steps,
                  **{f"mean/{k}": v / max(n_steps, 1) for k, v in sums.items()}, **ep_stats,
                  **{f"time/{k}": v for k, v in times.items()}}
        if cfg.early_stop.enabled:  # decided on rank 0 (episode means are per rank) and shared
            stop_state = broadcast_object(early_stop_update(stop_state, ep_rec.get(cfg.early_stop.metric),
                                                            cfg.early_stop.patience, cfg.early_stop.min_delta), info)
        stopping = (episode + 1 == sched.n_episodes or (stop_state is not None and stop_state["stopped"])
                    or (stop_after_episodes is not None and done_here + 1 >= stop_after_episodes))
        # the same decision on every rank (rank 0's clock), so that all check and wait at the barrier together
        save = broadcast_object(stopping or time.monotonic() - last_save >= cfg.checkpoint_interval_s, info)
        if save:
            # every rank checks (DDP keeps their weights identical), so all stop together instead of waiting at
            # the barrier for a rank 0 that refused to save
            check_state_finite(model, optimizer, step=step - 1, episode=episode, checkpoint=ckpt_path)
        if info.is_main and save:
            save_checkpoint(ckpt_path, model=model, optimizer=optimizer, episode=episode + 1, step=step,
                            prototypes=prototypes.to("cpu") if hasattr(prototypes, "to") else prototypes,
                            extra={"run": run, "config": resume_key(cfg), "method": method.state_dict(),
                                   "early_stop": stop_state})
            last_save = time.monotonic()
        if info.is_main:
            tlog.append(ep_rec)
            tracker.log_metrics({k: v for k, v in ep_rec.items() if k != "kind"}, step=episode)
        barrier(info)
        done_here += 1
        if stop_state is not None and stop_state["stopped"]:
            log.info("early stop after episode %d: %s has not improved on %.6g for %d episodes", episode,
                     cfg.early_stop.metric, stop_state["best"], stop_state["bad"])
            tlog.append({"kind": "early_stop", "episode": episode, "step": step, **stop_state})
            break
        if stop_after_episodes is not None and done_here >= stop_after_episodes:
            break
    return model
