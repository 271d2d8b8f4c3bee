"""Clustering evaluation: k-means pseudo-labels vs ground truth, ARI and AMI (ProtoCLIP Sec. IV-G3, Table XII).

The paper clusters the test-set image representations with K-Means, K = number of ground-truth
classes, and reports sklearn's Adjusted Rand Index and Adjusted Mutual Information. The paper does
not say whether features are normalised; we cluster the L2-normalised features (the representation
every other ProtoCLIP metric uses, and the one k-means in the method itself works on) with ordinary
Euclidean k-means.

Backend: scikit-learn ``KMeans`` (k-means++, ``n_init`` restarts, best inertia kept) or
``faiss.Kmeans`` (``nredo`` restarts, the library ProtoCLIP itself clusters with). The default
``backend="auto"`` uses sklearn up to N * K = 5e6 (every offline set, CIFAR-10/100, STL-10) and faiss
above (ImageNet: 50k x 1000), where sklearn on CPU takes hours.

    from protoclip.evaluate.metrics.clustering import cluster_scores
    cluster_scores(features, labels)   # -> {"ari": 0.73, "ami": 0.79, "n_clusters": 10}
"""
from __future__ import annotations

import logging
from typing import Literal

import numpy as np
from sklearn.cluster import KMeans
from sklearn.metrics import adjusted_mutual_info_score, adjusted_rand_score

from protoclip.evaluate.metrics._inputs import ArrayLike, features_np, l2_normalize_np, labels_np

log = logging.getLogger(__name__)

AUTO_FAISS_ABOVE = 5_000_000  # N * K above which backend="auto" uses faiss


def kmeans_labels(
    x: np.ndarray,
    k: int,
    seed: int = 0,
    n_init: int = 10,
    max_iter: int = 300,
    backend: Literal["sklearn", "faiss", "auto"] = "sklearn",
    spherical: bool = False,
) -> np.ndarray:
    """Cluster rows of ``x`` into ``k`` groups; returns int64 assignments [N].

    ``spherical`` (faiss only) renormalises centroids after each step (spherical k-means).
    """
    if not 1 <= k <= x.shape[0]:
        raise ValueError(f"k must be in [1, N={x.shape[0]}], got {k}")
    if backend == "auto":
        backend = "faiss" if x.shape[0] * k > AUTO_FAISS_ABOVE or spherical else "sklearn"
    if backend == "sklearn":
        if spherical:
            raise ValueError("spherical k-means needs backend='faiss'")
        km = KMeans(n_clusters=k, n_init=n_init, max_iter=max_iter, random_state=seed)
        return km.fit_predict(x).astype(np.int64)
    if backend == "faiss":
        import faiss  # imported here: only this backend needs it

        xf = np.ascontiguousarray(x, dtype=np.float32)
        # max_points_per_centroid >= N/k: faiss would otherwise train on a subsample of 256 * k points
        km = faiss.Kmeans(xf.shape[1], k, niter=max_iter, nredo=n_init, seed=seed, spherical=spherical,
                          min_points_per_centroid=1, max_points_per_centroid=max(256, xf.shape[0] // k + 1))
        km.train(xf)
        _, assign = km.index.search(xf, 1)
        return assign[:, 0].astype(np.int64)
    raise ValueError(f"unknown k-means backend {backend!r} (sklearn, faiss, auto)")


def cluster_scores(
    features: ArrayLike,
    labels: ArrayLike,
    seed: int = 0,
    n_init: int = 10,
    n_clusters: int | None = None,
    backend: Literal["sklearn", "faiss", "auto"] = "auto",
    normalize: bool = True,
) -> dict[str, float]:
    """ARI and AMI of k-means (K = number of distinct labels unless given) against ``labels``."""
    x = features_np(features, "features")
    y = labels_np(labels, "labels", x.shape[0])
    k = len(np.unique(y)) if n_clusters is None else n_clusters
    if normalize:
        x = l2_normalize_np(x)
    pred = kmeans_labels(x, k, seed=seed, n_init=n_init, backend=backend)
    out = {
        "ari": float(adjusted_rand_score(y, pred)),
        "ami": float(adjusted_mutual_info_score(y, pred)),
        "n_clusters": int(k),
    }
    log.info("clustering %d points into %d clusters: %s", x.shape[0], k, out)
    return out
