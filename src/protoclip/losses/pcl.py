"""PCL's losses [pcl-protonce.txt, Li et al. ICLR 2021]: MoCo's InfoNCE (Eq. 1), ProtoNCE (Eq. 11) and the
concentration phi (Eq. 12), with the multi-granularity k-means of the E-step (:func:`build_clusterings`, once per
epoch) whose :class:`Clusterings` :func:`protonce` reads per batch. The full PCL loss is ``infonce + protonce``
(Eq. 11; the trainer adds them, ProtoNCE only after the warm-up). Also the phi-scaled ProtoNCE over a full
prototype classifier that ProtoCLIP's ``loss.phi_protonce`` uses. Usage: docs/methods.md, "protoclip.losses.pcl".
"""
from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from protoclip.prototypes.kmeans import kmeans

log = logging.getLogger(__name__)

PHI_ALPHA = 10.0  # alpha of Eq. 12 [paper Sec. 3.3: "alpha = 10"]
PHI_CLIP_PERCENTILES = (10.0, 90.0)  # [ref-code main_pcl.py: density.clip(percentile 10, percentile 90)]


def _check_features(name: str, x: torch.Tensor) -> None:
    if x.ndim != 2 or x.shape[0] < 1:
        raise ValueError(f"{name}: expected a non-empty 2-D [N, d] tensor, got shape {tuple(x.shape)}")


# --------------------------------------------------------------------------- InfoNCE (MoCo)
def infonce(q: torch.Tensor, k: torch.Tensor, queue: torch.Tensor | None, tau: float) -> dict[str, torch.Tensor]:
    """InfoNCE of MoCo [PCL Eq. 1; MoCo v2]: ``-log exp(q.k+/tau) / (exp(q.k+/tau) + sum_j exp(q.k_j/tau))``, mean
    over B: one positive key (the momentum encoder's view), the r queued keys as negatives. -> ``{"infonce"}``.

    ``q`` [B, d] online features (gradient), ``k`` [B, d] momentum keys of the other view (no gradient: detached
    here), ``queue`` [r, d] the queued keys (negatives; ``None`` or 0 rows = no negative but the positive, a
    degenerate loss of 0). Features are l2-normalised here (idempotent). Mean over the batch (spec 3.7.5).
    """
    _check_features("infonce q", q)
    if k.shape != q.shape:
        raise ValueError(f"infonce: q and k differ in shape: {tuple(q.shape)} vs {tuple(k.shape)}")
    if tau <= 0:
        raise ValueError(f"infonce: tau must be > 0, got {tau}")
    q = F.normalize(q, dim=1)
    k = F.normalize(k.detach(), dim=1)
    pos = (q * k).sum(dim=1, keepdim=True)
    if queue is not None and queue.shape[0] > 0:
        if queue.shape[1] != q.shape[1]:
            raise ValueError(f"infonce: queue width {queue.shape[1]} != feature width {q.shape[1]}")
        logits = torch.cat([pos, q @ queue.detach().to(q.dtype).T], dim=1)
    else:
        logits = pos
    logits = logits / tau
    return {"infonce": F.cross_entropy(logits, torch.zeros(q.shape[0], dtype=torch.long, device=q.device))}


