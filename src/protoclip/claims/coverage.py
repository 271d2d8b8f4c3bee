"""How often the ledger's intervals cover a known truth: simulated pairs of run families, their intervals computed
exactly as the ledger computes them (protoclip.claims.intervals on protoclip.claims.bootstrap's draws) and, for
comparison, the two-level percentile bootstrap. bench/bench_claims_coverage.py prints the table;
tests/unit/test_claims_intervals.py pins a small version.
"""
from __future__ import annotations

import math

import numpy as np
from scipy import stats

from protoclip.claims.bootstrap import Component, Units, percentile_interval, resample, resample_runs
from protoclip.claims.intervals import combine

NOISES = ("seed", "examples", "both")
METHODS = ("ledger", "percentile")  # the ledger's interval; the two-level percentile bootstrap it replaced
MU = (0.45, 0.35)  # probit means of a and b: accuracies about 62 % and 60 %
SEED_SD = 1.0  # points, `seed` model
SEED_SHIFT = 0.05  # probit, `both` model


def truth(noise: str) -> float:
    """The true difference a - b in points: 0 for ``seed``; in the probit models 100 * (Phi(mu_a / k) -
    Phi(mu_b / k)), k = sqrt(1 + 1 + sigma_s^2), the family's accuracy over test sets and seeds."""
    if noise == "seed":
        return 0.0
    k = math.sqrt(2.0 + (SEED_SHIFT ** 2 if noise == "both" else 0.0))
    return 100.0 * (stats.norm.cdf(MU[0] / k) - stats.norm.cdf(MU[1] / k))


def families(noise: str, seeds: int, rng: np.random.Generator, n_examples: int) -> Component:
    """One simulated pair of families of ``seeds`` runs each, under one of three kinds of noise:

    * ``seed``: each seed run's value is mu_f + sigma * N(0, 1) (sigma = 1 point), no example noise (every example
      resample gives the run's value);
    * ``examples``: a test set of ``n_examples`` examples with difficulties z_i ~ N(0, 1), the same for both
      families (paired); run r of family f hits example i when mu_f + z_i + e_ri > 0, e ~ N(0, 1) (each run its
      own seed-by-example noise, no seed shift);
    * ``both``: as ``examples`` with a seed shift sigma_s * N(0, 1) per run (probit scale, about 1.4 points)."""
    if noise == "seed":
        runs = [[Units.mean(np.full(2, rng.normal(0.0, SEED_SD)), scale=1.0) for _ in range(seeds)]
                for _ in range(2)]
        return Component(runs[0], runs[1], key="sim")
    z = rng.standard_normal(n_examples)
    shift = SEED_SHIFT if noise == "both" else 0.0
    runs = [[Units.mean(mu + shift * rng.standard_normal() + z + rng.standard_normal(n_examples) > 0)
             for _ in range(seeds)] for mu in MU]
    return Component(runs[0], runs[1], key="sim")


def interval(comp: Component, method: str, n_resamples: int, seed: int, confidence: float
             ) -> tuple[float, float]:
    if method == "percentile":
        a, b = resample([comp], n_resamples, seed)
        return percentile_interval((a - b)[0], confidence)
    (da, db), = resample_runs([comp], n_resamples, seed)
    pa = np.array([u.value()[0] for u in comp.a])
    pb = np.array([u.value()[0] for u in comp.b])
    return combine(pa, pb, da, db, "difference").interval(confidence)


def coverage(noise: str, seeds: int, reps: int, method: str = "ledger", n_examples: int = 300,
             n_resamples: int = 400, confidence: float = 0.95, seed: int = 0) -> float:
    """The share of ``reps`` simulated intervals that contain the truth (:func:`truth`):
    ``coverage("both", seeds=3, reps=2000)`` for the ledger's 95 % intervals."""
    if noise not in NOISES or method not in METHODS:
        raise ValueError(f"noise in {NOISES}, method in {METHODS}")
    rng = np.random.default_rng([seed, seeds, NOISES.index(noise)])
    true = truth(noise)
    hit = 0
    for r in range(reps):
        lo, hi = interval(families(noise, seeds, rng, n_examples), method, n_resamples, r, confidence)
        hit += lo <= true <= hi
    return hit / reps


__all__ = ["coverage", "truth", "families", "NOISES", "METHODS"]
