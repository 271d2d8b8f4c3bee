"""Bootstrap intervals of differences between runs: resampling test examples (paired) and seeds (hierarchical).

What is resampled. Every number the ledger compares is a ratio of sums over *units*: test images (zero-shot,
linear and kNN accuracy), retrieval queries grouped by image (recall@k, mean recall), or training episodes
(phase-time shares and ratios). One run's value under a resample that draws unit ``u`` ``w[u]`` times is

    value(w) = sum_t coef[t] * (w . num[t]) / (w . den[t])          (:class:`Units`)

accuracy: one term, ``num`` = hit per image, ``den`` = 1, ``coef`` = 100; mean recall: six terms (recall@1/5/10
both ways; image queries with ``den`` = 1, caption queries grouped under their image with ``den`` = its number of
captions, so an image is drawn with its captions); a phase's share of the episode time: ``num`` = the phase's
seconds, ``den`` = the episode's seconds. With ``w = 1`` it is the metric as the metrics file holds it.

How. A claim has one or more *components* (data sets: a column averaged over several sets, or counted over
them) and two run *families* (a run, or its seeds). The draws, in this order (a naive loop reproduces them:
tests/test_claims_bootstrap.py):

1. per component, in order: ``paired`` (both families scored on the same units, the same test images): one
   ``rng.integers(0, n, (B, n))`` draw shared by every run and seed of both families (the pairing over examples);
   unpaired (each run its own units, e.g. its training episodes): one such draw per run, family A's seeds
   first;
2. then per family with S > 1 seeds: ``rng.integers(0, S, (B, S))``, the same seeds for every component
   (a seed is one trained model).

A family's value in resample b is the mean over its drawn seeds of their values under the component's draw:
a two-level bootstrap, seeds then examples (for the same test images across seeds: the examples crossed with
the seeds, both resampled), which adds the seed spread to the example spread. With three seeds the seed level
has only 10 distinct draws and the percentile interval is a rough one; that is what three seeds can tell.
The interval is the percentile interval of the B resampled statistics (``np.quantile``, linear). With one
seed per family and one paired component this is exactly ``scipy.stats.bootstrap(..., paired=True,
method='percentile')`` for the same ``np.random.default_rng(seed)`` (the same index draw; tested), as long as
the draw fits in one call (``B * n <= MAX_DRAW``; larger sets draw in chunks of resamples, an equally valid
bootstrap that no longer matches scipy's draw bit for bit).

    from protoclip.claims.bootstrap import Component, Units, resample, percentile_interval
    comp = Component([Units.mean(hits_a)], [Units.mean(hits_b)])     # one seed each, same test images
    a, b = resample([comp], n_resamples=2000, seed=0)                 # [components, B] each
    lo, hi = percentile_interval((a - b).mean(0), 0.95)

Pure numpy: no project config, no files.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

MAX_DRAW = 1 << 25  # index draws of at most this many elements at once (256 MB of int64); more: chunks


@dataclass(frozen=True)
class Units:
    """One run's per-unit results on one component: value(w) = sum_t coef[t] * (w . num[t]) / (w . den[t])."""
    num: np.ndarray  # [terms, units]
    den: np.ndarray  # [terms, units], > 0 summed over any resample's units (1 per image, captions per image, ...)
    coef: np.ndarray  # [terms]

    def __post_init__(self) -> None:
        num, den, coef = (np.asarray(x, dtype=np.float64) for x in (self.num, self.den, self.coef))
        if num.ndim != 2 or den.shape != num.shape or coef.shape != (num.shape[0],) or num.shape[1] == 0:
            raise ValueError(f"Units: num {num.shape}, den {den.shape}, coef {coef.shape}: need num and den "
                             "[terms, units >= 1] and coef [terms]")
        if (den < 0).any() or (den.sum(axis=1) <= 0).any():
            raise ValueError("Units: den must be >= 0 with a positive sum per term")
        for name, arr in (("num", num), ("den", den), ("coef", coef)):
            object.__setattr__(self, name, arr)

    @classmethod
    def mean(cls, values, scale: float = 100.0) -> "Units":
        """The mean of per-unit ``values`` times ``scale`` (accuracy in % from hits: ``Units.mean(hits)``)."""
        values = np.asarray(values, dtype=np.float64)
        return cls(values[None, :], np.ones((1, len(values))), np.array([scale]))

    @property
    def n(self) -> int:
        return self.num.shape[1]

    def value(self, counts: np.ndarray | None = None) -> np.ndarray:
        """The value under each row of ``counts`` ([B, units] draws per unit) -> [B]; None: all units once."""
        if counts is None:
            counts = np.ones((1, self.n))
        return ((counts @ self.num.T) / (counts @ self.den.T)) @ self.coef


