"""The claims ledger's bootstrap (protoclip.claims.bootstrap) against scipy, a naive loop and closed forms."""
from __future__ import annotations

import os
import zlib

import numpy as np
import pytest
from scipy import stats

from protoclip.claims.bootstrap import (
    Component,
    MutualInfo,
    RandIndex,
    Units,
    in_processes,
    percentile_interval,
    point,
    resample,
    stream,
)


def planted_pair(n: int, p_a: float, p_b: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Two runs' hits on the same n test images, accuracies exactly p_a and p_b (shuffled independently)."""
    rng = np.random.default_rng(seed)
    a = rng.permutation(np.arange(n) < round(p_a * n))
    b = rng.permutation(np.arange(n) < round(p_b * n))
    return a, b


def test_one_seed_paired_difference_is_scipys_percentile_bootstrap_to_the_bit():
    a, b = planted_pair(300, 0.6, 0.5, seed=1)
    A, B = resample([Component([Units.mean(a)], [Units.mean(b)], key="digits")], n_resamples=500, seed=7)
    lo, hi = percentile_interval((A - B).mean(0), 0.95)
    assert stream(7, "examples/digits").integers(0, 10, 5).tolist() == \
        np.random.default_rng([7, zlib.crc32(b"examples/digits")]).integers(0, 10, 5).tolist()
    ref = stats.bootstrap((a.astype(float), b.astype(float)),
                          lambda x, y, axis: 100 * (x.mean(axis=axis) - y.mean(axis=axis)), paired=True,
                          vectorized=True, method="percentile", n_resamples=500,
                          rng=stream(7, "examples/digits"))
    assert (lo, hi) == pytest.approx((ref.confidence_interval.low, ref.confidence_interval.high), rel=1e-12)
    np.testing.assert_allclose((A - B)[0], ref.bootstrap_distribution, rtol=1e-12, atol=1e-12)


def naive(components, n_resamples, seed):
    """The documented draws (named streams), one resample and one unit at a time (no counts, no products)."""
    draws = []
    for c, comp in enumerate(components):
        key = f"examples/{comp.key or c}"
        if comp.paired:
            idx = stream(seed, key).integers(0, comp.a[0].n, (n_resamples, comp.a[0].n))
            draws.append(([idx] * len(comp.a), [idx] * len(comp.b)))
        else:
            da = [stream(seed, f"{key}/a{j}").integers(0, u.n, (n_resamples, u.n)) for j, u in enumerate(comp.a)]
            db = [stream(seed, f"{key}/b{j}").integers(0, u.n, (n_resamples, u.n)) for j, u in enumerate(comp.b)]
            draws.append((da, db))
    na, nb = len(components[0].a), len(components[0].b)
    sa = stream(seed, "seeds/a").integers(0, na, (n_resamples, na)) if na > 1 else np.zeros((n_resamples, 1), int)
    sb = stream(seed, "seeds/b").integers(0, nb, (n_resamples, nb)) if nb > 1 else np.zeros((n_resamples, 1), int)

    def value(u, rows):
        total = 0.0
        for t in range(u.num.shape[0]):
            num = sum(u.num[t, i] for i in rows)
            den = sum(u.den[t, i] for i in rows)
            total += u.coef[t] * num / den
        return total

    out_a = np.zeros((len(components), n_resamples))
    out_b = np.zeros((len(components), n_resamples))
    for c, comp in enumerate(components):
        for r in range(n_resamples):
            out_a[c, r] = np.mean([value(comp.a[s], draws[c][0][s][r]) for s in sa[r]])
            if nb:
                out_b[c, r] = np.mean([value(comp.b[s], draws[c][1][s][r]) for s in sb[r]])
    return out_a, out_b


def test_hierarchical_seeds_several_components_ratios_and_unpaired_units_match_a_naive_loop():
    rng = np.random.default_rng(0)
    # component 1: 3 seeds vs 2 seeds on the same 12 test images (accuracy)
    c1 = Component([Units.mean(rng.random(12) < 0.6) for _ in range(3)],
                   [Units.mean(rng.random(12) < 0.4) for _ in range(2)])
    # component 2: a two-term ratio statistic (recall-like: per image hits / captions) on 7 shared units
    caps = rng.integers(1, 4, 7)

    def two_terms():
        return Units(np.stack([rng.random(7) < 0.5, rng.integers(0, 4, 7).clip(max=caps)]),
                     np.stack([np.ones(7), caps]), np.array([50.0, 50.0]))

    c2 = Component([two_terms() for _ in range(3)], [two_terms() for _ in range(2)])
    # component 3: unpaired units (episode times), each run its own number of units
    c3 = Component([Units(rng.random((1, n)), np.ones((1, n)), np.array([1.0])) for n in (5, 6, 5)],
                   [Units(rng.random((1, n)), np.ones((1, n)), np.array([1.0])) for n in (4, 5)], paired=False)
    comps = [c1, c2, c3]
    A, B = resample(comps, n_resamples=40, seed=3)
    nA, nB = naive(comps, 40, 3)
    np.testing.assert_allclose(A, nA, rtol=1e-12)
    np.testing.assert_allclose(B, nB, rtol=1e-12)
    # the draw counts kept in a cache give the same resamples; a set under its own key is drawn the same way
    cache = {}
    A2, B2 = resample(comps, n_resamples=40, seed=3, cache=cache)
    A3, _ = resample(comps, n_resamples=40, seed=3, cache=cache)
    assert len(cache) == 2 and np.array_equal(A, A2) and np.array_equal(B, B2) and np.array_equal(A, A3)
    keyed = [Component(c1.a, c1.b, key="s"), Component(c1.a, c1.b, key="s"), Component(c1.a, c1.b, key="t")]
    K, _ = resample(keyed, n_resamples=40, seed=3)
    assert np.array_equal(K[0], K[1]) and not np.array_equal(K[0], K[2])
    # without resampling: each family's mean over seeds of its full-data value
    pa, pb = point(comps)
    assert pa[0] == pytest.approx(np.mean([100 * u.num.mean() for u in c1.a]))
    assert pb[2] == pytest.approx(np.mean([u.num.mean() for u in c3.b]))


def test_paired_interval_matches_the_closed_form_of_a_difference_of_two_proportions():
    """Same test images: Var(p_a - p_b) = (p10 + p01 - (p10 - p01)^2) / n (McNemar's / the paired Wald form);
    independent runs (unpaired): p_a (1 - p_a) / n_a + p_b (1 - p_b) / n_b. 95 % Wald intervals vs the
    bootstrap's, n = 4000: the half-widths agree within 6 % (Monte-Carlo error of 4000 resamples ~2 %)."""
    n = 4000
    a, b = planted_pair(n, 0.62, 0.58, seed=4)
    A, B = resample([Component([Units.mean(a)], [Units.mean(b)])], n_resamples=4000, seed=0)
    lo, hi = percentile_interval((A - B)[0], 0.95)
    p10, p01 = np.mean(a & ~b), np.mean(~a & b)
    half = 100 * 1.959964 * np.sqrt((p10 + p01 - (p10 - p01) ** 2) / n)
    assert (hi - lo) / 2 == pytest.approx(half, rel=0.06)
    assert (lo + hi) / 2 == pytest.approx(4.0, abs=0.15 * half)
    A, B = resample([Component([Units.mean(a)], [Units.mean(b)], paired=False)], n_resamples=4000, seed=0)
    lo, hi = percentile_interval((A - B)[0], 0.95)
    half = 100 * 1.959964 * np.sqrt(0.62 * 0.38 / n + 0.58 * 0.42 / n)
    assert (hi - lo) / 2 == pytest.approx(half, rel=0.06)


def test_planted_difference_is_found_and_an_identical_pair_is_zero():
    a, b = planted_pair(2000, 0.55, 0.50, seed=5)
    A, B = resample([Component([Units.mean(a)], [Units.mean(b)])], n_resamples=2000, seed=1)
    lo, hi = percentile_interval((A - B)[0])
    assert 0 < lo < 5.0 < hi < 10  # +5 points planted: excluded 0, contains the truth
    A, B = resample([Component([Units.mean(a)], [Units.mean(a)])], n_resamples=500, seed=1)
    assert percentile_interval((A - B)[0]) == (0.0, 0.0)


def test_seed_spread_widens_the_interval():
    """Three seeds at 50 / 60 / 70 % vs three at 60 % each (every seed its own random hits), the same mean
    difference to a 50 % baseline: the seed level of the hierarchical bootstrap adds the spread of the seeds."""
    base = [Units.mean(planted_pair(3000, 0.5, 0.5, seed=50)[0])]
    spread = [Units.mean(planted_pair(3000, p, 0.5, seed=60 + i)[0]) for i, p in enumerate((0.5, 0.6, 0.7))]
    flat = [Units.mean(planted_pair(3000, 0.6, 0.5, seed=70 + i)[0]) for i in range(3)]
    widths = {}
    for name, family in (("spread", spread), ("flat", flat)):
        A, B = resample([Component(family, base)], n_resamples=2000, seed=0)
        lo, hi = percentile_interval((A - B)[0])
        widths[name] = hi - lo
        assert lo < 10.0 < hi
    assert widths["spread"] > 3 * widths["flat"]  # seed sd 10 points vs an example-level sd of ~1.2


def test_rand_index_of_a_resample_is_sklearns_ari_of_the_repeated_images():
    """ARI under draw counts w equals sklearn's adjusted_rand_score on the arrays holding each image w times."""
    from sklearn.metrics import adjusted_rand_score

    rng = np.random.default_rng(8)
    labels = rng.integers(0, 6, 250)
    cluster = np.where(rng.random(250) < 0.7, (labels + 1) % 6, rng.integers(0, 6, 250))  # relabelled + noise
    ri = RandIndex(cluster, labels)
    assert ri.value()[0] == pytest.approx(adjusted_rand_score(labels, cluster), rel=1e-12)
    idx = rng.integers(0, 250, (5, 250))
    counts = np.stack([np.bincount(i, minlength=250) for i in idx]).astype(float)
    want = [adjusted_rand_score(labels[i], cluster[i]) for i in idx]
    np.testing.assert_allclose(ri.value(counts), want, rtol=1e-12)
    # paired with another run's assignments on the same images: one draw for both, as for hits
    other = RandIndex(labels.copy(), labels)
    A, B = resample([Component([ri], [other], key="clusters")], n_resamples=50, seed=2)
    lo, hi = percentile_interval((A - B)[0])
    assert lo < ri.value()[0] - 1.0 < hi < 0  # a perfect clustering beats this one on every resample
    assert (B == 1.0).all()


def test_mutual_info_of_a_resample_is_sklearns_ami_of_the_repeated_images():
    """AMI under draw counts w equals sklearn's adjusted_mutual_info_score on the arrays holding each image w times
    (its expected mutual information recomputed for each resample's marginals), the special cases included."""
    from sklearn.metrics import adjusted_mutual_info_score

    rng = np.random.default_rng(9)
    labels = rng.integers(0, 7, 300)
    cluster = np.where(rng.random(300) < 0.6, (labels + 2) % 7, rng.integers(0, 9, 300))  # relabelled + noise
    mi = MutualInfo(cluster, labels)
    assert mi.value()[0] == pytest.approx(adjusted_mutual_info_score(labels, cluster), rel=1e-12)
    idx = rng.integers(0, 300, (6, 300))
    idx[0] = np.where(labels[idx[0]] == 3, idx[0][0], idx[0])  # a resample without some classes
    counts = np.stack([np.bincount(i, minlength=300) for i in idx]).astype(float)
    want = [adjusted_mutual_info_score(labels[i], cluster[i]) for i in idx]
    np.testing.assert_allclose(mi.value(counts), want, rtol=1e-10)
    one = np.zeros(300)
    one[[0, 1]] = 1.0  # two images drawn: sklearn's own special cases (one class or one cluster, or both)
    assert mi.value(one[None])[0] == adjusted_mutual_info_score(labels[[0, 1]], cluster[[0, 1]])
    assert MutualInfo(labels.copy(), labels).value()[0] == pytest.approx(1.0)
    # its cost, known without timing: the terms of sklearn's expected-mutual-information loop, counted naively
    a, b = np.bincount(labels), np.bincount(cluster)
    assert mi.emi_terms == sum(len(range(max(1, ai + bj - 300), min(ai, bj) + 1)) for ai in a if ai for bj in b if bj)


def test_mutual_info_resamples_split_over_processes_give_the_one_process_values_to_the_bit(monkeypatch):
    """With workers, a call's resamples go to forked processes in blocks (each its own pid) and come back in
    order: the values equal the single process's exactly; below PARALLEL_MIN_TERMS the call stays in-process."""
    import protoclip.claims.bootstrap as bootstrap

    pids = in_processes(lambda rows: np.full(len(rows), float(os.getpid())), np.zeros((5, 2)), 2)
    assert len(set(pids[:2])) == 1 and len(set(pids[2:])) == 1  # blocks of 2 and 3 rows, in order
    assert len(set(pids)) == 2 and os.getpid() not in pids
    rng = np.random.default_rng(4)
    labels = rng.integers(0, 6, 400)
    cluster = np.where(rng.random(400) < 0.5, labels, rng.integers(0, 8, 400))
    counts = np.stack([np.bincount(i, minlength=400) for i in rng.integers(0, 400, (7, 400))]).astype(float)
    serial = MutualInfo(cluster, labels).value(counts)
    calls = []
    monkeypatch.setattr(bootstrap, "in_processes", lambda *a: calls.append(a[2]) or in_processes(*a))
    assert np.array_equal(MutualInfo(cluster, labels, workers=3).value(counts), serial) and calls == []
    monkeypatch.setattr(bootstrap, "PARALLEL_MIN_TERMS", 0)
    assert np.array_equal(MutualInfo(cluster, labels, workers=3).value(counts), serial) and calls == [3]


def test_a_failing_or_dying_worker_is_an_error_in_the_parent_not_a_hang():
    def fails(rows):
        if rows[0, 0] > 0:
            raise ValueError("block two broke")
        return rows[:, 0]

    def dies(rows):
        if rows[0, 0] > 0:
            os._exit(3)
        return rows[:, 0]

    rows = np.array([[0.0], [0.0], [1.0], [1.0]])
    with pytest.raises(RuntimeError, match="(?s)failed.*ValueError: block two broke"):
        in_processes(fails, rows, 2)
    with pytest.raises(RuntimeError, match="ended without a result"):
        in_processes(dies, rows, 2)
    assert np.array_equal(in_processes(lambda r: r[:, 0] * 2, rows, 8), [0, 0, 2, 2])  # more workers than rows


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="same units"):
        Component([Units.mean(np.ones(3))], [Units.mean(np.ones(4))])
    with pytest.raises(ValueError, match="terms"):
        Units(np.ones((1, 3)), np.ones((2, 3)), np.ones(1))
    with pytest.raises(ValueError, match="positive sum"):
        Units(np.ones((1, 3)), np.zeros((1, 3)), np.ones(1))
    with pytest.raises(ValueError, match="confidence"):
        percentile_interval(np.arange(3.0), 1.5)
    with pytest.raises(ValueError, match="RandIndex"):
        RandIndex(np.zeros(3, int), np.zeros(4, int))
    with pytest.raises(ValueError, match="MutualInfo"):
        MutualInfo(np.zeros(3, int), np.zeros(4, int))
    with pytest.raises(ValueError, match="n_resamples"):
        resample([Component([Units.mean(np.ones(3))])], n_resamples=0)
