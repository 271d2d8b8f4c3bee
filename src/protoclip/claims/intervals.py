"""Intervals over few seeds and many test examples: the seed level with a small-sample (t) correction combined with
the example-level bootstrap, one-sided p-values, Holm's adjustment and the seeds a claim would need. Not the
two-level percentile bootstrap, which undercovers at 2-5 seeds. The method and why:
docs/claims.md#protoclipclaimsintervals.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

STATS = ("difference", "ratio", "overhead", "single")
POWER = 0.8  # the power "what it would take" asks for


def _value(stat: str, a: float, b: float | None) -> float:
    if stat == "difference":
        return a - b
    if stat == "ratio":
        return 100.0 * a / b
    if stat == "overhead":
        return 100.0 * (a / b - 1.0)
    return a


def _gradient(stat: str, a: float, b: float | None) -> tuple[float, float]:
    if stat == "difference":
        return 1.0, -1.0
    if stat in ("ratio", "overhead"):
        return 100.0 / b, -100.0 * a / (b * b)
    return 1.0, 0.0


@dataclass
class Estimate:
    """A statistic with its example-level bootstrap and its seed-level variance terms (:func:`combine`; the method:
    docs/claims.md#protoclipclaimsintervals)."""
    point: float
    draws: np.ndarray  # [B] the statistic under the example resamples, every seed kept
    shrink: float  # the share of the bootstrap variance that is the test set's (not seed-by-example), in [0, 1]
    seed_terms: list[tuple[float, float]]  # (variance of the statistic, degrees of freedom) per seed term
    seeds: tuple[int, int]  # seeds of a and b (b: 0 for a one-family statistic)
    seed_var: tuple[float, float]  # each family's per-seed variance on the statistic's scale (g_f^2 var(p_f))
    seed_note: str = ""  # "" | "examples only, seed spread not measured" | "b's seed spread borrowed from a"
    seed_source: str = ""  # where a seed spread not measured on these runs came from (:meth:`with_seed_spread`)
    extra_terms: list[tuple[float, float]] = field(default_factory=list)  # (variance, df): e.g. k-means inits

    @property
    def seed_measured(self) -> bool:
        """A seed level is in the interval (these runs' own, or one combined from other runs of the same task)."""
        return bool(self.seed_terms)

    @property
    def seed_own(self) -> bool:
        """The seed level is these runs' own spread (a magnitude is decided only on it)."""
        return bool(self.seed_terms) and not self.seed_source

    def with_seed_spread(self, per_seed_var: float, dof: float, source: str) -> "Estimate":
        """This one-seed-a-side estimate with a seed level taken from elsewhere: ``per_seed_var`` (the statistic's
        per-seed variance, e.g. pooled over other repeated runs of the same task and metric) with ``dof`` degrees
        of freedom, entering as per_seed_var * (1 / S_a + 1 / S_b); ``source`` names those runs."""
        if self.seed_measured:
            raise ValueError("the seed spread of these runs is measured: nothing to combine")
        if per_seed_var < 0 or dof < 1:
            raise ValueError(f"a seed spread needs a variance >= 0 and df >= 1, got {per_seed_var}, {dof}")
        sa, sb = self.seeds
        var = per_seed_var / sa + (per_seed_var / sb if sb else 0.0)
        return dataclasses.replace(self, seed_terms=[(var, float(dof))],
                                   seed_var=(per_seed_var, per_seed_var if sb else 0.0),
                                   seed_note=f"seed spread combined from {source}", seed_source=source)

    def with_term(self, var: float, dof: float, note: str) -> "Estimate":
        """This estimate with one more independent variance term of the statistic (``var`` with ``dof`` degrees of
        freedom, combined like the seed level: Welch-Satterthwaite), e.g. the spread of a clustering score over
        its k-means initialisations, which neither the seeds nor the test examples hold."""
        if var < 0 or dof < 1:
            raise ValueError(f"a variance term needs var >= 0 and df >= 1, got {var}, {dof}")
        return dataclasses.replace(self, extra_terms=[*self.extra_terms, (var, float(dof))],
                                   seed_note="; ".join(x for x in (self.seed_note, note) if x))

    @property
    def example_var(self) -> float:
        """The test set's variance of the statistic (the example bootstrap's, less the seed-by-example part)."""
        return self.shrink * float(np.var(self.draws))

    def _halves(self, confidence: float) -> tuple[float, float]:
        """The example level's standard uncertainty below and above the point (percentile half-widths / z)."""
        alpha = (1.0 - confidence) / 2.0
        lo, hi = np.quantile(self.draws, [alpha, 1.0 - alpha])
        z = stats.norm.ppf(1.0 - alpha)
        return max(self.point - lo, 0.0) / z, max(hi - self.point, 0.0) / z

    def _side(self, u_ex: float) -> tuple[float, float]:
        """(combined standard uncertainty, Welch-Satterthwaite degrees of freedom) of one side."""
        ex = self.shrink * u_ex * u_ex
        terms = self.seed_terms + self.extra_terms
        total = ex + sum(v for v, _ in terms)
        denom = sum(v * v / nu for v, nu in terms if v > 0)
        nu = math.inf if denom == 0 else total * total / denom
        return math.sqrt(total), nu

    def interval(self, confidence: float = 0.95) -> tuple[float, float]:
        """The two-sided interval at ``confidence``: on each side of the point, the example level's percentile
        half-width combined with the seed and extra terms as in the GUM (u^2 = u_examples^2 + u_seeds^2), half-width
        t_nu * u with nu by Welch-Satterthwaite (the example part has infinitely many degrees of freedom)."""
        if not 0.0 < confidence < 1.0:
            raise ValueError(f"confidence must be in (0, 1), got {confidence}")
        q = 1.0 - (1.0 - confidence) / 2.0
        out = []
        for sign, u_ex in zip((-1.0, 1.0), self._halves(confidence)):
            u, nu = self._side(u_ex)
            t = stats.norm.ppf(q) if math.isinf(nu) else stats.t.ppf(q, nu)
            out.append(self.point + sign * t * u)
        return out[0], out[1]

    def p_one_sided(self, sign: float) -> float:
        """P-value of "the statistic is <= 0" (``sign`` +1) or ">= 0" (-1): the side of the point facing 0, its
        95 % half-width's uncertainty, a t tail (p < 0.025 exactly when the 95 % interval excludes 0 on that
        side)."""
        lo_u, hi_u = self._halves(0.95)
        u, nu = self._side(lo_u if sign > 0 else hi_u)  # the side that must clear 0 for the paper's sign
        x = sign * self.point
        if u == 0.0:
            return 0.0 if x > 0 else 1.0
        dist = stats.norm if math.isinf(nu) else stats.t(nu)
        return float(dist.sf(x / u))

    def seeds_needed(self, effect: float, seed_var_fallback: float | None = None, max_seeds: int = 1000,
                     alpha: float = 0.025) -> tuple[int | None, float]:
        """(seeds a side, test-example factor k) at which the one-sided ``alpha`` (2.5 %: the direction test)
        test reaches ``effect``'s side with :data:`POWER` power at this estimate's per-seed and test-set
        variance: the smallest n whose noncentral-t power, P(T(nu, |effect| / sqrt((sa2 + sb2) / n + V_test / k))
        > t_(1-alpha)(nu)) with nu = 2n - 2 (n - 1 for one family), reaches it. k = 1 unless the test set alone
        leaves less than the whole budget, then the smallest k that leaves half of it to the seeds. n None:
        not reached by ``max_seeds``, or no seed variance to plan with (one seed a side, no fallback)."""
        sa2, sb2 = self.seed_var
        if not self.seed_measured:
            if seed_var_fallback is None:
                return None, 1.0
            sa2, sb2 = seed_var_fallback, (seed_var_fallback if self.seeds[1] else 0.0)
        seed2, test = sa2 + sb2, self.example_var
        budget = (abs(effect) / (stats.norm.ppf(1.0 - alpha) + stats.norm.ppf(POWER))) ** 2
        k = float(math.ceil(2.0 * test / budget)) if test >= budget else 1.0
        for n in range(2, max_seeds + 1):
            nu = 2 * n - 2 if self.seeds[1] else n - 1
            var = seed2 / n + test / k
            if var == 0.0 or stats.nct.sf(stats.t.ppf(1.0 - alpha, nu), nu, abs(effect) / math.sqrt(var)) >= POWER:
                return n, k
        return None, k


def combine(pa, pb, da, db, stat: str = "difference") -> Estimate:
    """The :class:`Estimate` of ``stat`` from per-seed values ``pa`` [S_a], ``pb`` [S_b] and their example
    resamples ``da`` [S_a, B], ``db`` [S_b, B] (``pb``/``db`` None for ``single``): the seeds' variance pooled over
    both families, the example bootstrap's less the seed-by-example part the seeds already hold
    (docs/claims.md#protoclipclaimsintervals). With no seed part its interval is exactly the percentile interval of
    the example bootstrap; with no example part, the pooled two-sample t interval over seeds::

        est = combine(pa, pb, da, db, "difference")
        est.interval(0.95), est.interval(0.90), est.p_one_sided(+1)
    """
    if stat not in STATS:
        raise ValueError(f"unknown statistic {stat!r} (one of {', '.join(STATS)})")
    pa, da = np.asarray(pa, dtype=np.float64), np.atleast_2d(np.asarray(da, dtype=np.float64))
    one = stat == "single"
    if one:
        pb = db = None
    else:
        pb, db = np.asarray(pb, dtype=np.float64), np.atleast_2d(np.asarray(db, dtype=np.float64))
    if da.shape[0] != len(pa) or (not one and db.shape[0] != len(pb)):
        raise ValueError("combine: one row of example resamples per seed run")
    ma, mb = float(pa.mean()), (None if one else float(pb.mean()))
    point = _value(stat, ma, mb)
    ga, gb = _gradient(stat, ma, mb)
    draws = _value(stat, da.mean(axis=0), None if one else db.mean(axis=0))
    draws = np.asarray(draws, dtype=np.float64)
    # the seed-by-example interaction, already in the seeds' variance: removed from the example level
    inter = 0.0
    for g, d in ((ga, da), (gb, db)):
        if d is not None and d.shape[0] > 1:
            inter += g * g * max(float(np.var(d, axis=1).mean() - np.var(d.mean(axis=0))), 0.0) / (d.shape[0] - 1)
    total = float(np.var(draws))
    shrink = max(total - inter, 0.0) / total if total > 0 else 1.0
    sa, sb = len(pa), (0 if one else len(pb))
    # the seed level: one spread pooled over the families (a two-sample t test's equal-variance assumption;
    # Welch's degrees of freedom from 2-3 seeds a side are too noisy: 98 % coverage at 2 seeds); relative
    # spread for ratios (time per epoch scales with the run's length); a one-seed family adds no df
    rel = stat != "difference"
    pooled, dof = 0.0, 0
    for p, m in ((pa, ma), (pb, mb)):
        if p is not None and len(p) > 1:
            pooled += float(np.var(p, ddof=1)) / (m * m if rel else 1.0) * (len(p) - 1)
            dof += len(p) - 1
    terms, note = [], ""
    scale_a = ga * ga * (ma * ma if rel else 1.0)
    scale_b = 0.0 if one else gb * gb * (mb * mb if rel else 1.0)
    per_seed = (0.0, 0.0)
    if dof:
        pooled /= dof
        per_seed = (scale_a * pooled, scale_b * pooled)
        terms.append((per_seed[0] / sa + (per_seed[1] / sb if sb else 0.0), dof))
        if not one and min(sa, sb) == 1:
            note = f"{'b' if sb == 1 else 'a'}: 1 seed, its seed spread taken from {'a' if sb == 1 else 'b'}"
    else:
        note = "examples only, seed spread not measured"
    return Estimate(point, draws, shrink, terms, (sa, sb), per_seed, note)


def pooled_seed_variance(groups) -> tuple[float, int]:
    """The per-seed variance pooled over groups of repeated runs (each group's sample variance weighted by its
    n - 1 degrees of freedom, the two-sample t test's pooling) and its degrees of freedom; (0.0, 0) when no
    group has two runs."""
    num, dof = 0.0, 0
    for g in groups:
        g = np.asarray(g, dtype=np.float64)
        if len(g) > 1:
            num += float(np.var(g, ddof=1)) * (len(g) - 1)
            dof += len(g) - 1
    return (num / dof if dof else 0.0), dof


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error), in the input order."""
    p = np.asarray(pvalues, dtype=np.float64)
    m = len(p)
    order = np.argsort(p, kind="stable")
    adj = np.empty(m)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adj[i] = running
    return adj.tolist()


__all__ = ["Estimate", "combine", "holm", "pooled_seed_variance", "STATS", "POWER"]
