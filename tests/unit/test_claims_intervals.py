"""The ledger's intervals (protoclip.claims.intervals): known answers at their limits (the examples' percentile
interval with one seed a side, the pooled two-sample t interval without example noise), coverage near nominal
at few seeds where the two-level percentile bootstrap falls short (a small version of
bench/bench_claims_coverage.py), the p-value's agreement with the interval, and the seeds "what it would take"
names giving their power."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from protoclip.claims.bootstrap import Component, Units, percentile_interval, resample, resample_runs
from protoclip.claims.coverage import coverage
from protoclip.claims.intervals import POWER, combine, pooled_seed_variance


def hits(n: int, p: float, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random(n) < p


def runs_of(comp: Component, n_resamples: int = 2000, seed: int = 0):
    (da, db), = resample_runs([comp], n_resamples, seed)
    pa = np.array([u.value()[0] for u in comp.a])
    pb = np.array([u.value()[0] for u in comp.b]) if comp.b else None
    return pa, pb, da, db


def test_one_seed_a_side_is_the_examples_percentile_interval_and_says_so():
    comp = Component([Units.mean(hits(500, 0.6, 1))], [Units.mean(hits(500, 0.5, 2))], key="digits")
    est = combine(*runs_of(comp), "difference")
    a, b = resample([comp], 2000, 0)
    assert est.interval(0.95) == pytest.approx(percentile_interval((a - b)[0], 0.95), rel=1e-12)
    assert est.interval(0.90) == pytest.approx(percentile_interval((a - b)[0], 0.90), rel=1e-12)
    assert not est.seed_measured and est.seed_note == "examples only, seed spread not measured"


def test_identical_seeds_add_nothing_to_the_one_seed_interval():
    one = hits(400, 0.6, 3)
    base = Units.mean(hits(400, 0.5, 4))
    single = combine(*runs_of(Component([Units.mean(one)], [base], key="s")), "difference")
    triple = combine(*runs_of(Component([Units.mean(one)] * 3, [base] * 2, key="s")), "difference")
    assert triple.seed_measured and triple.interval() == pytest.approx(single.interval(), rel=1e-12)


def test_without_example_noise_it_is_the_pooled_two_sample_t_interval():
    """Runs whose value does not depend on the examples: the interval is scipy's equal-variance t interval."""
    va, vb = np.array([61.0, 62.5, 60.2]), np.array([59.1, 60.4])
    comp = Component([Units.mean(np.full(3, v), scale=1.0) for v in va],
                     [Units.mean(np.full(3, v), scale=1.0) for v in vb], key="flat")
    est = combine(*runs_of(comp, 200), "difference")
    ref = stats.ttest_ind(va, vb, equal_var=True)
    for conf in (0.95, 0.90):
        ci = ref.confidence_interval(conf)
        assert est.interval(conf) == pytest.approx((ci.low, ci.high), rel=1e-9)
    # one side with one seed: its spread is the other side's (pooled with its degrees of freedom)
    est = combine(*runs_of(Component(comp.a, comp.b[:1], key="flat"), 200), "difference")
    half = stats.t.ppf(0.975, 2) * np.sqrt(np.var(va, ddof=1) * (1 / 3 + 1))
    assert est.interval() == pytest.approx((va.mean() - vb[0] - half, va.mean() - vb[0] + half), rel=1e-9)
    assert est.seed_note == "b: 1 seed, its seed spread taken from a"


def test_a_seed_spread_from_other_runs_gives_the_pooled_t_interval():
    """One seed a side, no example noise: with the seed variance pooled over other repeated runs of the task
    combined, the interval is the difference -+ t_df * sqrt(s2_pooled * (1/1 + 1/1)), df those runs' n - 1
    summed; the estimate says where the spread came from, and no longer counts as its own spread."""
    groups = [np.array([61.0, 62.5, 60.2]), np.array([59.1, 60.4]), np.array([70.0])]
    s2 = (2 * np.var(groups[0], ddof=1) + 1 * np.var(groups[1], ddof=1)) / 3  # the singleton adds nothing
    assert pooled_seed_variance(groups) == (pytest.approx(s2, rel=1e-12), 3)
    assert pooled_seed_variance([np.array([1.0]), np.array([2.0])]) == (0.0, 0)
    comp = Component([Units.mean(np.full(3, 61.0), scale=1.0)], [Units.mean(np.full(3, 59.1), scale=1.0)],
                     key="flat")
    one = combine(*runs_of(comp, 200), "difference")
    assert not one.seed_measured and one.interval() == pytest.approx((1.9, 1.9), abs=1e-9)
    est = one.with_seed_spread(s2, 3, "linear top1 of x (3 seeds), y (2 seeds)")
    half = stats.t.ppf(0.975, 3) * np.sqrt(2 * s2)
    assert est.interval() == pytest.approx((1.9 - half, 1.9 + half), rel=1e-9)
    assert est.seed_measured and not est.seed_own and est.seed_note.startswith("seed spread combined from linear")
    with pytest.raises(ValueError, match="measured"):
        est.with_seed_spread(s2, 3, "again")


