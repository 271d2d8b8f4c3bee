"""Linear probes: L-BFGS logistic regression with CLIP-style C search, and the SGD probe."""
from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from protoclip.evaluate.metrics.linear import linear_eval, linear_probe, search_C, sgd_linear_probe, split_validation


def separable(rng, n: int, C: int = 4, d: int = 10):
    y = rng.integers(0, C, n)
    return 5.0 * np.eye(C, d)[y] + 0.3 * rng.normal(size=(n, d)), y


def test_search_C_follows_clip_binary_search():
    calls = []

    def score(C: float) -> float:  # single peak at log10 C = 1.3
        calls.append(C)
        return -(math.log10(C) - 1.3) ** 2

    best, tried = search_C(score, steps_per_decade=4)
    # 7 start points (1e-6, 1e-4, .., 1e6), then 3 halvings (1, 0.5, 0.25 decades) x 2 points
    assert len(calls) == len(tried) == 13
    assert abs(math.log10(best) - 1.3) <= 0.125 + 1e-9  # within half the final step
    best8, tried8 = search_C(score, steps_per_decade=8)
    assert len(tried8) == 15 and abs(math.log10(best8) - 1.3) <= 0.0625 + 1e-9
    assert min(tried) == pytest.approx(1e-6) and max(tried) == pytest.approx(1e6)


def test_search_C_ties_prefer_smaller_C_and_fixed_grid():
    best, tried = search_C(lambda C: 1.0)
    assert best == pytest.approx(1e-6)
    best, tried = search_C(lambda C: -abs(C - 3.0), C_grid=[0.1, 1.0, 3.0, 10.0])
    assert best == pytest.approx(3.0) and len(tried) == 4
    with pytest.raises(ValueError):
        search_C(lambda C: 0.0, C_grid=[0.0, 1.0])


def test_split_validation_is_stratified_and_disjoint():
    y = np.repeat(np.arange(4), 25)
    fit, val = split_validation(y, 0.2, seed=0)
    assert len(val) == 20 and len(np.intersect1d(fit, val)) == 0 and len(fit) + len(val) == 100
    assert np.bincount(y[val]).tolist() == [5, 5, 5, 5]


def test_separable_features_give_100_and_refit_matches_sklearn():
    rng = np.random.default_rng(0)
    xtr, ytr = separable(rng, 200)
    xte, yte = separable(rng, 100)
    out = linear_probe(xtr, ytr, xte, yte)
    assert out["top1"] == 100.0 and out["val_top1"] == 100.0
    assert 1e-6 <= out["C"] <= 1e6
    # the reported accuracy is that of a model refit on the FULL train set with the chosen C
    rng = np.random.default_rng(1)
    xtr, ytr = rng.normal(size=(150, 6)), rng.integers(0, 3, 150)
    xte, yte = rng.normal(size=(80, 6)), rng.integers(0, 3, 80)
    out = linear_probe(xtr, ytr, xte, yte, C_grid=[0.01, 1.0])
    ref = LogisticRegression(C=out["C"], max_iter=1000, random_state=0).fit(xtr, ytr)
    assert out["top1"] == pytest.approx(100 * (ref.predict(xte) == yte).mean())
    # per test image (the claims ledger's bootstrap units): the reference model's hits, the same numbers
    same, hits = linear_probe(xtr, ytr, xte, yte, C_grid=[0.01, 1.0], per_example=True)
    assert same == out
    np.testing.assert_array_equal(hits["top1"], ref.predict(xte) == yte)
    assert out["top1"] == 100.0 * float(hits["top1"].mean())


def test_random_labels_give_chance():
    # test labels independent of everything the probe sees: E[top1] = 1/C = 25%;
    # n_test = 2000 gives std 0.97 points, tolerance 4 points.
    rng = np.random.default_rng(2)
    out = linear_probe(rng.normal(size=(300, 8)), rng.integers(0, 4, 300),
                       rng.normal(size=(2000, 8)), rng.integers(0, 4, 2000), C_grid=[1e-2, 1.0, 1e2])
    assert abs(out["top1"] - 25.0) < 4.0


