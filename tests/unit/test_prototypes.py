"""Known-answer tests of protoclip.prototypes.kmeans (faiss and torch backends). The torch backend is tested
whether or not faiss imports; the faiss backend and the comparison of the two where it does."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.datasets import make_blobs
from sklearn.metrics import adjusted_rand_score

from protoclip.prototypes.kmeans import assign, kmeans, split_empty_clusters

try:
    import faiss  # noqa: F401

    HAS_FAISS = True
except ImportError:
    HAS_FAISS = False
needs_faiss = pytest.mark.skipif(not HAS_FAISS, reason="faiss is not importable: only the torch backend is tested")
BACKENDS = [pytest.param("faiss", marks=needs_faiss), "torch"]


def _blobs(n=1500, k=6, d=12, std=1.0, seed=0):
    x, y = make_blobs(n_samples=n, centers=k, n_features=d, cluster_std=std, center_box=(-20, 20), random_state=seed)
    return x.astype(np.float32), y


def _naive_objective(x: np.ndarray, centroids: np.ndarray, labels: np.ndarray) -> float:
    total = 0.0
    for i in range(x.shape[0]):
        diff = x[i].astype(np.float64) - centroids[labels[i]].astype(np.float64)
        total += float(diff @ diff)
    return total


def _naive_assign(x: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    out = np.empty(x.shape[0], dtype=np.int64)
    for i in range(x.shape[0]):
        out[i] = int(np.argmin(((centroids.astype(np.float64) - x[i]) ** 2).sum(1)))
    return out


@needs_faiss
def test_backends_agree_with_shared_init():
    # overlapping blobs (std 4) so that Lloyd actually moves for several iterations
    x, _ = _blobs(n=3000, k=10, d=16, std=4.0, seed=1)
    init = x[np.random.default_rng(0).choice(len(x), 24, replace=False)]
    rf = kmeans(x, 24, iters=15, backend="faiss", init_centroids=init)
    rt = kmeans(x, 24, iters=15, backend="torch", init_centroids=init)
    assert rf.backend == "faiss" and rt.backend == "torch"
    assert abs(rf.objective - rt.objective) <= 1e-3 * rf.objective
    assert (rf.assignments == rt.assignments).float().mean() >= 0.99
    torch.testing.assert_close(rf.centroids, rt.centroids, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_recovers_separated_blobs_exactly(backend):
    x, y = _blobs(n=1200, k=5, d=8, std=0.5, seed=2)
    res = kmeans(x, 5, iters=20, backend=backend, init="kmeans++", seed=0)
    assert adjusted_rand_score(y, res.assignments.numpy()) == 1.0
    assert res.n_empty == 0
    assert sorted(res.sizes.tolist()) == sorted(np.bincount(y).tolist())


@pytest.mark.parametrize("backend", BACKENDS)
def test_result_matches_naive_recomputation(backend):
    x, _ = _blobs(n=400, k=4, d=5, std=3.0, seed=3)
    res = kmeans(x, 7, iters=10, backend=backend, seed=1)
    c = res.centroids.numpy()
    labels = _naive_assign(x, c)
    # assignments are the nearest centroid (ties are measure-zero with continuous data)
    np.testing.assert_array_equal(res.assignments.numpy(), labels)
    assert res.objective == pytest.approx(_naive_objective(x, c, labels), rel=1e-5)
    np.testing.assert_array_equal(res.sizes.numpy(), np.bincount(labels, minlength=7))
    assert res.n_empty == int((np.bincount(labels, minlength=7) == 0).sum())
    assert res.centroids.dtype == torch.float32 and res.assignments.dtype == torch.int64


def test_lloyd_step_is_the_cluster_mean():
    # one iteration from a known init: centroid k = mean of the points nearest to init k (computed by loop)
    x, _ = _blobs(n=300, k=3, d=4, std=2.0, seed=4)
    init = x[:3].copy()
    res = kmeans(x, 3, iters=1, backend="torch", init_centroids=init)
    lab = _naive_assign(x, init)
    for j in range(3):
        np.testing.assert_allclose(res.centroids[j].numpy(), x[lab == j].mean(0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_random_init_is_samples_without_iterations(backend):
    x, _ = _blobs(n=200, k=3, d=4, seed=5)
    res = kmeans(x, 10, iters=20, backend=backend, init="random", seed=3)
    for c in res.centroids.numpy():  # every prototype is one of the samples (0 Lloyd iterations)
        assert np.min(np.abs(x - c).sum(1)) < 1e-6


def test_empty_cluster_split_and_counting():
    # a duplicated init centroid gets no points (ties go to the lowest index): faiss-style split re-seeds it
    x = np.concatenate([np.zeros((50, 2)), np.ones((50, 2)) * 10, np.ones((50, 2)) * [10, -10]]).astype(np.float32)
    x += np.random.default_rng(0).normal(scale=0.1, size=x.shape).astype(np.float32)
    init = np.array([[0, 0], [0, 0], [10, 10]], dtype=np.float32)
    res0 = kmeans(x, 3, iters=0, backend="torch", init_centroids=init)
    assert res0.n_empty == 1 and res0.sizes.tolist()[1] == 0
    res = kmeans(x, 3, iters=10, backend="torch", init_centroids=init)
    assert res.n_empty == 0  # the empty one was split off the largest cluster and found the third blob
    assert sorted(res.sizes.tolist()) == [50, 50, 50]


def test_split_empty_clusters_moves_copy_of_largest():
    c = torch.tensor([[1.0, 2.0], [5.0, 5.0], [9.0, 9.0]])
    counts = torch.tensor([10, 0, 3])
    assert split_empty_clusters(c, counts) == 1
    eps = 1.0 / 1024
    torch.testing.assert_close(c[1], torch.tensor([1.0 * (1 + eps), 2.0 * (1 - eps)]))
    torch.testing.assert_close(c[0], torch.tensor([1.0 * (1 - eps), 2.0 * (1 + eps)]))
    torch.testing.assert_close(c[2], torch.tensor([9.0, 9.0]))


def test_assign_chunks_match_unchunked():
    x = torch.randn(103, 7, generator=torch.Generator().manual_seed(0))
    c = torch.randn(9, 7, generator=torch.Generator().manual_seed(1))
    l1, d1 = assign(x, c, chunk_rows=10)
    l2 = torch.cdist(x.double(), c.double()).argmin(1)
    assert torch.equal(l1, l2)
    torch.testing.assert_close(d1.double(), ((x.double() - c.double()[l2]) ** 2).sum(1), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_deterministic_by_seed(backend):
    x, _ = _blobs(n=500, k=8, d=6, std=3.0, seed=6)
    a = kmeans(x, 12, iters=5, backend=backend, seed=7)
    b = kmeans(x, 12, iters=5, backend=backend, seed=7)
    c = kmeans(x, 12, iters=0, backend=backend, seed=8)
    d = kmeans(x, 12, iters=0, backend=backend, seed=7)
    assert torch.equal(a.assignments, b.assignments) and torch.equal(a.centroids, b.centroids)
    assert not torch.equal(c.centroids, d.centroids)  # another seed draws another init


def test_nredo_keeps_best_objective():
    x, _ = _blobs(n=500, k=8, d=6, std=3.0, seed=7)
    singles = [kmeans(x, 8, iters=5, backend="torch", seed=s).objective for s in range(3)]
    best = kmeans(x, 8, iters=5, backend="torch", seed=0, nredo=3).objective
    assert best == pytest.approx(min(singles), rel=1e-9)


@pytest.mark.parametrize("backend", BACKENDS)
def test_spherical_centroids_are_unit_norm(backend):
    x, _ = _blobs(n=300, k=4, d=5, seed=8)
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    res = kmeans(x, 4, iters=5, backend=backend, spherical=True)
    torch.testing.assert_close(res.centroids.norm(dim=1), torch.ones(4), atol=1e-5, rtol=0)


def test_auto_backend_and_inputs():
    x, _ = _blobs(n=100, k=2, d=3)
    assert kmeans(x, 2, iters=2).backend == ("faiss" if HAS_FAISS else "torch")  # auto: faiss when it imports
    assert kmeans(torch.from_numpy(x).double(), 2, iters=2, backend="torch").centroids.dtype == torch.float32


def test_bad_inputs_raise_clearly():
    x = np.random.default_rng(0).normal(size=(10, 3)).astype(np.float32)
    with pytest.raises(ValueError, match="k=11 .* N=10"):
        kmeans(x, 11)
    with pytest.raises(ValueError, match="2-D"):
        kmeans(x[0], 2)
    with pytest.raises(ValueError, match="NaN"):
        kmeans(np.full((10, 3), np.nan, dtype=np.float32), 2)
    with pytest.raises(ValueError, match="backend"):
        kmeans(x, 2, backend="sklearn")
    with pytest.raises(ValueError, match="init_centroids"):
        kmeans(x, 2, init_centroids=np.zeros((3, 3), dtype=np.float32))
    with pytest.raises(ValueError, match="init"):
        kmeans(x, 2, init="kmeans||")


def _split_reference(centroids: torch.Tensor, counts: torch.Tensor) -> int:
    """The one-cluster-at-a-time rule written naively: each empty cluster takes half of the current largest."""
    counts = counts.clone()
    sign = torch.ones(centroids.shape[1])
    sign[1::2] = -1.0
    n = 0
    for ci in torch.nonzero(counts == 0).flatten().tolist():
        cj = int(torch.argmax(counts))
        if counts[cj] < 2:
            break
        base = centroids[cj].clone()
        centroids[ci] = base * (1.0 + sign / 1024.0)
        centroids[cj] = base * (1.0 - sign / 1024.0)
        half = counts[cj] // 2
        counts[ci], counts[cj] = half, counts[cj] - half
        n += 1
    return n


@pytest.mark.parametrize("counts", [
    [5, 0, 7, 0, 3, 9],  # two empties, two distinct donors: the batched path
    [40, 0, 0, 0, 1, 1],  # one donor split three times, a new cluster split again: the in-order path
    [1, 0, 1, 0],  # nothing to split
])
def test_split_empty_clusters_matches_sequential_rule(counts):
    g = torch.Generator().manual_seed(0)
    c = torch.randn(len(counts), 5, generator=g)
    ref = c.clone()
    counts_t = torch.tensor(counts)
    assert split_empty_clusters(c, counts_t) == _split_reference(ref, counts_t)
    assert torch.equal(c, ref)  # bit-identical to the per-cluster loop
    assert counts_t.tolist() == counts  # the caller's counts are not modified
