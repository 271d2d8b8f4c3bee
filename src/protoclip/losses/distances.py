"""Pluggable distances for the CLIP loss: sphere, Euclidean and the product of spheres PS(n, m) with negative trace
or geodesic distance (clip-temperature-multi-class-tokens.txt Table 1, Fig. 6; spec 2.2), for the temperature
study. The table of the four distances: docs/methods.md, "protoclip.losses.distances".
"""
from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

Distance = Literal["sphere", "euclidean", "ps_negtrace", "ps_geodesic"]
DISTANCES = ("sphere", "euclidean", "ps_negtrace", "ps_geodesic")
# the geodesic clamps the cosine to [-1 + eps, 1 - eps] before arccos, whose gradient diverges at +-1 (spec 2.7.6):
# at identical points d = sqrt(m) * arccos(1 - 1e-6) ~ 1.4e-3 sqrt(m), not exactly 0
GEODESIC_EPS = 1e-6


def product_sphere(x: torch.Tensor, subspheres: int) -> torch.Tensor:
    """[B, m*n] -> [B, m, n] with every n-chunk unit norm.

    PS(n, m) is m copies of S^{n-1}: the feature is cut into m consecutive chunks of n dims and each chunk is
    L2-normalised (spec 2.2 "product-sphere embedding"); for multi-class-token towers the chunks are the tokens.
    """
    if x.ndim != 2 or x.shape[1] % subspheres:
        raise ValueError(f"product sphere: features [B, m*n] with m={subspheres} dividing the width, "
                         f"got {tuple(x.shape)}")
    return F.normalize(x.reshape(x.shape[0], subspheres, -1), dim=-1)


def neg_distance(u: torch.Tensor, v: torch.Tensor, distance: Distance = "sphere",
                 subspheres: int = 1) -> torch.Tensor:
    """-d(u_i, v_j) for every pair: [N, D] x [M, D] -> [N, M] (the similarity the logits scale).

    ``ps_*`` distances read [N, m*n] features as PS(n, m) with m = ``subspheres`` (:func:`product_sphere`).
    Example: ``logits = scale * neg_distance(u, v, "ps_negtrace", subspheres=16)``.
    """
    if u.ndim != 2 or v.ndim != 2 or u.shape[1] != v.shape[1]:
        raise ValueError(f"distance: features must be [N, D] and [M, D], got {tuple(u.shape)} and {tuple(v.shape)}")
    if distance == "sphere":
        return F.normalize(u, dim=-1) @ F.normalize(v, dim=-1).t()
    if distance == "euclidean":
        # cdist's default matmul form (|u|^2 + |v|^2 - 2u.v) cancels catastrophically in float32 for batches
        # above 25 (about 5e-3 error on pairs 8e-4 apart); the direct-difference kernel is exact to rounding,
        # gives subgradient 0 at zero distance and is no slower at CLIP batch sizes.
        return -torch.cdist(u, v, compute_mode="donot_use_mm_for_euclid_dist")
    pu, pv = product_sphere(u, subspheres), product_sphere(v, subspheres)
    if distance == "ps_negtrace":
        return torch.einsum("ikc,jkc->ij", pu, pv)  # avoids the [N, M, m] per-chunk tensor (App. B)
    if distance == "ps_geodesic":
        cos = torch.einsum("ikc,jkc->ijk", pu, pv).clamp(-1 + GEODESIC_EPS, 1 - GEODESIC_EPS)
        return -torch.acos(cos).pow(2).sum(-1).sqrt()
    raise ValueError(f"unknown distance {distance!r} (known: {', '.join(DISTANCES)})")


def contrastive_loss(u: torch.Tensor, v: torch.Tensor, scale: torch.Tensor, distance: Distance = "sphere",
                     subspheres: int = 1) -> torch.Tensor:
    """Symmetric in-batch CE over ``scale * -d(u_i, v_j)`` (pairs on the diagonal; paper Fig. 6).

    The paper writes exp(-tau d), its tau being CLIP's logit scale (``scale`` here). The logit-scale clamp of
    each distance is a config default: ``protoclip.train.config.DEFAULT_MAX_SCALE``.
    """
    logits = scale * neg_distance(u, v, distance, subspheres)
    labels = torch.arange(u.shape[0], device=u.device)
    return 0.5 * (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels))


@torch.no_grad()
def temperature_stats(u: torch.Tensor, v: torch.Tensor, scale: torch.Tensor | float, distance: Distance = "sphere",
                      subspheres: int = 1) -> dict[str, torch.Tensor]:
    """Spec 2.2/2.5 diagnostics of a batch: ``equilibrium`` = mean_i (s_ii - E_{j~p_i} s_ij) over both
    directions (= -dL/dscale; > 0 while the scale grows, 0 at the paper's equilibrium), and the in-batch
    retrieval accuracy (%), with s = -d and p_i = softmax(scale * s_i.). 0-d tensors on the device (no host read);
    the accuracies in float64, as a host-side ``100 * float(mean)`` gave them."""
    s = neg_distance(u.float(), v.float(), distance, subspheres)
    out = {}
    eq = []
    for name, sm in (("i2t", s), ("t2i", s.t())):
        p = torch.softmax(scale * sm, dim=1)
        eq.append(sm.diagonal() - (p * sm).sum(1))
        hits = (sm.argmax(1) == torch.arange(len(sm), device=sm.device)).float().mean()
        out[f"clip_acc_{name}"] = 100.0 * hits.double()
    out["equilibrium"] = torch.cat(eq).mean()
    return out


__all__ = ["DISTANCES", "Distance", "contrastive_loss", "neg_distance", "product_sphere",
           "temperature_stats"]