def test_sgd_probe_separable_and_deterministic():
    rng = np.random.default_rng(3)
    xtr, ytr = separable(rng, 300, C=6)
    xte, yte = separable(rng, 100, C=6)
    a = sgd_linear_probe(xtr, ytr, xte, yte, epochs=5, batch_size=64, show_progress=False)
    b = sgd_linear_probe(xtr, ytr, xte, yte, epochs=5, batch_size=64, show_progress=False)
    assert a["top1"] == 100.0 and a["top5"] == 100.0
    assert a == b
    rng = np.random.default_rng(5)  # overlapping classes: some hits, some misses
    xtr, ytr = rng.normal(size=(300, 6)), rng.integers(0, 6, 300)
    xte, yte = rng.normal(size=(100, 6)) + np.eye(6)[rng.integers(0, 6, 100)], rng.integers(0, 6, 100)
    out, hits = sgd_linear_probe(xtr, ytr, xte, yte, epochs=3, batch_size=64, show_progress=False,
                                 per_example=True)
    assert out == sgd_linear_probe(xtr, ytr, xte, yte, epochs=3, batch_size=64, show_progress=False)
    assert hits["top1"].shape == (100,) and 0 < hits["top1"].sum() < 100 and hits["top5"].sum() >= hits["top1"].sum()
    assert out["top1"] == 100.0 * float(hits["top1"].mean()) and out["top5"] == 100.0 * float(hits["top5"].mean())


def test_linear_eval_dispatches_on_train_size_and_rejects_bad_input():
    rng = np.random.default_rng(4)
    xtr, ytr = separable(rng, 60)
    xte, yte = separable(rng, 20)
    assert "C" in linear_eval(xtr, ytr, xte, yte, C_grid=[1.0])
    assert "final_train_loss" in linear_eval(xtr, ytr, xte, yte, sgd_above=10, epochs=2, show_progress=False)
    with pytest.raises(ValueError, match="single class"):
        linear_probe(xtr, np.zeros(60, int), xte, yte)
    with pytest.raises(ValueError, match="2-D"):
        linear_probe(xtr[:, 0], ytr, xte, yte)


def test_warm_started_search_matches_cold_start_reference():
    # overlapping Gaussian classes (not separable: a finite optimum at every C). The warm-started search must
    # pick the same C as cold-started fits written directly with sklearn, and reach the same test accuracy
    rng = np.random.default_rng(3)
    means = rng.normal(scale=1.5, size=(4, 10))
    y = rng.integers(0, 4, 700)
    x = means[y] + rng.normal(size=(700, 10))
    xtr, ytr, xte, yte = x[:500], y[:500], x[500:], y[500:]
    out = linear_probe(xtr, ytr, xte, yte, max_iter=5000)
    fit_idx, val_idx = split_validation(ytr, 0.2, seed=0)

    def cold_val(C):
        clf = LogisticRegression(C=C, max_iter=5000, tol=1e-8).fit(xtr[fit_idx], ytr[fit_idx])
        return float((clf.predict(xtr[val_idx]) == ytr[val_idx]).mean())

    ref_C, ref_tried = search_C(cold_val)
    assert out["C"] == pytest.approx(ref_C)
    assert out["val_top1"] == pytest.approx(100 * ref_tried[ref_C])
    ref = LogisticRegression(C=ref_C, max_iter=5000, tol=1e-8).fit(xtr, ytr)
    assert out["top1"] == pytest.approx(100 * (ref.predict(xte) == yte).mean(), abs=0.5)
    assert linear_probe(xtr, ytr, xte, yte, max_iter=5000, warm_start=False) == pytest.approx(out, abs=0.5)


def test_warm_start_with_a_class_missing_from_the_fit_split():
    # class 3 has one sample: the stratified split cannot keep it in the fit split, so the final refit on all
    # of train has one class more than the searched fits and must start cold (not from a wrong-shaped coef)
    rng = np.random.default_rng(4)
    y = np.concatenate([rng.integers(0, 3, 59), [3]])
    x = rng.normal(size=(60, 5)) + y[:, None]
    out = linear_probe(x, y, x, y, C_grid=[0.1, 1.0])
    assert 0.0 <= out["top1"] <= 100.0 and out["C"] in (0.1, 1.0)


def offset_gaussians(rng, n: int, k: int = 5, d: int = 16, offset: float = 25.0):
    """Overlapping classes riding on a large common component, like the offline models' un-normalised z^I."""
    means = rng.normal(scale=0.8, size=(k, d))
    common = offset * np.ones(d) / np.sqrt(d)
    y = rng.integers(0, k, n)
    return common + means[y] + rng.normal(size=(n, d)), y


