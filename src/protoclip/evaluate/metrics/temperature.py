"""Diagnostics of the temperature / multi-class-token paper on frozen features (clip-temperature-multi-class-tokens.txt
Sec. 2.1 Fig. 1, App. D Fig. 8, App. H Table 11; methods-spec 2.5 "diagnostics worth implementing"). Inputs are
embeddings whose dot product is the run's similarity s = -d (cosine: L2-normalised z; product sphere:
chunk-normalised z, s = sum of per-token cosines), pairs in rows: ``image[i]`` and ``text[i]`` are a labelled
positive pair. Arrays in, dicts of numbers / lists out (JSON-ready).
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np
import torch

from protoclip.evaluate.metrics._inputs import ArrayLike, features_np, labels_np, same_dim


def _pairs(image: ArrayLike, text: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    u = features_np(image, "image", np.float64, nonzero=True)
    v = features_np(text, "text", np.float64, nonzero=True)
    same_dim(u, v, "image", "text")
    if u.shape[0] != v.shape[0]:
        raise ValueError(f"image and text must be pairs (same rows), got {u.shape[0]} and {v.shape[0]}")
    if u.shape[0] < 2:
        raise ValueError("the temperature diagnostics need at least 2 pairs")
    return u, v


def shuffle_permutation(n: int, share: float, rng: np.random.Generator) -> np.ndarray:
    """Text index of each of ``n`` pairs after shuffling ``share`` of them: that share of the pairs gets another
    pair's text (a cyclic shift among the chosen pairs, so every chosen pair is a false positive; at least 2 when
    ``share`` > 0; the paper does not say how it shuffles)."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"shuffle share must be in [0, 1], got {share}")
    perm = np.arange(n)
    k = int(round(share * n))
    if share > 0:
        k = min(max(k, 2), n)
    if k >= 2:
        chosen = np.sort(rng.choice(n, size=k, replace=False))
        perm[chosen] = np.roll(chosen, 1)
    return perm


@torch.no_grad()
def log_mean_ratio(sim: np.ndarray, scales: Sequence[float], device: str | torch.device = "cpu") -> np.ndarray:
    """log(mean_i r_i) for every scale, from the [B, B] similarity ``sim`` (positives on the diagonal); float64
    in torch on ``device`` (a [B, B] logsumexp per scale: seconds per scale on a CPU at B = 4096)."""
    s = torch.as_tensor(np.asarray(sim, dtype=np.float64), device=device)
    b = s.shape[0]
    if s.ndim != 2 or s.shape[1] != b or b < 2:
        raise ValueError(f"sim must be a square [B, B] matrix with B >= 2, got shape {tuple(s.shape)}")
    diag = torch.eye(b, dtype=torch.bool, device=s.device)
    out = np.empty(len(scales))
    for k, tau in enumerate(scales):
        neg = (tau * s).masked_fill(diag, float("-inf"))
        log_n = torch.logaddexp(torch.logsumexp(neg, 1), torch.logsumexp(neg, 0))  # row i and column i negatives
        out[k] = float(torch.logsumexp(tau * s.diagonal() - log_n, 0)) - math.log(b)
    return out


def equilibrium_scale(scales: Sequence[float], log_ratio: Sequence[float]) -> float | None:
    """tau where the log mean ratio first crosses 0 upwards, interpolated in (log tau, log ratio); None if it
    does not cross inside the sweep (including a sweep that starts at or above 0)."""
    s, r = np.log(np.asarray(scales, dtype=np.float64)), np.asarray(log_ratio, dtype=np.float64)
    for k in range(1, len(s)):
        if r[k - 1] < 0.0 <= r[k]:
            w = -r[k - 1] / (r[k] - r[k - 1])
            return float(np.exp(s[k - 1] + w * (s[k] - s[k - 1])))
    return None


def equilibrium_sweep(image: ArrayLike, text: ArrayLike, scales: Sequence[float], batch_sizes: Sequence[int],
                      shares: Sequence[float], seed: int = 0, device: str | torch.device = "cpu") -> dict:
    """Fig. 1 curves: for each batch size B (at most the number of pairs; larger ones are listed under
    ``skipped_batch_sizes``) one seeded batch, for each share P its shuffled texts (:func:`shuffle_permutation`).
    The headline ``equilibrium_scale`` is that of the largest B without shuffling.

    For each scale tau of the (log-spaced) sweep: the ratio of Eq. 1's numerator to its denominator per positive
    pair, ``r_i = exp(tau s_ii) / (sum_{j!=i} exp(tau s_ij) + sum_{j!=i} exp(tau s_ji))`` (Eq. 1's N: both
    directions' negatives), averaged over the batch (``log_mean_ratio`` = log of that mean, computed by logsumexp:
    the ratio overflows float64 at large tau). The equilibrium scale tau* is where the mean ratio is 1 (the log loss
    of Eq. 1 is 0), interpolated between the sweep points around the first crossing (:func:`equilibrium_scale`);
    null when the sweep does not cross. The paper expects tau* to grow with B and with P.

        equilibrium_sweep(img, txt, scales=np.geomspace(0.1, 1000, 41), batch_sizes=[256], shares=[0, 0.05])
    """
    u, v = _pairs(image, text)
    scales = [float(t) for t in scales]
    if not scales or min(scales) <= 0 or any(b <= a for a, b in zip(scales, scales[1:])):
        raise ValueError("scales must be positive and increasing")
    rng = np.random.default_rng(seed)
    sweep, skipped = [], []
    for b in sorted(set(int(x) for x in batch_sizes)):
        if b < 2 or b > len(u):
            skipped.append(b)
            continue
        rows = np.sort(rng.choice(len(u), size=b, replace=False))
        for share in shares:
            perm = shuffle_permutation(b, float(share), rng)
            lr = log_mean_ratio(u[rows] @ v[rows][perm].T, scales, device)
            sweep.append({"batch_size": b, "shuffle": float(share), "log_mean_ratio": lr.tolist(),
                          "equilibrium_scale": equilibrium_scale(scales, lr)})
    out: dict = {"scales": scales, "sweep": sweep, "n_pairs": int(len(u)), "skipped_batch_sizes": skipped}
    clean = [r for r in sweep if r["shuffle"] == 0.0]
    if clean:
        out["equilibrium_scale"] = clean[-1]["equilibrium_scale"]
        out["equilibrium_batch_size"] = clean[-1]["batch_size"]
    return out