def test_an_extra_variance_term_combines_by_welch_satterthwaite():
    """A k-means initialisations' variance v (df k) added to a one-seed-a-side estimate: half-widths
    t_nu * sqrt(u_ex^2 + v), u_ex the examples' percentile half-width / z, nu = (u_ex^2 + v)^2 / (v^2 / k)."""
    comp = Component([Units.mean(hits(500, 0.6, 1))], [Units.mean(hits(500, 0.5, 2))], key="digits")
    est = combine(*runs_of(comp), "difference")
    a, b = resample([comp], 2000, 0)
    lo_p, hi_p = percentile_interval((a - b)[0], 0.95)
    z = stats.norm.ppf(0.975)
    v, k = 4.0, 9
    wide = est.with_term(v, k, "inits")
    want = []
    for sign, u_ex in ((-1, (est.point - lo_p) / z), (1, (hi_p - est.point) / z)):
        total = u_ex ** 2 + v
        want.append(est.point + sign * stats.t.ppf(0.975, total ** 2 / (v ** 2 / k)) * np.sqrt(total))
    assert wide.interval() == pytest.approx(tuple(want), rel=1e-9)
    assert not wide.seed_measured and wide.seed_note.endswith("; inits")


def test_ratio_of_one_run_each_is_the_percentile_interval_of_the_ratio():
    rng = np.random.default_rng(5)
    a = Units.mean(rng.gamma(20, 0.07, 12), scale=1.0)
    b = Units.mean(rng.gamma(20, 0.05, 12), scale=1.0)
    comp = Component([a], [b], paired=False, key="episodes")
    pa, pb, da, db = runs_of(comp)
    est = combine(pa, pb, da, db, "overhead")
    draws = 100 * (da[0] / db[0] - 1)
    assert est.point == pytest.approx(100 * (pa[0] / pb[0] - 1))
    assert est.interval() == pytest.approx(percentile_interval(draws), rel=1e-12)


def test_the_p_value_agrees_with_the_interval():
    rng = np.random.default_rng(7)
    for trial in range(12):
        shift = rng.uniform(-0.08, 0.08)
        comp = Component([Units.mean(hits(300, 0.5 + shift, 10 * trial + s)) for s in range(3)],
                         [Units.mean(hits(300, 0.5, 10 * trial + 5 + s)) for s in range(2)], key="p")
        est = combine(*runs_of(comp, 500), "difference")
        lo, hi = est.interval(0.95)
        assert (est.p_one_sided(+1) < 0.025) == (lo > 0)
        assert (est.p_one_sided(-1) < 0.025) == (hi < 0)


@pytest.mark.parametrize("noise, seeds, reps", [("seed", 2, 400), ("seed", 3, 400), ("both", 3, 200)])
def test_coverage_is_near_nominal_at_few_seeds(noise, seeds, reps):
    """The simulated 95 % intervals contain the known truth 92-98 % of the time (binomial sd at 400 draws: 1.1
    points); the two-level percentile bootstrap they replace falls well short with seed noise."""
    assert 0.92 <= coverage(noise, seeds, reps, n_resamples=300) <= 0.98
    if noise == "seed":
        assert coverage(noise, seeds, reps, method="percentile", n_resamples=300) < 0.86


def test_one_seed_covers_only_the_examples():
    assert coverage("seed", 1, 50) == 0.0  # seed noise alone: a one-seed interval has width 0


def test_seeds_needed_give_the_power_they_promise():
    """The seeds "what it would take" names: simulated experiments of that many seeds a side (seed noise sd 1,
    true difference 1.5) reach the paper's side about 80 % of the time, three fewer seeds clearly less often."""
    va, vb = np.array([0.3, -0.8, 1.1]), np.array([0.2, -1.0, 0.4])
    flat = Component([Units.mean(np.full(2, v), scale=1.0) for v in va],
                     [Units.mean(np.full(2, v), scale=1.0) for v in vb], key="plan")
    est = combine(*runs_of(flat, 50), "difference")
    sd = np.sqrt(est.seed_var[0])
    n, k = est.seeds_needed(1.5 * sd)
    assert k == 1.0 and 6 <= n <= 12
    assert est.seeds_needed(1.5 * sd, alpha=0.0125)[0] > n  # a stricter level (a count's Holm step) takes more

    def power(n: int, reps: int = 1500) -> float:
        rng = np.random.default_rng(n)
        hit = 0
        for _ in range(reps):
            a, b = 1.5 + rng.standard_normal(n), rng.standard_normal(n)
            d = np.zeros((n, 1))
            lo, _ = combine(a, b, d + a[:, None], d + b[:, None], "difference").interval()
            hit += lo > 0
        return hit / reps

    assert power(n) >= POWER - 0.03 and power(n - 3) < POWER - 0.08


def test_when_the_test_set_is_the_limit_more_examples_are_named():
    """Two families that disagree on many of 200 test examples but whose seeds differ in one example each: the
    test set's variance (sd ~5 points) dwarfs the seeds', so half a point needs more test examples."""
    rng = np.random.default_rng(11)
    base_a, base_b = rng.random(200) < 0.5, rng.random(200) < 0.5

    def seed_of(base: np.ndarray) -> Units:
        h = base.copy()
        h[rng.integers(200)] ^= True
        return Units.mean(h)

    comp = Component([seed_of(base_a) for _ in range(3)], [seed_of(base_b) for _ in range(3)], key="small")
    est = combine(*runs_of(comp, 1000), "difference")
    n, k = est.seeds_needed(0.5)
    assert k > 10 and n is not None and n < 50
    assert est.seeds_needed(0.5, max_seeds=1)[0] is None


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="unknown statistic"):
        combine([1.0], [1.0], [[1.0]], [[1.0]], "mean")
    with pytest.raises(ValueError, match="one row of example resamples per seed"):
        combine([1.0, 2.0], [1.0], [[1.0]], [[1.0]], "difference")
