"""PAUC's prototype regularisers [pauc-nemd.txt, Mo, Sun & Li; Eqs. 4-7]: alignment, uniformity and correlation,
computed on differentiable batch prototypes (the means of the batch's online embeddings per cluster), since on
PCL's fixed k-means centroids the terms would have no gradient (methods-spec 3.3). Definitions and the sign
choice: docs/methods.md, "protoclip.losses.pauc".
"""
from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

AlignMode = Literal["anchor", "two_view"]
# spec 3.3 [rec]; the paper gives no value (its supplement is not part of the paper text)
DEFAULT_S = 2.0  # alignment exponent s
DEFAULT_T = 2.0  # uniformity kernel t (Wang & Isola's t = 2)
DEFAULT_TAU_C = 0.1  # softmax temperature mapping a batch prototype onto the simplex (correlation)


def batch_prototypes(v: torch.Tensor, assignments: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [P] of the clusters present, sorted; c^ [P, d] = normalize(mean of their members)), differentiable."""
    ids, inv = assignments.unique(sorted=True, return_inverse=True)
    sums = v.new_zeros(len(ids), v.shape[1]).index_add_(0, inv, v)
    return ids, F.normalize(sums, dim=1)  # normalising the sum = normalising the mean


def pauc_terms(v: torch.Tensor, assignments: torch.Tensor, centroids: torch.Tensor | None = None, *,
               s: float = DEFAULT_S, t: float = DEFAULT_T, tau_c: float = DEFAULT_TAU_C,
               align_mode: AlignMode = "anchor", v2: torch.Tensor | None = None,
               unif_log: bool = False) -> dict[str, torch.Tensor]:
    """The three PAUC terms of one clustering (defined in docs/methods.md, "protoclip.losses.pauc"). ``v`` [B, d]
    (normalised here), ``assignments`` [B] cluster ids of the batch, ``centroids`` [K, d] the fixed centroids
    (anchor alignment; normalised here, no gradient), ``v2`` [B, d] the second view's embeddings (two-view
    alignment). With fewer than two clusters in the batch, uniformity and correlation are 0 (no pair). Every term
    is unweighted: the caller's ``total`` applies alpha, beta, gamma (spec 3.3 [rec]: 1, 1, 0.1)."""
    if v.ndim != 2 or assignments.shape != (v.shape[0],):
        raise ValueError(f"pauc_terms: v must be [B, d] and assignments [B], got {tuple(v.shape)}, "
                         f"{tuple(assignments.shape)}")
    if s <= 0 or t <= 0 or tau_c <= 0:
        raise ValueError(f"pauc_terms: s, t, tau_c must be > 0, got {s}, {t}, {tau_c}")
    v = F.normalize(v, dim=1)
    a = assignments.to(v.device).long()
    ids, chat = batch_prototypes(v, a)
    if align_mode == "anchor":
        if centroids is None:
            raise ValueError("pauc_terms: align_mode 'anchor' needs the centroids")
        c = F.normalize(centroids.detach().to(v.device, v.dtype), dim=1)
        align = (v - c[a]).pow(2).sum(dim=1).pow(s / 2).mean()  # ||.||^s without sqrt's NaN gradient at 0
    elif align_mode == "two_view":
        if v2 is None or v2.shape != v.shape:
            raise ValueError("pauc_terms: align_mode 'two_view' needs v2 of the same shape as v")
        _, chat2 = batch_prototypes(F.normalize(v2, dim=1), a)
        align = (chat - chat2).pow(2).sum(dim=1).pow(s / 2).mean()
    else:
        raise ValueError(f"pauc_terms: unknown align_mode {align_mode!r} (known: anchor, two_view)")
    if len(ids) < 2:
        zero = v.sum() * 0.0  # keeps the graph (DDP) and the dtype
        return {"pauc_align": align, "pauc_unif": zero, "pauc_corr": zero}
    off = ~torch.eye(len(ids), dtype=torch.bool, device=v.device)
    sq = (chat[:, None, :] - chat[None, :, :]).pow(2).sum(-1)  # exact squared distances, finite gradient at 0
    kern = torch.exp(-t * sq)[off]
    unif = kern.mean().log() if unif_log else kern.mean()
    logpi = F.log_softmax(chat / tau_c, dim=1)
    kl = (logpi.exp()[:, None, :] * (logpi[:, None, :] - logpi[None, :, :])).sum(-1)  # KL(pi_p || pi_q)
    return {"pauc_align": align, "pauc_unif": unif, "pauc_corr": -kl[off].mean()}


def pauc_loss(v: torch.Tensor, positions: torch.Tensor, clusterings, **kwargs) -> dict[str, torch.Tensor]:
    """:func:`pauc_terms` averaged over the clusterings (Eq. 7's 1/M; ``protoclip.losses.pcl.Clusterings`` or any
    object with ``centroids`` / ``assignments`` lists); ``positions`` [B] index the assignments of the batch's
    items. ``terms = pauc_loss(v, positions, clusterings, s=2, t=2, tau_c=0.1)`` -> {"pauc_align", "pauc_unif",
    "pauc_corr"}."""
    out: dict[str, list[torch.Tensor]] = {}
    for c, a in zip(clusterings.centroids, clusterings.assignments):
        for name, val in pauc_terms(v, a[positions.to(a.device)], c, **kwargs).items():
            out.setdefault(name, []).append(val)
    if not out:
        raise ValueError("pauc_loss: no clustering")
    return {name: torch.stack(vals).mean() for name, vals in out.items()}


__all__ = ["batch_prototypes", "pauc_terms", "pauc_loss", "AlignMode", "DEFAULT_S", "DEFAULT_T", "DEFAULT_TAU_C"]