def distance_histograms(image: ArrayLike, text: ArrayLike, bins: int = 50, max_points: int = 2000,
                        seed: int = 0) -> dict:
    """Fig. 8 (in-domain panel): counts of s per kind of pair over ``bins`` shared bins spanning every value; at most
    ``max_points`` pairs (a seeded subset: the negative counts grow as n^2). Also each kind's mean. The kinds:
    positive image-text pairs, negative image-text pairs, negative image-image and text-text pairs (the paper's
    logits_pos / logits_neg / img_neg / text_neg), without the learned scale (as the paper plots them)."""
    u, v = _pairs(image, text)
    if bins < 1:
        raise ValueError(f"bins must be >= 1, got {bins}")
    if len(u) > max_points:
        keep = np.sort(np.random.default_rng(seed).choice(len(u), size=max_points, replace=False))
        u, v = u[keep], v[keep]
    n = len(u)
    it, ii, tt = u @ v.T, u @ u.T, v @ v.T
    upper = np.triu_indices(n, k=1)
    values = {"pos_image_text": np.diagonal(it), "neg_image_text": it[~np.eye(n, dtype=bool)],
              "neg_image_image": ii[upper], "neg_text_text": tt[upper]}
    lo = min(float(x.min()) for x in values.values())
    hi = max(float(x.max()) for x in values.values())
    edges = np.linspace(lo, hi if hi > lo else lo + 1.0, bins + 1)
    out: dict = {"edges": edges.tolist(), "n_pairs": n}
    for name, x in values.items():
        out[name] = np.histogram(x, bins=edges)[0].tolist()
        out[f"mean_{name}"] = float(x.mean())
    return out


def token_subset_zeroshot(image: ArrayLike, classifier: ArrayLike, labels: ArrayLike, tokens: int,
                          sizes: Sequence[int] = (1, 2, 4, 8), draws: int = 10, seed: int = 0) -> dict:
    """Table 11: ``image`` [N, m*n] and ``classifier`` [C, m*n] chunk-normalised per token (the classifier may
    be a prompt mean), class = argmax of the summed cosines of a k-subset of the m = ``tokens`` tokens.
    Per k < m in ``sizes``: top-1 (%) mean and std (ddof 1; 0 for one subset) over ``draws`` random k-subsets
    (every subset when there are at most ``draws``; the paper does not give its number of draws); ``all`` = every
    token (the full model's score)."""
    x = features_np(image, "image", np.float64)
    w = features_np(classifier, "classifier", np.float64)
    same_dim(x, w, "image", "classifier")
    y = labels_np(labels, "labels", x.shape[0])
    if tokens < 1 or x.shape[1] % tokens:
        raise ValueError(f"token subsets: {tokens} tokens must divide the width {x.shape[1]}")
    if draws < 1:
        raise ValueError(f"draws must be >= 1, got {draws}")
    n = x.shape[1] // tokens
    # per-token score [m, N, C]: then a subset's score is a sum over its tokens
    per_token = np.einsum("ikc,jkc->kij", x.reshape(len(x), tokens, n), w.reshape(len(w), tokens, n))

    def top1(subset: tuple[int, ...]) -> float:
        return 100.0 * float((per_token[list(subset)].sum(0).argmax(1) == y).mean())

    rng = np.random.default_rng(seed)
    out: dict = {"tokens": tokens, "all": top1(tuple(range(tokens))), "sizes": {}}
    for k in sorted(set(int(s) for s in sizes)):
        if not 1 <= k < tokens:
            continue
        if math.comb(tokens, k) <= draws:
            subsets = list(itertools.combinations(range(tokens), k))
        else:
            seen: set[tuple[int, ...]] = set()
            while len(seen) < draws:
                seen.add(tuple(sorted(rng.choice(tokens, size=k, replace=False).tolist())))
            subsets = sorted(seen)
        acc = np.array([top1(s) for s in subsets])
        out["sizes"][str(k)] = {"mean": float(acc.mean()), "std": float(acc.std(ddof=1)) if len(acc) > 1 else 0.0,
                                "n_subsets": len(subsets)}
    return out


__all__ = ["distance_histograms", "equilibrium_scale", "equilibrium_sweep", "log_mean_ratio",
           "shuffle_permutation", "token_subset_zeroshot"]
