"""``method: protoclip``: L = clip_weight L_CLIP (Eq. 1) + proto_weight L_Proto (Eqs. 3-5, PBT Eq. 7)
+ external_weight L_Proto^external (Eq. 8) (ProtoCLIP Sec. III), with the episode's prototypes built before each
episode (Sec. III-D), and the switches that bring in the related methods (``loss.phi_protonce``,
``pauc.enabled``; methods-spec 5 items 4-5).
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from protoclip.train.config import TrainConfig
from protoclip.train.methods.base import EpisodeData
from protoclip.registry import register
from protoclip.train.methods.clip import CLIPMethod

if TYPE_CHECKING:
    import torch

    from protoclip.train.distributed import DistInfo
    from protoclip.train.episode import EpisodeFeatures


def n_clusters(cfg: TrainConfig, episode_size: int) -> int:
    """K: ``kmeans.n_clusters`` or ``m // images_per_prototype`` (Sec. IV-D3: 10 -> K = 20k at m = 200k),
    at least 1 and at most m."""
    k = cfg.kmeans.n_clusters if cfg.kmeans.n_clusters is not None else episode_size // cfg.kmeans.images_per_prototype
    return int(min(max(k, 1), episode_size))


@register("protoclip")
class ProtoCLIPMethod(CLIPMethod):
    """ProtoCLIP's loss on the episodic trainer.

    Before each episode (Sec. III-D): extract h^I, h^T of the episode's items with the current model
    (:func:`protoclip.train.episode.extract_features`), run k-means per modality (+ teacher) and PBT on rank 0
    (:func:`build_episode_prototypes`) and broadcast. L_Proto is per sample, so its per-rank mean averaged by DDP
    is already the global mean; L_CLIP is the global-batch loss of :class:`CLIPMethod`.

    Switches from the related methods (methods-spec 5 items 4-5): ``loss.phi_protonce`` replaces L_Proto's soft
    targets by PCL's phi-scaled ProtoNCE over the same cross-modal classifiers (hard targets; phi of every
    prototype from the episode features, mean 1, times the learnable tau_Proto;
    :func:`protoclip.losses.pcl.phi_proto_ce`), and ``pauc.enabled`` adds PAUC's regularisers on h^I (batch
    prototypes of the text-prototype assignments, anchored at the image-side classifier) and h^T (image-prototype
    assignments, text-side classifier), averaged.
    """

    reads_pauc = True  # PAUC on h^I / h^T with the episode's cross-modal prototypes (class docstring)

    @classmethod
    def check_config(cls, cfg: TrainConfig) -> None:
        super().check_config(cfg)
        if cfg.pauc.enabled and cfg.pauc.align_mode == "two_view":
            raise ValueError("pauc.align_mode 'two_view' needs two views of each image: method 'pcl' only")
        if cfg.loss.proto_weight == 0 and cfg.loss.external_weight == 0:
            raise ValueError("method 'protoclip' with proto_weight = external_weight = 0 is CLIP: use method 'clip'")

    @classmethod
    def reads_teacher(cls, cfg: TrainConfig) -> bool:
        """L_Proto^external (Eq. 8) reads the teacher cache: a teacher is named and its weight is on."""
        return cfg.teacher is not None and cfg.loss.external_weight > 0

    def __init__(self, cfg: TrainConfig, info: DistInfo | None = None):
        super().__init__(cfg, info)
        from protoclip.losses.proto import ProtoLoss  # heavy: torch, config loads methods

        self._proto_loss = ProtoLoss()
        self._phi: tuple[torch.Tensor, torch.Tensor] | None = None  # loss.phi_protonce: (image side, text side)

    def uses_clip(self) -> bool:
        return self.cfg.loss.clip_weight > 0

    def outputs(self) -> set[str]:
        keys = {"z_image", "z_text", "logit_scale"} if self.uses_clip() else set()
        return keys | {"h_image", "h_text", "proto_logit_scale"}

    def find_unused_parameters(self) -> bool:
        return not self.uses_clip()  # Proto-only runs leave tau_CLIP without gradient

    def begin_episode(self, model: torch.nn.Module, data: EpisodeData, episode: int
                      ) -> tuple[Any, dict[str, float], dict[str, float]]:
        import numpy as np  # heavy: numpy, config loads methods
        import torch  # heavy: torch, config loads methods
        import torch.nn.functional as F  # heavy: torch, config loads methods

        from protoclip.train.distributed import sync_buffers  # heavy: torch, config loads methods
        from protoclip.train.episode import extract_features  # heavy: torch, config loads methods

        t0 = time.perf_counter()
        sync_buffers(model, data.info)
        m = len(data.indices)
        feats = extract_features(model, data.loader, m, data.device, data.info, data.autocast,
                                 desc=f"extract {episode}")
        if data.use_teacher:
            feats.teacher = torch.from_numpy(
                np.ascontiguousarray(data.teacher[data.indices], dtype=np.float32)).to(data.device)
        t_extract = time.perf_counter() - t0
        prototypes, stats, t_km, t_pbt = build_episode_prototypes(feats, self.cfg, data.info, episode,
                                                                  data.use_teacher)
        prototypes = prototypes.to(data.device) if hasattr(prototypes, "to") else prototypes
        self._phi = None
        if self.cfg.loss.phi_protonce:  # same features and prototypes on every rank -> same phi
            from protoclip.losses.pcl import relative_concentration  # heavy: torch, config loads methods

            a_t = prototypes.text.assignments.to(data.device)
            a_i = prototypes.image.assignments.to(data.device)
            self._phi = (relative_concentration(F.normalize(feats.h_image, dim=1), prototypes.cls_image, a_t),
                         relative_concentration(F.normalize(feats.h_text, dim=1), prototypes.cls_text, a_i))
            stats.update({"phi_image_max": float(self._phi[0].max()), "phi_text_max": float(self._phi[1].max())})
        return prototypes, stats, {"extract": t_extract, "kmeans": t_km, "pbt": t_pbt}

    def terms(self, model: torch.nn.Module, out: dict[str, torch.Tensor], positions: torch.Tensor,
              state: Any) -> dict[str, torch.Tensor]:
        """Unweighted loss terms of one batch; ``state``: the episode's ``EpisodePrototypes``."""
        terms: dict[str, torch.Tensor] = {}
        if self.uses_clip():
            terms.update(self.clip_terms(model, out))
        if state is None:
            raise RuntimeError("method 'protoclip' needs the episode's prototypes")
        scale = out["proto_logit_scale"] if "proto_logit_scale" in out else model.proto_logit_scale.exp()
        terms.update(self._proto_loss(out["h_image"].float(), out["h_text"].float(), positions, state, scale))
        if state.external is None:
            terms.pop("proto_external", None)  # constant 0 without a teacher: not a term of this run
        if self.cfg.loss.phi_protonce or self.cfg.pauc.enabled:
            terms.update(self._pcl_terms(out, positions, state, scale))
        return terms

    def _pcl_terms(self, out: dict[str, torch.Tensor], positions: torch.Tensor, state: Any,
                   scale: torch.Tensor) -> dict[str, torch.Tensor]:
        """The ``phi_protonce`` replacement of ``proto`` and the PAUC terms (class docstring)."""
        import torch.nn.functional as F  # heavy: torch, config loads methods

        h_i, h_t = F.normalize(out["h_image"].float(), dim=1), F.normalize(out["h_text"].float(), dim=1)
        pos = positions.to(state.device).long()
        a_t, a_i = state.text.assignments.to(state.device)[pos], state.image.assignments.to(state.device)[pos]
        terms: dict[str, torch.Tensor] = {}
        if self.cfg.loss.phi_protonce:
            from protoclip.losses.pcl import phi_proto_ce  # heavy: torch, config loads methods

            if self._phi is None:
                raise RuntimeError("loss.phi_protonce: no phi for this episode (begin_episode not run)")
            terms["proto"] = 0.5 * (phi_proto_ce(h_i, state.cls_image, a_t, self._phi[0], scale, state.valid_image)
                                    + phi_proto_ce(h_t, state.cls_text, a_i, self._phi[1], scale, state.valid_text))
        if self.cfg.pauc.enabled:
            from protoclip.losses.pauc import pauc_terms  # heavy: torch, config loads methods

            a = self.cfg.pauc
            kw = dict(s=a.s, t=a.t, tau_c=a.tau_c, unif_log=a.unif_log)
            ti, tt = pauc_terms(h_i, a_t, state.cls_image, **kw), pauc_terms(h_t, a_i, state.cls_text, **kw)
            terms.update({k: 0.5 * (ti[k] + tt[k]) for k in ti})
        return terms

    def weights(self) -> dict[str, float]:
        w = self.cfg.loss
        a = self.cfg.pauc
        pauc = {"pauc_align": a.alpha, "pauc_unif": a.beta, "pauc_corr": a.gamma} if a.enabled else {}
        return {"clip": w.clip_weight, "proto": w.proto_weight, "proto_external": w.external_weight, **pauc}

    def diagnostics(self) -> dict[str, torch.Tensor]:
        """Detached per-direction losses and prototype accuracies (%) of the last batch (+ CLIP's statistics)."""
        return {**(super().diagnostics() if self.uses_clip() else {}), **self._proto_loss.last_stats}


