"""Temperature-paper diagnostics (evaluate.metrics.temperature): the Fig. 1 equilibrium ratio against float64
loops and a closed form, the shuffle, the Fig. 8 histograms against explicit pair lists, the Table 11 token
subsets against per-token loops."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from protoclip.evaluate.metrics.temperature import (
    distance_histograms,
    equilibrium_scale,
    equilibrium_sweep,
    log_mean_ratio,
    shuffle_permutation,
    token_subset_zeroshot,
)


def unit(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def naive_log_mean_ratio(sim, tau):
    """Eq. 1 per positive pair by explicit sums (math.exp, small tau only), mean of the ratios, log."""
    b = len(sim)
    ratios = []
    for i in range(b):
        num = math.exp(tau * sim[i][i])
        den = sum(math.exp(tau * sim[i][j]) for j in range(b) if j != i)
        den += sum(math.exp(tau * sim[j][i]) for j in range(b) if j != i)
        ratios.append(num / den)
    return math.log(sum(ratios) / b)


def test_log_mean_ratio_matches_explicit_sums():
    rng = np.random.default_rng(0)
    sim = rng.uniform(-1, 1, size=(6, 6))
    scales = [0.5, 3.0, 20.0, 150.0]
    got = log_mean_ratio(sim, scales)
    for tau, g in zip(scales, got):
        assert g == pytest.approx(naive_log_mean_ratio(sim.tolist(), tau), rel=1e-10, abs=1e-10)
    assert np.isfinite(log_mean_ratio(sim, [1e5])).all()  # logsumexp: no overflow where exp would


def test_equilibrium_scale_closed_form():
    """B = 2, s = [[a, b], [b, a]]: r = exp(tau a) / (2 exp(tau b)) = 1 at tau* = ln 2 / (a - b)."""
    a, b = 0.8, 0.2
    sim = np.array([[a, b], [b, a]])
    scales = np.geomspace(0.1, 100, 400)
    got = equilibrium_scale(scales, log_mean_ratio(sim, scales))
    assert got == pytest.approx(math.log(2) / (a - b), rel=1e-3)
    assert equilibrium_scale([1.0, 2.0], [0.5, 1.0]) is None  # above 1 from the start: no crossing in the sweep
    assert equilibrium_scale([1.0, 2.0], [-2.0, -1.0]) is None


def test_shuffle_permutation_moves_exactly_the_share():
    rng = np.random.default_rng(1)
    perm = shuffle_permutation(100, 0.05, rng)
    assert sorted(perm.tolist()) == list(range(100))
    assert int((perm != np.arange(100)).sum()) == 5  # every chosen pair gets another pair's text
    assert int((shuffle_permutation(100, 0.004, rng) != np.arange(100)).sum()) == 2  # at least 2 when P > 0
    assert np.array_equal(shuffle_permutation(10, 0.0, rng), np.arange(10))
    with pytest.raises(ValueError, match="share"):
        shuffle_permutation(10, 1.5, rng)


def test_sweep_more_noise_needs_a_larger_scale():
    """The paper's Fig. 1 reading on aligned synthetic pairs: shuffling texts raises tau*; the headline is the
    largest batch without shuffling; a batch larger than the pairs is skipped."""
    rng = np.random.default_rng(2)
    z = unit(rng.normal(size=(300, 16)))
    u, v = unit(z + 0.3 * rng.normal(size=z.shape)), unit(z + 0.3 * rng.normal(size=z.shape))
    out = equilibrium_sweep(u, v, np.geomspace(0.1, 1000, 61), batch_sizes=[64, 256, 1000], shares=[0, 0.2], seed=0)
    assert out["skipped_batch_sizes"] == [1000] and out["equilibrium_batch_size"] == 256
    by = {(r["batch_size"], r["shuffle"]): r for r in out["sweep"]}
    assert set(by) == {(64, 0.0), (64, 0.2), (256, 0.0), (256, 0.2)}
    assert by[(256, 0.2)]["equilibrium_scale"] > by[(256, 0.0)]["equilibrium_scale"]
    assert out["equilibrium_scale"] == by[(256, 0.0)]["equilibrium_scale"]
    # recompute one curve from its batch: the same seeded draw as the function's (rows, then one shuffle per share)
    rng = np.random.default_rng(0)
    rows = np.sort(rng.choice(300, size=64, replace=False))
    shuffle_permutation(64, 0.0, rng)
    perm = shuffle_permutation(64, 0.2, rng)
    sim = u[rows] @ v[rows][perm].T
    assert by[(64, 0.2)]["log_mean_ratio"][10] == pytest.approx(
        naive_log_mean_ratio(sim.tolist(), out["scales"][10]), rel=1e-9)


def test_histograms_count_every_pair_once():
    # hand-built: 3 pairs in 2-D, dot products known
    u = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    v = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    out = distance_histograms(u, v, bins=2)
    assert out["edges"] == pytest.approx([0.0, 0.5, 1.0])
    # positives u_i.v_i = 1, 0, 0; negatives u_i.v_j for (0,1),(0,2),(1,0),(1,2),(2,0),(2,1) = 1, 0, 0, 1, 1, 1
    assert out["pos_image_text"] == [2, 1] and out["neg_image_text"] == [2, 4]
    # u_i.u_j for (0,1),(0,2),(1,2) = 0, 1, 0; v_i.v_j = 1, 0, 0
    assert out["neg_image_image"] == [2, 1] and out["neg_text_text"] == [2, 1]
    assert out["mean_pos_image_text"] == pytest.approx(1 / 3)
    rng = np.random.default_rng(3)
    u, v = unit(rng.normal(size=(40, 5))), unit(rng.normal(size=(40, 5)))
    out = distance_histograms(u, v, bins=7)
    vals = [float(u[i] @ v[j]) for i in range(40) for j in range(40) if i != j]
    assert out["neg_image_text"] == np.histogram(vals, bins=np.array(out["edges"]))[0].tolist()
    assert sum(out["neg_text_text"]) == 40 * 39 // 2 and sum(out["pos_image_text"]) == 40
    assert distance_histograms(u, v, max_points=10)["n_pairs"] == 10


def test_token_subsets_match_per_token_loops():
    rng = np.random.default_rng(4)
    m, n, classes = 4, 3, 5
    y = rng.integers(0, classes, 30)
    raw_w = rng.normal(size=(classes, m, n))
    raw_x = raw_w[y] + 1.5 * rng.normal(size=(30, m, n))
    xs = raw_x / np.linalg.norm(raw_x, axis=2, keepdims=True)
    ws = raw_w / np.linalg.norm(raw_w, axis=2, keepdims=True)
    out = token_subset_zeroshot(xs.reshape(30, -1), ws.reshape(classes, -1), y, tokens=m, sizes=(1, 2, 4, 8),
                                draws=10)
    assert set(out["sizes"]) == {"1", "2"}  # k >= m is not a subset

    def acc(subset):
        hits = 0
        for i in range(30):
            scores = [sum(float(xs[i, k] @ ws[c, k]) for k in subset) for c in range(classes)]
            hits += int(np.argmax(scores) == y[i])
        return 100.0 * hits / 30

    assert out["all"] == pytest.approx(acc(range(m)))
    for k in (1, 2):  # C(4,1) = 4 and C(4,2) = 6 <= 10 draws: every subset
        accs = [acc(s) for s in itertools.combinations(range(m), k)]
        got = out["sizes"][str(k)]
        assert got["n_subsets"] == len(accs)
        assert got["mean"] == pytest.approx(np.mean(accs)) and got["std"] == pytest.approx(np.std(accs, ddof=1))
    few = token_subset_zeroshot(xs.reshape(30, -1), ws.reshape(classes, -1), y, tokens=m, sizes=(2,), draws=3)
    assert few["sizes"]["2"]["n_subsets"] == 3  # random distinct subsets when there are more than `draws`
    with pytest.raises(ValueError, match="must divide"):
        token_subset_zeroshot(xs.reshape(30, -1), ws.reshape(classes, -1), y, tokens=5)


def test_bad_inputs_are_rejected():
    u = np.ones((4, 3))
    with pytest.raises(ValueError, match="same rows"):
        equilibrium_sweep(u, u[:3], [1.0], [2], [0.0])
    with pytest.raises(ValueError, match="increasing"):
        equilibrium_sweep(u, u, [2.0, 1.0], [2], [0.0])
    z = u.copy()
    z[1] = 0
    with pytest.raises(ValueError, match="text has 1 all-zero rows"):
        distance_histograms(u, z)
