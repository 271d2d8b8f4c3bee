"""The training objective of one step and the prototypes of one episode, wired to ``protoclip.losses``.

    L = clip_weight * L_CLIP (Eq. 1) + proto_weight * L_Proto (Eqs. 3-5, PBT Eq. 7) + external_weight * L_ext (Eq. 8)

:class:`Objective` returns every term by name (each already a scalar tensor, unweighted) so the trainer can
log them and stop on the first non-finite one; :meth:`Objective.total` applies the weights of
``TrainConfig.loss``. ``method: clip`` only computes the CLIP term. :func:`build_episode_prototypes` runs
k-means (``protoclip.prototypes.kmeans`` through ``EpisodePrototypes.build``) on rank 0 and broadcasts.
"""
from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F

from protoclip.losses.clip import clamp_logit_scale_, clip_loss
from protoclip.train.config import TrainConfig
from protoclip.train.distributed import DistInfo, broadcast_object
from protoclip.train.episode import EpisodeFeatures, size_stats

log = logging.getLogger(__name__)


def n_clusters(cfg: TrainConfig, episode_size: int) -> int:
    """K: ``kmeans.n_clusters`` or ``m // images_per_prototype`` (Sec. IV-D3: 10 -> K = 20k at m = 200k),
    at least 1 and at most m."""
    k = cfg.kmeans.n_clusters if cfg.kmeans.n_clusters is not None else episode_size // cfg.kmeans.images_per_prototype
    return int(min(max(k, 1), episode_size))


class Objective:
    """Loss terms of one step. Under DDP (``info.enabled``) L_CLIP contrasts the *global* batch: open_clip's
    ``ClipLoss`` all-gathers the normalised features of every rank with gradient, so each rank computes the
    loss of the whole ``batch_size * world`` batch and, after DDP's gradient averaging, the update equals a
    single process's on that batch (open_clip's multi-GPU recipe, which the authors' code uses). L_Proto is
    per sample, so its per-rank mean averaged by DDP is already the global mean."""

    def __init__(self, cfg: TrainConfig, info: DistInfo | None = None):
        self.cfg = cfg
        self.proto = cfg.method == "protoclip"
        self._proto_loss = None
        self._global_clip = None
        if self.proto:
            from protoclip.losses.proto import ProtoLoss

            self._proto_loss = ProtoLoss()
        if info is not None and info.enabled:
            from open_clip.loss import ClipLoss

            self._global_clip = ClipLoss(local_loss=False, gather_with_grad=True, rank=info.rank,
                                         world_size=info.world_size)

    def uses_clip(self) -> bool:
        return not self.proto or self.cfg.loss.clip_weight > 0

    def outputs(self) -> set[str]:
        """Model outputs this objective reads (the trainer's forward returns exactly these)."""
        keys = {"z_image", "z_text", "logit_scale"} if self.uses_clip() else set()
        if self.proto:
            keys |= {"h_image", "h_text", "proto_logit_scale"}
        return keys

    def terms(self, model: torch.nn.Module, out: dict[str, torch.Tensor], positions: torch.Tensor,
              prototypes: Any) -> dict[str, torch.Tensor]:
        """Unweighted loss terms of one batch. ``positions``: the batch items' indices in the episode."""
        terms: dict[str, torch.Tensor] = {}
        if self.uses_clip():
            scale = out["logit_scale"] if "logit_scale" in out else model.logit_scale.exp()
            if self._global_clip is not None:
                terms["clip"] = self._global_clip(F.normalize(out["z_image"].float(), dim=-1),
                                                  F.normalize(out["z_text"].float(), dim=-1), scale)
            else:
                terms.update(clip_loss(out["z_image"].float(), out["z_text"].float(), scale))
        if self.proto:
            if prototypes is None:
                raise RuntimeError("method 'protoclip' needs the episode's prototypes")
            scale = out["proto_logit_scale"] if "proto_logit_scale" in out else model.proto_logit_scale.exp()
            terms.update(self._proto_loss(out["h_image"].float(), out["h_text"].float(), positions, prototypes,
                                          scale))
            if prototypes.external is None:
                terms.pop("proto_external", None)  # constant 0 without a teacher: not a term of this run
        return terms

    def diagnostics(self) -> dict[str, float]:
        """Detached per-direction losses and prototype accuracies (%) of the last batch (ProtoCLIP only)."""
        return dict(self._proto_loss.last_stats) if self._proto_loss is not None else {}

    def total(self, terms: dict[str, torch.Tensor]) -> torch.Tensor:
        w = self.cfg.loss
        weights = {"clip": w.clip_weight, "proto": w.proto_weight, "proto_external": w.external_weight}
        total = None
        for name, value in terms.items():
            if name not in weights:
                continue  # diagnostics (e.g. directional halves) are logged, not optimised
            part = weights[name] * value
            total = part if total is None else total + part
        if total is None:
            raise RuntimeError(f"no optimisable loss term among {list(terms)}")
        return total

    def clamp(self, model: torch.nn.Module) -> None:
        """1/tau clipped at ``max_logit_scale`` (Table I: 100) after every optimizer step."""
        clamp_logit_scale_(model.logit_scale, self.cfg.loss.max_logit_scale)
        if getattr(model, "proto_logit_scale", None) is not None:
            clamp_logit_scale_(model.proto_logit_scale, self.cfg.loss.max_logit_scale)


def build_episode_prototypes(feats: EpisodeFeatures, cfg: TrainConfig, info: DistInfo, episode: int,
                             use_teacher: bool) -> tuple[Any, dict[str, float], float, float]:
    """Prototypes of the episode on rank 0, broadcast to all ranks -> (prototypes, stats, t_kmeans, t_pbt)."""
    from protoclip.losses.proto import EpisodePrototypes

    protos, stats, t_km, t_pbt = None, {}, 0.0, 0.0
    if info.is_main:
        m = feats.h_image.shape[0]
        k = n_clusters(cfg, m)
        protos, stats, t_km, t_pbt = _build(EpisodePrototypes, feats, cfg, k, episode, use_teacher)
        if info.enabled:
            protos = protos.to("cpu")  # pickled for the broadcast; the trainer moves it back to its device
    protos, stats, t_km, t_pbt = broadcast_object((protos, stats, t_km, t_pbt), info)
    return protos, stats, t_km, t_pbt


def _build(EpisodePrototypes, feats: EpisodeFeatures, cfg: TrainConfig, k: int, episode: int, use_teacher: bool):
    """Adapter to ``EpisodePrototypes.build``; the k-means seed changes per episode and is a pure function of
    (seed, episode), so a resumed run re-draws the same initialisation."""
    protos = EpisodePrototypes.build(
        feats.h_image, feats.h_text, teacher=feats.teacher if use_teacher else None, k=k,
        iters=cfg.kmeans.iters, backend=cfg.kmeans.backend, seed=cfg.seed * 100_003 + episode,
        init=cfg.kmeans.init, pbt=cfg.loss.pbt, soft_targets=cfg.loss.soft_targets, tau_y=cfg.loss.tau_y,
        episode=episode)
    stats = {"k": float(k), **protos.stats(), **size_stats(protos.image.sizes, "kmeans_image_"),
             **size_stats(protos.text.sizes, "kmeans_text_")}
    if protos.external is not None:
        stats.update(size_stats(protos.external.sizes, "kmeans_external_"))
    return protos, stats, float(protos.kmeans_seconds), float(protos.pbt_seconds)
