"""One episode's prototypes [ProtoCLIP Sec. III-B, III-D; Eqs. 2, 7]: k-means of the episode's features and the
prototype classifiers (Prototype Back Translation or the raw cross-modal prototypes), built once per episode,
detached, and read by :class:`protoclip.losses.proto.ProtoLoss` per batch.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from protoclip.prototypes.kmeans import KMeansResult, kmeans

logger = logging.getLogger(__name__)

KMeansFn = Callable[..., KMeansResult]


def pbt_centroids(student_h: torch.Tensor, assignments: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prototype Back Translation [Eq. 7]: mean student feature of the samples assigned to each teacher prototype.

    -> (centroids [K, d], empty_mask [K]); empty prototypes get a zero row and ``True`` in the mask.
    """
    if student_h.ndim != 2 or assignments.ndim != 1 or student_h.shape[0] != assignments.shape[0]:
        raise ValueError(f"pbt_centroids: need student_h [M, d] and assignments [M], got {tuple(student_h.shape)}, {tuple(assignments.shape)}")
    assignments = assignments.to(student_h.device).long()
    if assignments.numel() and (int(assignments.min()) < 0 or int(assignments.max()) >= k):
        raise ValueError(f"pbt_centroids: assignments must lie in [0, {k})")
    h = student_h.detach().float()
    sums = torch.zeros(k, h.shape[1], device=h.device).index_add_(0, assignments, h)
    counts = torch.bincount(assignments, minlength=k)
    empty = counts == 0
    centroids = sums / counts.clamp_min(1)[:, None].float()
    return centroids, empty


class NonFiniteFeaturesError(ValueError):
    """Episode features to cluster hold NaN/Inf; the message names the episode and the modality."""


def check_features_finite(feats: torch.Tensor, modality: str, episode: int | None = None) -> None:
    """Raise :class:`NonFiniteFeaturesError` if any row of ``feats`` [m, d] is not finite.

    k-means would otherwise fail deep inside faiss/torch with a message that names neither the episode nor
    the modality (or, worse, cluster garbage).
    """
    ok = torch.isfinite(feats.detach()).all(dim=1) if feats.ndim == 2 else torch.isfinite(feats.detach()).all()[None]
    if not bool(ok.all()):
        where = f"episode {episode}: " if episode is not None else ""
        bad_rows = int((~ok).sum())
        hint = ("the model's weights are not finite (check the last checkpoint)" if modality != "external teacher"
                else "the teacher cache holds NaN/Inf; rebuild it with `protoclip teacher`")
        raise NonFiniteFeaturesError(f"{where}{modality} features for k-means hold NaN/Inf in {bad_rows} of "
                                     f"{ok.numel()} rows; {hint}")


