"""DINO weighted k-NN classifier against a naive per-sample loop and known answers."""
from __future__ import annotations

import math

import numpy as np
import pytest

import protoclip.evaluate.metrics.knn as knn_mod
from protoclip.evaluate.metrics.knn import knn_classifier


def naive_knn(train_x, train_y, test_x, test_y, k, T):
    """One test point at a time: cosine sims, k largest, sum exp(sim/T) per label."""
    hits1, hits5 = [], []
    for x, y in zip(test_x, test_y):
        sims = [float(x @ t / (np.linalg.norm(x) * np.linalg.norm(t))) for t in train_x]
        nearest = sorted(range(len(sims)), key=lambda i: -sims[i])[:k]
        votes: dict[int, float] = {}
        for i in nearest:
            votes[int(train_y[i])] = votes.get(int(train_y[i]), 0.0) + math.exp(sims[i] / T)
        ranked = sorted(votes, key=lambda c: -votes[c])
        assert len(ranked) >= 5, "fixture must give every test point >= 5 voted classes (no zero-vote ties)"
        hits1.append(ranked[0] == y)
        hits5.append(y in ranked[:5])
    n = len(test_y)
    return 100 * sum(hits1) / n, 100 * sum(hits5) / n, np.array(hits1), np.array(hits5)


def test_matches_naive_weighted_vote_and_is_chunk_invariant(monkeypatch):
    rng = np.random.default_rng(0)
    C, d = 6, 10
    centers = rng.normal(size=(C, d))
    train_y = rng.integers(0, C, 300)
    test_y = rng.integers(0, C, 80)
    train_x = centers[train_y] + 3.0 * rng.normal(size=(300, d))
    test_x = centers[test_y] + 3.0 * rng.normal(size=(80, d))
    # k = 30 neighbours over 6 classes: every test point gets >= 5 voted classes (checked in the oracle)
    top1, top5, hits1, hits5 = naive_knn(train_x, train_y, test_x, test_y, k=30, T=0.07)
    for chunk in (7, 1000):
        out = knn_classifier(train_x, train_y, test_x, test_y, k=30, T=0.07, chunk_size=chunk)
        assert out["top1"] == pytest.approx(top1)
        assert out["top5"] == pytest.approx(top5)
        # per test image (the claims ledger's bootstrap units): the naive hits, and the same numbers
        same, hits = knn_classifier(train_x, train_y, test_x, test_y, k=30, T=0.07, chunk_size=chunk,
                                    per_example=True)
        assert same == out
        np.testing.assert_array_equal(hits["top1"], hits1)
        np.testing.assert_array_equal(hits["top5"], hits5)
    # the memory cap on the similarity block only changes the chunking, never the answer
    monkeypatch.setattr(knn_mod, "MAX_SIM_ELEMENTS", 3 * 300)  # -> 3 test rows per chunk
    assert knn_classifier(train_x, train_y, test_x, test_y, k=30, T=0.07) == out
    assert 100 / C + 5 < top1 < 100  # above chance (16.7%) but not trivial


def test_weighting_beats_majority_in_a_hand_built_case():
    # test point along e0; neighbours: one of class 0 at cos 0.99, two of class 1 at cos 0.5.
    # majority vote says class 1; DINO weights: exp(0.99/.07) = 1.4e6 > 2 exp(0.5/.07) = 2.5e3 -> class 0.
    train_x = np.array([[0.99, math.sqrt(1 - 0.99**2), 0.0], [0.5, 0.0, math.sqrt(0.75)], [0.5, 0.0, -math.sqrt(0.75)]])
    out = knn_classifier(train_x, [0, 1, 1], np.array([[1.0, 0.0, 0.0]]), [0], k=3, T=0.07)
    assert out["top1"] == 100.0
    # with a very high temperature the weights become ~equal and the majority (class 1) wins
    out = knn_classifier(train_x, [0, 1, 1], np.array([[1.0, 0.0, 0.0]]), [0], k=3, T=1e6)
    assert out["top1"] == 0.0


