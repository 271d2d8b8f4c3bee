"""Clustering evaluation (ProtoCLIP Sec. IV-G3, Table XII): k-means on the test-set image representations, K = the
number of ground-truth classes, scored against the labels by scikit-learn's Adjusted Rand Index and Adjusted Mutual
Information.

    cluster_scores(features, labels)   # -> {"ari": 0.73, "ami": 0.79, "n_clusters": 10}
"""
from __future__ import annotations

import logging
from typing import Literal

import numpy as np

from protoclip.evaluate.metrics._inputs import ArrayLike, features_np, l2_normalize_np, labels_np
from protoclip.prototypes.kmeans import load_faiss

log = logging.getLogger(__name__)

AUTO_FAISS_ABOVE = 5_000_000  # N * K above which backend="auto" uses faiss


def init_seeds(seed: int, n_init: int) -> list[int]:
    """Seeds of the ``n_init`` initialisations of clustering seed ``seed``: ``seed * n_init + i``, so that seeds
    s and s + 1 share none (``seed + i`` shared n_init - 1 of them, and a spread over seeds measured little);
    seed 0 keeps its initialisations 0 .. n_init - 1."""
    if seed < 0:
        raise ValueError(f"clustering seed must be >= 0, got {seed}")
    return [seed * n_init + i for i in range(n_init)]


def kmeans_runs(
    x: np.ndarray,
    k: int,
    seed: int = 0,
    n_init: int = 10,
    max_iter: int = 300,
    backend: Literal["sklearn", "faiss", "auto"] = "sklearn",
    spherical: bool = False,
) -> list[tuple[float, np.ndarray]]:
    """``n_init`` independent k-means runs (seeds :func:`init_seeds`): [(objective, assignments)].

    The objective is the sum of squared distances to the assigned centroid (sklearn's ``inertia_``,
    faiss's final ``obj``). Each run is one k-means++ (sklearn) / random (faiss) initialisation, i.e. what
    sklearn's ``n_init`` / faiss's ``nredo`` do internally, but every run's result is kept so the spread
    over initialisations can be reported. ``spherical`` (faiss only) renormalises centroids each step.
    """
    if not 1 <= k <= x.shape[0]:
        raise ValueError(f"k must be in [1, N={x.shape[0]}], got {k}")
    if n_init < 1:
        raise ValueError(f"n_init must be >= 1, got {n_init}")
    if backend == "auto":
        backend = "faiss" if x.shape[0] * k > AUTO_FAISS_ABOVE or spherical else "sklearn"
    runs: list[tuple[float, np.ndarray]] = []
    if backend == "sklearn":
        if spherical:
            raise ValueError("spherical k-means needs backend='faiss'")
        from sklearn.cluster import KMeans  # heavy: sklearn, only when k-means runs

        for init_seed in init_seeds(seed, n_init):
            km = KMeans(n_clusters=k, n_init=1, max_iter=max_iter, random_state=init_seed)
            pred = km.fit_predict(x).astype(np.int64)
            runs.append((float(km.inertia_), pred))
        return runs
    if backend == "faiss":
        faiss = load_faiss()

        xf = np.ascontiguousarray(x, dtype=np.float32)
        for init_seed in init_seeds(seed, n_init):
            # max_points_per_centroid >= N/k: faiss would otherwise train on a subsample of 256 * k points
            km = faiss.Kmeans(xf.shape[1], k, niter=max_iter, nredo=1, seed=init_seed, spherical=spherical,
                              min_points_per_centroid=1, max_points_per_centroid=max(256, xf.shape[0] // k + 1))
            km.train(xf)
            dist, assign = km.index.search(xf, 1)
            # objective recomputed from the final assignment; spherical k-means searches by inner product
            # (larger is better), so its objective is minus the summed similarity
            total = float(dist[:, 0].astype(np.float64).sum())
            if km.index.metric_type == faiss.METRIC_INNER_PRODUCT:
                total = -total
            runs.append((total, assign[:, 0].astype(np.int64)))
        return runs
    raise ValueError(f"unknown k-means backend {backend!r} (sklearn, faiss, auto)")


def kmeans_labels(x: np.ndarray, k: int, seed: int = 0, n_init: int = 10, max_iter: int = 300,
                  backend: Literal["sklearn", "faiss", "auto"] = "sklearn", spherical: bool = False) -> np.ndarray:
    """Assignments [N] of the lowest-objective run of :func:`kmeans_runs` (sklearn's ``n_init`` rule)."""
    runs = kmeans_runs(x, k, seed=seed, n_init=n_init, max_iter=max_iter, backend=backend, spherical=spherical)
    return min(runs, key=lambda r: r[0])[1]


def cluster_scores(
    features: ArrayLike,
    labels: ArrayLike,
    seed: int = 0,
    n_init: int = 10,
    n_clusters: int | None = None,
    backend: Literal["sklearn", "faiss", "auto"] = "auto",
    normalize: bool = True,
    per_example: bool = False,
) -> dict[str, float] | tuple[dict[str, float], dict[str, np.ndarray]]:
    """ARI and AMI of k-means (K = number of distinct labels unless given) against ``labels``.

    The paper does not say whether features are normalised; with ``normalize`` we cluster the L2-normalised
    features (the representation every other ProtoCLIP metric uses, and the one k-means in the method itself works
    on) with ordinary Euclidean k-means. ``backend="auto"`` uses scikit-learn ``KMeans`` (k-means++) up to
    N * K = 5e6 (every offline set, CIFAR-10/100, STL-10) and ``faiss.Kmeans`` (the library ProtoCLIP itself
    clusters with) above (ImageNet: 50k x 1000), where scikit-learn on CPU takes hours.

    ``ari`` / ``ami`` are those of the run with the lowest k-means objective among ``n_init``
    initialisations (as scikit-learn picks); ``ari_min/ari_max/ari_std`` and the same for AMI give
    the spread over the initialisations (one seed alone can move ARI by 0.1+ on ordinary data).
    ``per_example``: also ``{"cluster": [N]}``, that run's assignments (the claims ledger resamples the test
    images with them: protoclip.claims.bootstrap.RandIndex).
    """
    x = features_np(features, "features", nonzero=normalize)
    y = labels_np(labels, "labels", x.shape[0])
    k = len(np.unique(y)) if n_clusters is None else n_clusters
    if normalize:
        x = l2_normalize_np(x)
    runs = kmeans_runs(x, k, seed=seed, n_init=n_init, backend=backend)
    from sklearn.metrics import (adjusted_mutual_info_score,
                                 adjusted_rand_score)  # heavy: sklearn, only when clusterings are scored

    aris = np.array([adjusted_rand_score(y, pred) for _, pred in runs])
    amis = np.array([adjusted_mutual_info_score(y, pred) for _, pred in runs])
    best = int(np.argmin([obj for obj, _ in runs]))  # first of equal objectives, like sklearn
    out = {"ari": float(aris[best]), "ami": float(amis[best]), "n_clusters": int(k), "n_init": int(n_init)}
    for name, vals in (("ari", aris), ("ami", amis)):
        out[f"{name}_min"], out[f"{name}_max"] = float(vals.min()), float(vals.max())
        out[f"{name}_std"] = float(vals.std())
    log.info("clustering %d points into %d clusters (%d inits): %s", x.shape[0], k, n_init, out)
    return (out, {"cluster": runs[best][1]}) if per_example else out