@dataclass
class EpisodePrototypes:
    """Detached per-episode prototype state; build with :meth:`build`.

    ``cls_image`` classifies h^I with text-derived prototypes (targets from ``text``), ``cls_text`` classifies
    h^T with image-derived ones (targets from ``image``); ``*_ext`` use the external teacher's assignments.
    ``valid_*`` [K] mark the prototypes kept in each classifier.
    """

    image: KMeansResult
    text: KMeansResult
    external: KMeansResult | None
    cls_image: torch.Tensor
    cls_text: torch.Tensor
    valid_image: torch.Tensor
    valid_text: torch.Tensor
    cls_image_ext: torch.Tensor | None
    cls_text_ext: torch.Tensor | None
    valid_image_ext: torch.Tensor | None
    valid_text_ext: torch.Tensor | None
    pbt: bool
    soft_targets: bool
    tau_y: float
    kmeans_seconds: float = 0.0
    pbt_seconds: float = 0.0

    @property
    def n_samples(self) -> int:
        return int(self.image.assignments.shape[0])

    @property
    def device(self) -> torch.device:
        return self.cls_image.device

    @classmethod
    def build(
        cls,
        h_image: torch.Tensor,
        h_text: torch.Tensor,
        teacher: torch.Tensor | np.ndarray | None,
        k: int,
        k_external: int | None = None,
        pbt: bool = True,
        soft_targets: bool = True,
        tau_y: float = 0.01,
        iters: int = 20,
        init: str = "kmeans",
        backend: str = "auto",
        seed: int = 0,
        kmeans_fn: KMeansFn = kmeans,
        episode: int | None = None,
    ) -> "EpisodePrototypes":
        """Cluster the episode's features and prepare the classifiers (row i of every input = episode sample i).

        ``teacher`` [m, d_t]: external-teacher features of the same samples (None: no external term);
        ``k`` prototypes per modality (``k_external`` for the teacher, default ``k``); ``pbt``, ``soft_targets``,
        ``tau_y`` as in ``LossConfig``; ``iters``, ``init``, ``backend``, ``seed`` go to ``kmeans_fn``.
        ``init='random'`` is the "w/o K-means" ablation (random samples as prototypes, 0 Lloyd iterations).
        ``seed`` should change per episode (trainer). ``episode`` only names the episode in errors: features
        with NaN/Inf (a model whose weights broke) raise :class:`NonFiniteFeaturesError` naming it and the modality.

        Clusters h^I and h^T (and the teacher's features) with ``kmeans_fn``, translates each modality's clusters
        back into the other's space (:func:`pbt_centroids`, Eq. 7) or takes the raw cross-modal prototypes, and
        times both phases (``kmeans_seconds``, ``pbt_seconds``: the episode record's ``time/kmeans``,
        ``time/pbt``)::

            ep = EpisodePrototypes.build(h_img, h_txt, teacher_feats, k=K, pbt=True, soft_targets=True, tau_y=0.01,
                                         seed=seed * 100_003 + episode, episode=episode)
            ep.stats()   # k-means objective / sizes / empties, PBT-dropped prototypes (the episode record)
        """
        if h_image.ndim != 2 or h_image.shape != h_text.shape:
            raise ValueError(f"EpisodePrototypes: h_image and h_text must both be [m, d], got {tuple(h_image.shape)}, {tuple(h_text.shape)}")
        for modality, feats in (("image (h^I)", h_image), ("text (h^T)", h_text), ("external teacher", teacher)):
            if feats is not None:
                check_features_finite(torch.as_tensor(feats), modality, episode)
        m = h_image.shape[0]
        h_i = F.normalize(h_image.detach().float(), dim=1)
        h_t = F.normalize(h_text.detach().float(), dim=1)
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"EpisodePrototypes: k must be a positive int, got {k!r}")
        k = int(k)
        kw = dict(iters=iters, backend=backend, seed=seed, init=init)
        t0 = time.perf_counter()
        img = kmeans_fn(h_i, k, **kw)
        txt = kmeans_fn(h_t, k, **kw)
        t_km = time.perf_counter() - t0
        t_pbt = 0.0
        t0 = time.perf_counter()
        if pbt:  # [Eq. 7] student-space centroids of the teacher's clusters
            cls_i, empty_i = pbt_centroids(h_i, txt.assignments, k)
            cls_t, empty_t = pbt_centroids(h_t, img.assignments, k)
        else:  # raw cross-modal prototypes [Eq. 3]
            cls_i, empty_i = txt.centroids.to(h_i.device).float(), torch.zeros(k, dtype=torch.bool, device=h_i.device)
            cls_t, empty_t = img.centroids.to(h_i.device).float(), torch.zeros(k, dtype=torch.bool, device=h_i.device)
        t_pbt += time.perf_counter() - t0

        ext = cls_ie = cls_te = val_ie = val_te = None
        if teacher is not None:
            tf = torch.as_tensor(teacher).detach().float().to(h_i.device)
            if tf.ndim != 2 or tf.shape[0] != m:
                raise ValueError(f"EpisodePrototypes: teacher features must be [m={m}, d_t], got {tuple(tf.shape)}")
            t0 = time.perf_counter()
            ext = kmeans_fn(tf, k_external or k, **kw)
            t_km += time.perf_counter() - t0
            t0 = time.perf_counter()
            ke = ext.centroids.shape[0]
            cls_ie, empty_ie = pbt_centroids(h_i, ext.assignments, ke)
            cls_te, empty_te = pbt_centroids(h_t, ext.assignments, ke)
            val_ie, val_te = ~empty_ie, ~empty_te
            t_pbt += time.perf_counter() - t0
        ep = cls(img, txt, ext, cls_i, cls_t, ~empty_i, ~empty_t, cls_ie, cls_te, val_ie, val_te, pbt,
                 bool(soft_targets), float(tau_y), kmeans_seconds=t_km, pbt_seconds=t_pbt)
        logger.info("episode prototypes: %s", {k_: round(v, 4) for k_, v in ep.stats().items()})
        return ep

    def to(self, device: torch.device | str) -> "EpisodePrototypes":
        """A copy with every tensor on ``device``."""
        def move(v):
            if isinstance(v, torch.Tensor):
                return v.to(device)
            if isinstance(v, KMeansResult):
                return dataclasses.replace(v, centroids=v.centroids.to(device), assignments=v.assignments.to(device),
                                           sizes=v.sizes.to(device))
            return v

        return dataclasses.replace(self, **{f.name: move(getattr(self, f.name)) for f in dataclasses.fields(self)})

    def stats(self) -> dict[str, float]:
        """Cluster statistics for the training log (k-means objective / sizes / empties, PBT empties)."""
        out = {**self.image.stats("kmeans_image_"), **self.text.stats("kmeans_text_")}
        out["pbt_dropped_i2t"] = float((~self.valid_image).sum())
        out["pbt_dropped_t2i"] = float((~self.valid_text).sum())
        if self.external is not None:
            out.update(self.external.stats("kmeans_external_"))
            out["pbt_dropped_i2ext"] = float((~self.valid_image_ext).sum())
            out["pbt_dropped_t2ext"] = float((~self.valid_text_ext).sum())
        return out


__all__ = ["EpisodePrototypes", "pbt_centroids", "NonFiniteFeaturesError", "check_features_finite"]