def test_centring_is_an_exact_reparametrisation():
    # the intercept is not penalised, so fits on x and on x - m reach the same optimum: equal coef_, intercepts
    # differing by coef_ @ m, equal predictions (both fitted here to tight convergence)
    rng = np.random.default_rng(5)
    x, y = offset_gaussians(rng, 400)
    m = x.mean(axis=0)
    for C in (0.01, 1.0):
        raw = LogisticRegression(C=C, max_iter=100_000, tol=1e-12).fit(x, y)
        cen = LogisticRegression(C=C, max_iter=100_000, tol=1e-12).fit(x - m, y)
        np.testing.assert_allclose(cen.coef_, raw.coef_, atol=1e-4)
        # the raw fit's intercept rides on the offset-25 direction, the ill-conditioned one: lbfgs stops there
        # ~1e-4 relative short of the optimum, by an amount that differs between BLAS builds / CPUs (seen
        # 2.4e-3 absolute on intercepts ~35 on one instance), so the intercepts are compared relatively
        np.testing.assert_allclose(cen.intercept_ - cen.coef_ @ m, raw.intercept_, rtol=2e-4, atol=1e-3)
        assert (cen.predict(x - m) == raw.predict(x)).all()


def test_centred_probe_matches_the_converged_raw_probe():
    # linear_probe (centred, max_iter 1000) against sklearn on the raw features run to convergence: same
    # validation and test accuracy at each C; the raw fit stopped at 1000 iterations is what centring fixes
    rng = np.random.default_rng(6)
    x, y = offset_gaussians(rng, 900)
    xtr, ytr, xte, yte = x[:600], y[:600], x[600:], y[600:]
    fit_idx, val_idx = split_validation(ytr, 0.2, seed=0)
    for C in (0.1, 10.0):
        out = linear_probe(xtr, ytr, xte, yte, C_grid=[C])
        ref_fit = LogisticRegression(C=C, max_iter=100_000, tol=1e-12).fit(xtr[fit_idx], ytr[fit_idx])
        ref = LogisticRegression(C=C, max_iter=100_000, tol=1e-12).fit(xtr, ytr)
        assert out["val_top1"] == pytest.approx(100 * (ref_fit.predict(xtr[val_idx]) == ytr[val_idx]).mean())
        assert out["top1"] == pytest.approx(100 * (ref.predict(xte) == yte).mean())
    raw = LogisticRegression(C=10.0, max_iter=1000).fit(xtr, ytr)
    cen = LogisticRegression(C=10.0, max_iter=1000).fit(xtr - xtr.mean(axis=0), ytr)
    assert cen.n_iter_[0] < raw.n_iter_[0]  # the conditioning gain, on this fixture


def test_fit_split_with_a_single_class_is_one_clear_error():
    """y = [0, 0, 1] with half held out: the fit split keeps one sample, one class; sklearn would raise from
    deep inside LogisticRegression.fit."""
    x = np.array([[0.0, 1.0], [0.1, 0.9], [1.0, 0.0]])
    with pytest.raises(ValueError, match=r"linear probe: the fit split \(1 of 3 training samples .* single class"):
        linear_probe(x, np.array([0, 0, 1]), x, np.array([0, 0, 1]), val_fraction=0.5)


def test_the_linear_task_searches_C_at_the_configured_resolution(tmp_path, caplog):
    """evaluate.linear.steps_per_decade reaches the probe: CLIP's 8 steps per decade take one halving round more
    than the default 4 (its fits: the points of the rounds before, and 1 or 2 new ones, fewer at the grid's edge)."""
    import logging

    from protoclip.evaluate.adapters import SetInput
    from protoclip.evaluate.config import EvaluateConfig
    from protoclip.evaluate.tasks.linear import LinearConfig, task_linear
    from protoclip.evaluate.set_features import SetFeatures

    rng = np.random.default_rng(0)
    y = np.arange(40) % 2
    z = rng.normal(size=(40, 4)) + y[:, None]
    feats = SetFeatures(test_z=z[:20], test_y=y[:20], train_z=z[20:], train_y=y[20:])
    fits = {}
    for steps in (4, 8):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="protoclip.evaluate.metrics.linear"):
            task_linear(SetInput(feats, None, EvaluateConfig(sections={"linear": LinearConfig(steps_per_decade=steps)}), tmp_path / "f.png"))
        msgs = [r.getMessage() for r in caplog.records if r.getMessage().endswith(" fits")]
        fits[steps] = int(msgs[0].split()[-2])
    assert fits[4] >= 7 and fits[8] - fits[4] in (1, 2), fits
    with pytest.raises(ValueError, match="steps_per_decade must be >= 1"):
        LinearConfig(steps_per_decade=0).validate()