# --------------------------------------------------------------------------- concentration phi (Eq. 12)
@torch.no_grad()
def concentration(dist: torch.Tensor, assignments: torch.Tensor, k: int, tau: float, alpha: float = PHI_ALPHA,
                  clip_percentiles: tuple[float, float] | None = PHI_CLIP_PERCENTILES) -> torch.Tensor:
    """phi [k] of Eq. 12 from each sample's distance ``dist`` [N] (not squared) to its centroid ``assignments`` [N].

    ``phi_c = sum_{z in c} dist_z / (Z_c log(Z_c + alpha))`` for clusters with Z_c > 1; clusters with Z_c <= 1
    get max phi of the others; clip to the percentiles (linear interpolation, numpy's default, as the ref-code's
    ``np.percentile``); rescale per clustering to ``tau * phi / mean(phi)``. Computed in float64. The steps after
    Eq. 12 are the authors' code's [ref-code salesforce/PCL main_pcl.py ``run_kmeans``, spec 4.2].

    Degenerate case (our choice, not in paper or ref-code, where it divides by zero): when no cluster has two
    members, or every member sits on its centroid (all phi 0), phi = tau for every prototype, i.e. ProtoNCE
    with the plain InfoNCE temperature.
    """
    if dist.ndim != 1 or assignments.shape != dist.shape:
        raise ValueError(f"concentration: dist and assignments must be [N], got {tuple(dist.shape)} and "
                         f"{tuple(assignments.shape)}")
    if k < 1 or tau <= 0 or alpha <= 0:
        raise ValueError(f"concentration: need k >= 1, tau > 0, alpha > 0; got k={k}, tau={tau}, alpha={alpha}")
    if assignments.numel() and (int(assignments.min()) < 0 or int(assignments.max()) >= k):
        raise ValueError(f"concentration: assignments must lie in [0, {k})")
    d = dist.detach().to(torch.float64)
    a = assignments.to(d.device).long()
    z = torch.bincount(a, minlength=k).to(torch.float64)
    sums = torch.zeros(k, dtype=torch.float64, device=d.device).index_add_(0, a, d)
    multi = z > 1
    phi = torch.zeros(k, dtype=torch.float64, device=d.device)
    phi[multi] = sums[multi] / (z[multi] * torch.log(z[multi] + alpha))
    if not bool(multi.any()) or float(phi.max()) <= 0:
        log.warning("concentration: no cluster with 2+ members at non-zero distance: phi = tau for all %d", k)
        return torch.full((k,), float(tau), dtype=torch.float64, device=d.device)
    phi[~multi] = phi[multi].max()
    if clip_percentiles is not None:
        lo, hi = torch.quantile(phi, torch.tensor([clip_percentiles[0] / 100, clip_percentiles[1] / 100],
                                                  dtype=torch.float64, device=phi.device))
        phi = phi.clamp(float(lo), float(hi))
    return tau * phi / phi.mean()


# --------------------------------------------------------------------------- E-step: multi-granularity k-means
@dataclass
class Clusterings:
    """The E-step result: for every granularity m, ``centroids[m]`` [K_m, d] l2-normalised (no gradient),
    ``assignments[m]`` [N] (index = data-set / episode position), ``phi[m]`` [K_m] float32."""

    centroids: list[torch.Tensor]
    assignments: list[torch.Tensor]
    phi: list[torch.Tensor]
    stats: dict[str, float] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.centroids)

    def to(self, device: torch.device | str) -> "Clusterings":
        return Clusterings([c.to(device) for c in self.centroids], [a.to(device) for a in self.assignments],
                           [p.to(device) for p in self.phi], dict(self.stats))


def build_clusterings(features: torch.Tensor, ks: list[int], tau: float, *, iters: int = 20, nredo: int = 5,
                      seed: int = 0, backend: str = "auto", alpha: float = PHI_ALPHA,
                      clip_percentiles: tuple[float, float] | None = PHI_CLIP_PERCENTILES) -> Clusterings:
    """k-means of ``features`` [N, d] (momentum features, l2-normalised by the caller) at every K in ``ks``.

    Euclidean k-means (not spherical), then phi against the unnormalised centroids, then the centroids are
    l2-normalised: they enter the loss normalised [ref-code run_kmeans; spec 4.2, 4.7.1, 4.7.3]. 20 iterations,
    5 redos, seed ``seed + m`` for clustering m (ref-code: ``clus.seed = seed`` with seed the clustering index),
    with the project's one k-means, :func:`protoclip.prototypes.kmeans.kmeans`. The ref-code's faiss
    ``min/max_points_per_centroid`` (10 / 1000: faiss subsamples large inputs) have no counterpart in
    ``protoclip.prototypes.kmeans``: every point is used.
    """
    _check_features("build_clusterings features", features)
    if not ks:
        raise ValueError("build_clusterings: need at least one K")
    n = features.shape[0]
    x = features.detach().float()
    cents, assigns, phis, stats = [], [], [], {}
    for m, k in enumerate(ks):
        if not 1 <= k <= n:
            raise ValueError(f"build_clusterings: K={k} must lie in [1, N={n}]")
        t0 = time.perf_counter()
        res = kmeans(x, k, iters=iters, backend=backend, seed=seed + m, nredo=nredo)
        c = res.centroids.to(x.device)
        a = res.assignments.to(x.device).long()
        dist = (x - c[a]).norm(dim=1)  # ref-code: sqrt of faiss's squared distances to the unnormalised centroid
        phi = concentration(dist, a, k, tau=tau, alpha=alpha, clip_percentiles=clip_percentiles)
        cents.append(F.normalize(c, dim=1))
        assigns.append(a)
        phis.append(phi.float())
        sizes = torch.bincount(a, minlength=k)
        stats.update({f"pcl_k{m}": float(k), f"pcl_k{m}_objective": float(res.objective),
                      f"pcl_k{m}_empty": float((sizes == 0).sum()), f"pcl_k{m}_size_max": float(sizes.max()),
                      f"pcl_k{m}_phi_min": float(phi.min()), f"pcl_k{m}_phi_max": float(phi.max()),
                      f"pcl_k{m}_seconds": time.perf_counter() - t0})
    return Clusterings(cents, assigns, phis, stats)


