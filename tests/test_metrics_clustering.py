"""k-means clustering evaluation: ARI / AMI known answers."""
from __future__ import annotations

import numpy as np
import pytest

from protoclip.evaluate.metrics.clustering import cluster_scores, kmeans_labels


def blobs_on_axes(rng, n: int, C: int, d: int, noise: float):
    y = rng.integers(0, C, n)
    return np.eye(C, d)[y] + noise * rng.normal(size=(n, d)), y


@pytest.mark.parametrize("backend", ["sklearn", "faiss"])
def test_separable_classes_give_perfect_scores(backend):
    rng = np.random.default_rng(0)
    x, y = blobs_on_axes(rng, 300, 5, 8, 0.02)
    out = cluster_scores(x, y, backend=backend)
    assert out["ari"] == pytest.approx(1.0) and out["ami"] == pytest.approx(1.0)
    assert out["n_clusters"] == 5
    # relabelling the classes changes nothing (the scores are permutation invariant)
    assert cluster_scores(x, (y + 2) % 5, backend=backend)["ari"] == pytest.approx(1.0)


def test_normalisation_makes_radial_scale_irrelevant():
    # two classes along two directions, each with norms 1 and 20: on the sphere they are two points,
    # while Euclidean k-means on raw features splits by norm instead.
    rng = np.random.default_rng(1)
    y = np.repeat([0, 1], 40)
    scale = np.tile(np.repeat([1.0, 20.0], 20), 2)[:, None]
    x = np.eye(2)[y] * scale + 0.01 * rng.normal(size=(80, 2))
    assert cluster_scores(x, y)["ari"] == pytest.approx(1.0)
    assert cluster_scores(x, y, normalize=False)["ari"] < 0.5


def test_random_labels_give_scores_near_zero():
    # ARI and AMI are chance-adjusted: expectation 0 for labels independent of the clusters.
    # Over 8 seeds (N = 1500, K = 6) the std was 0.0013 (ARI) / 0.0018 (AMI); tolerance 0.02 is > 10 std.
    rng = np.random.default_rng(2)
    out = cluster_scores(rng.normal(size=(1500, 8)), rng.integers(0, 6, 1500))
    assert abs(out["ari"]) < 0.02 and abs(out["ami"]) < 0.02


def test_kmeans_labels_checks():
    x = np.random.default_rng(3).normal(size=(10, 3)).astype(np.float32)
    assert kmeans_labels(x, 3, backend="faiss", spherical=True).shape == (10,)
    with pytest.raises(ValueError, match="k must be"):
        kmeans_labels(x, 11)
    with pytest.raises(ValueError, match="unknown"):
        kmeans_labels(x, 2, backend="scipy")
    with pytest.raises(ValueError, match="spherical"):
        kmeans_labels(x, 2, backend="sklearn", spherical=True)