def build_episode_prototypes(feats: EpisodeFeatures, cfg: TrainConfig, info: DistInfo, episode: int,
                             use_teacher: bool) -> tuple[Any, dict[str, float], float, float]:
    """Prototypes of the episode on rank 0, broadcast to all ranks -> (prototypes, stats, t_kmeans, t_pbt)."""
    from protoclip.train.distributed import broadcast_object  # heavy: torch, config loads methods

    protos, stats, t_km, t_pbt = None, {}, 0.0, 0.0
    if info.is_main:
        m = feats.h_image.shape[0]
        k = n_clusters(cfg, m)
        protos, stats, t_km, t_pbt = _build(feats, cfg, k, episode, use_teacher)
        if info.enabled:
            protos = protos.to("cpu")  # pickled for the broadcast; the trainer moves it back to its device
    protos, stats, t_km, t_pbt = broadcast_object((protos, stats, t_km, t_pbt), info)
    return protos, stats, t_km, t_pbt


def _build(feats: EpisodeFeatures, cfg: TrainConfig, k: int, episode: int, use_teacher: bool):
    """Adapter to ``EpisodePrototypes.build``; the k-means seed changes per episode and is a pure function of
    (seed, episode), so a resumed run re-draws the same initialisation."""
    from protoclip.prototypes.episode import EpisodePrototypes  # heavy: torch, config loads methods
    from protoclip.train.episode import size_stats  # heavy: torch, config loads methods

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