# --------------------------------------------------------------------------- ProtoNCE (Eq. 11)
PCL_NEGATIVES = 16000  # r negative prototypes per clustering [PCL Sec. 4.1; ref-code 16384]


def _counts(name: str, r: int, ks: Sequence[int] | Clusterings) -> list[int]:
    if isinstance(ks, Clusterings):
        ks = [c.shape[0] for c in ks.centroids]
    if not ks or min(ks) < 1 or r < 1:
        raise ValueError(f"{name}: need r >= 1 and cluster counts >= 1, got r={r}, K={list(ks)}")
    return list(ks)


def capped_negatives(r: int, ks: Sequence[int] | Clusterings) -> int:
    """r capped at floor(K_min / 2) (at least 1): methods-spec 4.7.5's [rec] rule for small data, r = min(16000,
    floor(K_min / 2)). The toy PAUC / NEMD study keeps it (protoclip.toy.pauc_nemd); training runs draw
    :func:`drawn_negatives`, the papers' r wherever K allows it (the toy keeps this rule: its results stay)."""
    return max(1, min(int(r), min(_counts("capped_negatives", r, ks)) // 2))


def drawn_negatives(r: int, ks: Sequence[int] | Clusterings) -> int:
    """The r negative prototypes a PCL / PAUC training run draws per clustering: the stated r wherever every K
    leaves r others to sample (r <= K_min - 1), else all K_min - 1 others. PCL "sample[s] r negative prototypes"
    [pcl-protonce.txt l.113] from the K - 1 clusters that are not the positive (r = 16000 with K >= 25000, l.150;
    PAUC: r = 1024 with K >= 2500, l.158-160), so a cap is needed only where K_min <= r (small data). Per batch,
    :func:`sample_negatives` also stops at the clusters that are no sample's positive (the ref-code's
    ``random.sample`` would fail there). The trainer logs a capped value once (``PCLMethod.resolved``)."""
    return min(int(r), min(_counts("drawn_negatives", r, ks)) - 1)


def sample_negatives(k: int, positives: torch.Tensor, r: int, generator: torch.Generator | None) -> torch.Tensor:
    """r distinct prototype ids that are not among ``positives``, uniformly without replacement, in random order.

    The ref-code draws ``random.sample(set(range(K)) - set(pos), r)``; here torch's generator (CPU) so that the
    draw is a pure function of the generator state (resume). ``r`` is capped at the number of candidates.
    """
    mask = torch.ones(k, dtype=torch.bool)
    mask[positives.detach().cpu().long()] = False
    cand = mask.nonzero().squeeze(1)
    r = min(int(r), cand.numel())
    perm = torch.randperm(cand.numel(), generator=generator)[:r]
    return cand[perm].to(positives.device)


def protonce(q: torch.Tensor, positions: torch.Tensor, clusterings: Clusterings, r: int,
             generator: torch.Generator | None = None, mask_duplicate_pos: bool = False) -> dict[str, torch.Tensor]:
    """Prototype term of ProtoNCE [Eq. 11], mean over the batch and over the M clusterings.

    ``q`` [B, d] online features (l2-normalised here), ``positions`` [B] the rows of ``clusterings.assignments``
    belonging to the batch. Per clustering: ``cols = [pos_0..pos_{B-1}, neg_1..neg_r]``, logits
    ``q_i . c_cols / phi_cols`` (every logit divided by *its own* prototype's phi), cross-entropy with target
    column i for row i (ref-code): the r negative prototypes (:func:`sample_negatives`: without replacement, from
    the clusters that are nobody's positive) are shared by the batch, and the other samples' positives in the
    first B columns are extra negatives (ref-code). ``mask_duplicate_pos`` masks those that equal the row's own
    prototype [spec 4.2, our option]. Also returns the detached top-1 accuracy of the prototype logits
    (``protonce_acc``, %), a diagnostic.
    """
    _check_features("protonce q", q)
    if positions.shape != (q.shape[0],):
        raise ValueError(f"protonce: positions must be [B={q.shape[0]}], got {tuple(positions.shape)}")
    if len(clusterings) < 1:
        raise ValueError("protonce: no clustering")
    q = F.normalize(q, dim=1)
    b = q.shape[0]
    target = torch.arange(b, device=q.device)
    losses, correct = [], torch.zeros((), dtype=torch.float64, device=q.device)
    for c, a, phi in zip(clusterings.centroids, clusterings.assignments, clusterings.phi):
        pos = a[positions.to(a.device)].to(q.device)
        neg = sample_negatives(c.shape[0], pos, r, generator)
        cols = torch.cat([pos, neg])
        logits = (q @ c.to(q.device, q.dtype)[cols].T) / phi.to(q.device, q.dtype)[cols]
        if mask_duplicate_pos:
            dup = (pos[:, None] == pos[None, :]) & ~torch.eye(b, dtype=torch.bool, device=q.device)
            logits = torch.cat([logits[:, :b].masked_fill(dup, float("-inf")), logits[:, b:]], dim=1)
        losses.append(F.cross_entropy(logits, target))
        with torch.no_grad():  # hit = the own prototype scores highest (ties with a duplicate column count)
            own = logits.gather(1, target[:, None])
            correct = correct + (logits.max(dim=1, keepdim=True).values <= own).float().mean().double()
    # float64 sums, float32 result: the numbers a host-side sum gave, without reading the device
    return {"protonce": torch.stack(losses).mean(), "protonce_acc": (100.0 * correct / len(losses)).float()}




# --------------------------------------------------------------------------- cross-modal bridge (spec 5 item 4)
@torch.no_grad()
def relative_concentration(h: torch.Tensor, classifier: torch.Tensor, labels: torch.Tensor,
                           alpha: float = PHI_ALPHA) -> torch.Tensor:
    """phi [K] of Eq. 12 (ref-code clip + rescale) with mean 1, for prototypes ``classifier`` [K, d] whose members
    are the rows of ``h`` [m, d] with ``labels`` [m]: ``||h_i - c_{labels_i}||`` as the member distances."""
    dist = (h.float() - classifier.float()[labels]).norm(dim=1)
    return concentration(dist, labels, classifier.shape[0], tau=1.0, alpha=alpha).float()


def phi_proto_ce(h: torch.Tensor, classifier: torch.Tensor, labels: torch.Tensor, phi: torch.Tensor,
                 scale: torch.Tensor | float, valid: torch.Tensor | None = None) -> torch.Tensor:
    """ProtoNCE over a full prototype classifier [PCL Eq. 10 / 11's prototype term]: ``CE(scale * h . c_j / phi_j,
    labels)`` with phi of mean 1 (so the learnable ``scale`` = 1/tau sets the mean temperature, as PCL rescales
    mean phi to tau); prototypes with ``valid`` False are masked out. Mean over the batch."""
    logits = (F.normalize(h, dim=1) @ classifier.to(h.dtype).T) * scale / phi.to(h.dtype)
    if valid is not None:
        logits = logits.masked_fill(~valid.to(logits.device)[None, :], float("-inf"))
    return F.cross_entropy(logits, labels)


__all__ = ["infonce", "concentration", "Clusterings", "build_clusterings", "capped_negatives", "drawn_negatives",
           "sample_negatives",
           "protonce", "PCL_NEGATIVES",
           "relative_concentration", "phi_proto_ce", "PHI_ALPHA", "PHI_CLIP_PERCENTILES"]
