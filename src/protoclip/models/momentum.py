"""MoCo's momentum (key) encoder and feature queue, as PCL uses them [pcl-protonce.txt Sec. 3.3, 4; MoCo v2].

PCL's InfoNCE term scores each query against its key from a slowly moving copy of the encoder and against a queue
of earlier keys. Both are ``nn.Module``\\ s: their state goes into a checkpoint and a resumed run continues
bit-identically.
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn


class ImageEncoder(nn.Module):
    """h = normalize(g^I(f^I(x))): PCL's online encoder inside a ProtoCLIPModel (shares its modules)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.visual, self.head = model.clip.visual, model.image_head

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.head(self.visual(images)), dim=-1)


class MomentumEncoder(nn.Module):
    """A frozen copy of ``online`` updated by EMA: a deep copy of the online encoder without gradients, following
    it by ``theta' <- m theta' + (1 - m) theta`` with m = 0.999 [PCL Sec. 3.3; MoCo Eq. 2], once per step *before*
    the keys are computed (as MoCo's ``forward``). Buffers (BatchNorm statistics) are not averaged: as in MoCo the
    key encoder keeps its own.

        key_enc = MomentumEncoder(online_encoder, momentum=0.999)
        key_enc.update(online_encoder); k = F.normalize(key_enc(x2), dim=1)
    """

    def __init__(self, online: nn.Module, momentum: float = 0.999):
        super().__init__()
        if not 0.0 <= momentum <= 1.0:
            raise ValueError(f"momentum must lie in [0, 1], got {momentum}")
        self.momentum = float(momentum)
        self.encoder = copy.deepcopy(online)
        for p in self.encoder.parameters():
            p.requires_grad_(False)

    @torch.no_grad()
    def update(self, online: nn.Module) -> None:
        """``theta' <- m theta' + (1 - m) theta`` for every parameter (in the order of ``parameters()``)."""
        own, other = list(self.encoder.parameters()), list(online.parameters())
        if len(own) != len(other):
            raise ValueError(f"MomentumEncoder.update: {len(other)} online parameters, {len(own)} momentum ones")
        for pk, pq in zip(own, other):
            if pk.shape != pq.shape:
                raise ValueError(f"MomentumEncoder.update: shape {tuple(pq.shape)} vs {tuple(pk.shape)}")
            pk.mul_(self.momentum).add_(pq.detach().to(pk.dtype), alpha=1.0 - self.momentum)

    def forward(self, *args, **kwargs):
        with torch.no_grad():
            return self.encoder(*args, **kwargs)


class FeatureQueue(nn.Module):
    """FIFO of the r latest l2-normalised keys [r, d], the oldest overwritten first (MoCo's
    ``_dequeue_and_enqueue``); unlike MoCo a batch may wrap around the end, so r need not be a multiple of the
    batch size. Initialised with random unit vectors from its own seeded generator; under DDP the caller
    all-gathers the keys first so every rank's queue is the same.

        queue = FeatureQueue(size=1024, dim=128, seed=0)
        loss = infonce(q, k, queue.keys(), tau); ...; queue.enqueue(k)
    """

    def __init__(self, size: int, dim: int, seed: int = 0):
        super().__init__()
        if size < 1 or dim < 1:
            raise ValueError(f"FeatureQueue: size and dim must be >= 1, got {size}, {dim}")
        g = torch.Generator().manual_seed(int(seed))
        self.register_buffer("queue", F.normalize(torch.randn(size, dim, generator=g), dim=1))
        self.register_buffer("ptr", torch.zeros((), dtype=torch.long))

    def keys(self) -> torch.Tensor:
        """The queued keys [r, d] (rows in storage order; the order does not matter to InfoNCE)."""
        return self.queue

    @torch.no_grad()
    def enqueue(self, keys: torch.Tensor) -> None:
        """Write ``keys`` [B, d] (detached) at the pointer, overwriting the oldest rows; advance the pointer."""
        if keys.ndim != 2 or keys.shape[1] != self.queue.shape[1]:
            raise ValueError(f"FeatureQueue.enqueue: keys must be [B, {self.queue.shape[1]}], got {tuple(keys.shape)}")
        r = self.queue.shape[0]
        keys = keys.detach().to(self.queue.dtype)
        if keys.shape[0] > r:  # only the newest r survive
            keys = keys[-r:]
        b = keys.shape[0]
        # the pointer stays on the device: no host read per training step
        idx = (torch.arange(b, device=self.queue.device) + self.ptr) % r
        self.queue[idx] = keys.to(self.queue.device)
        self.ptr.copy_((self.ptr + b) % r)


__all__ = ["MomentumEncoder", "FeatureQueue"]