def test_separable_gives_100_and_random_gives_chance():
    rng = np.random.default_rng(1)
    C, d = 8, 16
    axes = np.eye(C, d)
    ytr, yte = rng.integers(0, C, 400), rng.integers(0, C, 200)
    xtr = axes[ytr] * rng.uniform(0.5, 5, (400, 1)) + 0.05 * rng.normal(size=(400, d))
    xte = axes[yte] * rng.uniform(0.5, 5, (200, 1)) + 0.05 * rng.normal(size=(200, d))
    assert knn_classifier(xtr, ytr, xte, yte) == {"top1": 100.0, "top5": 100.0}
    # random labels independent of features: E[top1] = 1/C = 12.5%; n_test = 3000 gives std 0.6 points
    ytr, yte = rng.integers(0, C, 2000), rng.integers(0, C, 3000)
    out = knn_classifier(rng.normal(size=(2000, d)), ytr, rng.normal(size=(3000, d)), yte)
    assert abs(out["top1"] - 12.5) < 2.5


def test_k_is_capped_and_inputs_are_checked():
    x = np.eye(3)
    out = knn_classifier(x, [0, 1, 2], x, [0, 1, 2], k=20)  # k > N_train
    assert out == {"top1": 100.0}  # 3 classes: no top5
    with pytest.raises(ValueError, match="num_classes"):
        knn_classifier(x, [0, 1, 2], x, [0, 1, 2], num_classes=2)
    with pytest.raises(ValueError, match="dimension"):
        knn_classifier(x, [0, 1, 2], np.eye(4), [0, 1, 2, 0])
    with pytest.raises(ValueError, match="NaN"):
        knn_classifier(np.full((3, 3), np.nan), [0, 1, 2], x, [0, 1, 2])


def test_small_temperature_does_not_overflow_in_float32():
    # DINO's exp(cos / T) is inf in float32 for T < 1 / 88.7: every vote is inf and the ranking arbitrary.
    import torch
    assert torch.isinf(torch.tensor(1.0 / 0.01, dtype=torch.float32).exp())  # the premise
    rng = np.random.default_rng(4)
    C, d = 6, 10
    centers = rng.normal(size=(C, d))
    train_y, test_y = rng.integers(0, C, 300), rng.integers(0, C, 80)
    train_x = centers[train_y] + 3.0 * rng.normal(size=(300, d))
    test_x = centers[test_y] + 3.0 * rng.normal(size=(80, d))
    for T in (0.01, 0.005):
        top1, top5, _, _ = naive_knn(train_x, train_y, test_x, test_y, k=60, T=T)  # Python floats (float64)
        out = knn_classifier(train_x.astype(np.float32), train_y, test_x.astype(np.float32), test_y, k=60, T=T)
        assert out["top1"] == pytest.approx(top1) and out["top5"] == pytest.approx(top5)
    # the votes of one chunk are finite and the best class of each row has weight >= 1
    import torch.nn.functional as F
    xtr = F.normalize(torch.tensor(train_x, dtype=torch.float32), dim=1)
    xte = F.normalize(torch.tensor(test_x, dtype=torch.float32), dim=1)
    votes = knn_mod.knn_votes(xtr, torch.tensor(train_y), xte, 30, 0.001, C)
    assert torch.isfinite(votes).all() and (votes.max(dim=1).values >= 1).all()


def test_all_zero_feature_rows_are_rejected():
    x = np.eye(3)
    bad = x.copy()
    bad[1] = 0.0
    with pytest.raises(ValueError, match=r"train_x has 1 all-zero rows \(first: \[1\]\)"):
        knn_classifier(bad, [0, 1, 2], x, [0, 1, 2])
    with pytest.raises(ValueError, match="test_x has 1 all-zero rows"):
        knn_classifier(x, [0, 1, 2], bad, [0, 1, 2])
