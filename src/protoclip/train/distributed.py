"""torch.distributed helpers of the trainer: init from torchrun's environment, gather, broadcast, per-rank seeds.
Without torchrun's variables the trainer runs as one process and every helper here is the identity. Under DDP
the clustering features are all-gathered, k-means runs on rank 0 and its result is broadcast, so that all ranks
train against the same prototypes (:mod:`protoclip.train.episode`).
"""
from __future__ import annotations

import logging
import os
import random
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def env_world() -> DistInfo:
    """Rank / world size / local rank from the environment torchrun sets (defaults: single process)."""
    return DistInfo(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
                    int(os.environ.get("LOCAL_RANK", 0)))


def backend_for(device: torch.device) -> str:
    """nccl for CUDA devices, gloo for CPU."""
    return "nccl" if device.type == "cuda" else "gloo"


def init_from_env(device: torch.device) -> DistInfo:
    """Initialise the default process group when ``WORLD_SIZE > 1`` (idempotent); return this rank's info.

    Under torchrun (``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` / ``MASTER_ADDR`` set:
    ``torchrun --nproc_per_node 2 -m protoclip.cli train --run protoclip_tiny``) the group is nccl when the
    device is CUDA, gloo otherwise; :func:`destroy` ends it when training is done.
    """
    info = env_world()
    if info.enabled and not dist.is_initialized():
        dist.init_process_group(backend=backend_for(device), rank=info.rank, world_size=info.world_size)
        log.info("process group up: rank %d / %d (%s)", info.rank, info.world_size, backend_for(device))
    if dist.is_initialized():
        return DistInfo(dist.get_rank(), dist.get_world_size(), info.local_rank)
    return info


def all_gather_cat(x: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Concatenate ``x`` of every rank along dim 0 (rank order); sizes may differ between ranks."""
    if not info.enabled:
        return x
    n = torch.tensor([x.shape[0]], device=x.device)
    sizes = [torch.zeros_like(n) for _ in range(info.world_size)]
    dist.all_gather(sizes, n)
    max_n = int(max(s.item() for s in sizes))
    padded = torch.zeros((max_n, *x.shape[1:]), dtype=x.dtype, device=x.device)
    padded[: x.shape[0]] = x
    parts = [torch.zeros_like(padded) for _ in range(info.world_size)]
    dist.all_gather(parts, padded.contiguous())
    return torch.cat([p[: int(s.item())] for p, s in zip(parts, sizes)], dim=0)


def broadcast_object(obj, info: DistInfo, src: int = 0):
    """Rank ``src``'s ``obj`` on every rank (pickled; fine for prototypes of an episode)."""
    if not info.enabled:
        return obj
    box = [obj if info.rank == src else None]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def gather_object(obj, info: DistInfo) -> list:
    """Every rank's ``obj`` (pickled), in rank order, on every rank; ``[obj]`` for one process."""
    if not info.enabled:
        return [obj]
    out = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def rank_seed(seed: int, rank: int) -> int:
    """The seed of rank ``rank``'s random streams: ``seed`` itself for rank 0, else a 32-bit seed drawn from
    numpy's SeedSequence of (seed, rank) (independent streams, not seed + rank)."""
    if rank == 0:
        return seed
    return int(np.random.SeedSequence([seed, rank]).generate_state(1)[0])


def seed_rank(seed: int, info: DistInfo) -> None:
    """Reseed this rank's python / numpy / torch RNGs with :func:`rank_seed` (nothing on rank 0).

    Every rank seeds with the run's seed before the model is built (identical initial weights), then each rank
    r > 0 reseeds here, so that the ranks draw different augmentations (random crops, flips, colour jitter) for
    their different images; rank 0 keeps the run seed's stream, so a 1-process run is unchanged. Checkpoints of a
    k-rank run hold every rank's RNG states (:func:`gather_object`), and a resumed rank continues its own.
    """
    if info.rank == 0:
        return
    s = rank_seed(seed, info.rank)
    random.seed(s)
    np.random.seed(s)
    torch.manual_seed(s)


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def destroy(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()


def sync_buffers(model: torch.nn.Module, info: DistInfo) -> None:
    """Copy rank 0's buffers (BatchNorm running stats) to every rank: DDP only does this at each forward, so
    after the last step the ranks differ, and the eval-mode episode extraction would too."""
    if not info.enabled:
        return
    with torch.no_grad():
        for b in model.buffers():
            dist.broadcast(b, src=0)