@dataclass(frozen=True)
class Component:
    """The two families' results on one data set (or one set of episodes): ``a`` and ``b`` list one
    :class:`Units` per seed run (``b`` empty for a one-family statistic such as a share of ``a``'s time)."""
    a: list[Units]
    b: list[Units] = field(default_factory=list)
    paired: bool = True  # same units for every run (test images); False: each run its own (episodes)

    def __post_init__(self) -> None:
        if not self.a:
            raise ValueError("Component: family a has no run")
        if self.paired:
            sizes = {u.n for u in self.a + self.b}
            if len(sizes) != 1:
                raise ValueError(f"Component: paired runs must score the same units, got sizes {sorted(sizes)}")


def _draw(rng: np.random.Generator, n_resamples: int, n: int) -> np.ndarray:
    """[B, n] unit indices: one call when it fits MAX_DRAW (scipy.stats.bootstrap's draw), else chunks."""
    if n_resamples * n <= MAX_DRAW:
        return rng.integers(0, n, (n_resamples, n))
    step = max(1, MAX_DRAW // n)
    return np.concatenate([rng.integers(0, n, (min(step, n_resamples - s), n)) for s in range(0, n_resamples, step)])


def _values(units: list[Units], idx: np.ndarray) -> np.ndarray:
    """Each of ``units``' value under each resample of ``idx`` ([B, n] indices, shared) -> [len(units), B]; the
    draw counts are built once per chunk of resamples."""
    n_resamples, n = idx.shape
    step = max(1, MAX_DRAW // (4 * n))
    out = np.empty((len(units), n_resamples))
    for s in range(0, n_resamples, step):
        rows = idx[s:s + step]
        flat = (rows + (np.arange(len(rows)) * n)[:, None]).ravel()
        counts = np.bincount(flat, minlength=len(rows) * n).reshape(len(rows), n).astype(np.float64)
        for i, u in enumerate(units):
            out[i, s:s + step] = u.value(counts)
    return out


def resample(components: list[Component], n_resamples: int = 2000, seed: int = 0
             ) -> tuple[np.ndarray, np.ndarray | None]:
    """(A, B): each family's value per component in every resample, ``[components, n_resamples]`` (B: None
    when no component has a family b). Draw order: the module docstring."""
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    if not components:
        raise ValueError("resample: no component")
    rng = np.random.default_rng(seed)
    per_run: list[tuple[np.ndarray, np.ndarray]] = []  # per component: [S_a, B], [S_b, B]
    for comp in components:
        if comp.paired:
            v = _values(comp.a + comp.b, _draw(rng, n_resamples, comp.a[0].n))
        else:
            v = np.concatenate([_values([u], _draw(rng, n_resamples, u.n)) for u in comp.a + comp.b])
        va, vb = v[:len(comp.a)], v[len(comp.a):]
        per_run.append((va, vb))
    seeds_a = _seed_draw(rng, len(components[0].a), n_resamples)
    n_b = len(components[0].b)
    seeds_b = _seed_draw(rng, n_b, n_resamples) if n_b else None
    a = np.stack([_family(va, seeds_a) for va, _ in per_run])
    b = np.stack([_family(vb, seeds_b) for _, vb in per_run]) if n_b else None
    return a, b


def _seed_draw(rng: np.random.Generator, n_seeds: int, n_resamples: int) -> np.ndarray | None:
    """[B, S] seed indices for a family of S > 1 seeds; None for one seed (no draw)."""
    return rng.integers(0, n_seeds, (n_resamples, n_seeds)) if n_seeds > 1 else None


def _family(values: np.ndarray, seeds: np.ndarray | None) -> np.ndarray:
    """[S, B] per-seed values -> [B]: the mean over each resample's drawn seeds (the one seed's values if S = 1)."""
    if seeds is None:
        return values[0]
    return values[seeds, np.arange(values.shape[1])[:, None]].mean(axis=1)


def point(components: list[Component]) -> tuple[np.ndarray, np.ndarray | None]:
    """(A, B) without resampling: each family's mean over its seeds of the value on all units, ``[components]``."""
    a = np.array([np.mean([u.value()[0] for u in c.a]) for c in components])
    b = np.array([np.mean([u.value()[0] for u in c.b]) for c in components]) if components[0].b else None
    return a, b


def percentile_interval(theta: np.ndarray, confidence: float = 0.95) -> tuple[float, float]:
    """The percentile interval of resampled statistics ``theta`` (what scipy.stats.bootstrap's 'percentile'
    method computes: ``np.quantile`` at (1 - confidence) / 2 and its complement, linear interpolation)."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(np.asarray(theta, dtype=np.float64), [alpha, 1.0 - alpha])
    return float(lo), float(hi)


__all__ = ["Units", "Component", "resample", "point", "percentile_interval", "MAX_DRAW"]
