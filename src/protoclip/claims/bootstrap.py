"""Bootstrap draws for the claims ledger's intervals: test examples resampled (paired between the two run families)
and, for the comparison only, seeds. Each run's value is recomputed under every resample of its units (:class:`Units`,
:class:`RandIndex`, :class:`MutualInfo`), drawn from named streams so that a naive loop reproduces them and a data set
is resampled the same way wherever it appears. The draws: docs/claims.md#protoclipclaimsbootstrap.
Numpy (and scikit-learn's expected mutual information for AMI): no project config, no files.
"""
from __future__ import annotations

import multiprocessing
import traceback
import zlib
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

MAX_DRAW = 1 << 25  # index draws of at most this many elements at once (256 MB of int64); more: chunks
# AMI resamples go to worker processes when a call holds at least this many of sklearn's EMI terms (about half a
# second of one core's work at 1.7e7 terms/s): below it, forking costs more than it saves
PARALLEL_MIN_TERMS = 10_000_000


@dataclass(frozen=True)
class Units:
    """One run's per-unit results on one component. Every number the ledger compares is a ratio of sums over units:
    test images (zero-shot, linear and kNN accuracy), retrieval queries grouped by image (recall@k, mean recall), or
    training episodes (phase-time shares and ratios). Under a resample that draws unit ``u`` ``w[u]`` times::

        value(w) = sum_t coef[t] * (w . num[t]) / (w . den[t])

    accuracy: one term, ``num`` = hit per image, ``den`` = 1, ``coef`` = 100; mean recall: six terms (recall@1/5/10
    both ways; image queries with ``den`` = 1, caption queries grouped under their image with ``den`` = its number
    of captions, so an image is drawn with its captions); a phase's share of the episode time: ``num`` = the phase's
    seconds, ``den`` = the episode's seconds. With ``w = 1`` it is the metric as the metrics file holds it."""
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


def _assignments(who: str, cluster, labels) -> tuple[np.ndarray, np.ndarray]:
    """A clustering unit's fixed assignments and labels, one per test image (at least 2)."""
    cluster, labels = np.asarray(cluster), np.asarray(labels)
    if cluster.shape != labels.shape or cluster.ndim != 1 or len(cluster) < 2:
        raise ValueError(f"{who}: cluster {cluster.shape} and labels {labels.shape} must be [N >= 2]")
    return cluster, labels


class RandIndex:
    """The adjusted Rand index of fixed cluster assignments against the labels, as a resampling unit: under a
    resample that draws test image u ``w[u]`` times it is the ARI of the sample holding each image w[u] times
    (sklearn's ``adjusted_rand_score`` of the repeated arrays), computed from the weighted contingency table.
    The k-means assignments stay those of the full test set: the interval covers the test images' sampling,
    not k-means' own initialisation spread (the metrics file reports that as ``ari_std``)."""

    def __init__(self, cluster, labels):
        cluster, labels = _assignments("RandIndex", cluster, labels)
        self.n = len(cluster)
        # one-hot maps of each image to its contingency cell, its cluster and its class (occupied ones only)
        self._maps = [np.unique(key, return_inverse=True)[1]
                      for key in (cluster.astype(np.int64) * (int(labels.max()) + 1) + labels, cluster, labels)]

    def value(self, counts: np.ndarray | None = None) -> np.ndarray:
        if counts is None:
            counts = np.ones((1, self.n))
        pairs = []
        for inv in self._maps:
            table = np.zeros((counts.shape[0], int(inv.max()) + 1))
            for b in range(counts.shape[0]):  # the resample's counts per cell
                table[b] = np.bincount(inv, weights=counts[b], minlength=table.shape[1])
            pairs.append((table * (table - 1) / 2).sum(axis=1))
        n = counts.sum(axis=1)
        cells, rows, cols = pairs
        expected = rows * cols / (n * (n - 1) / 2)
        top, bottom = cells - expected, (rows + cols) / 2 - expected
        # sklearn's special cases: a single cluster and class, or every image its own: ARI 1
        return np.where(bottom == 0, 1.0, top / np.where(bottom == 0, 1.0, bottom))


class MutualInfo:
    """The adjusted mutual information of fixed cluster assignments against the labels (sklearn's
    ``adjusted_mutual_info_score``, arithmetic-mean normaliser), as a resampling unit: under a resample that draws
    test image u ``w[u]`` times it is the AMI of the sample holding each image w[u] times, from the weighted
    contingency table. Its expected mutual information is that of the resample's own marginals, exactly (sklearn's
    ``expected_mutual_information``), so one resample costs about one AMI of the whole set: milliseconds at the
    offline default's 10 classes, seconds at ImageNet's 1,000 (the ledger says when that is too long). As for
    :class:`RandIndex`, the assignments stay those of the full test set. ``workers`` > 1: a call's resamples are
    split over that many forked processes (:func:`in_processes`) when it holds :data:`PARALLEL_MIN_TERMS` terms
    or more; each resample's value is the one a single process computes."""

    def __init__(self, cluster, labels, workers: int = 1):
        cluster, labels = _assignments("MutualInfo", cluster, labels)
        self.n, self.workers = len(cluster), max(1, int(workers))
        rows, cols = np.unique(labels, return_inverse=True)[1], np.unique(cluster, return_inverse=True)[1]
        self._shape = (int(rows.max()) + 1, int(cols.max()) + 1)
        self._cell = rows * self._shape[1] + cols
        a, b = np.bincount(rows), np.bincount(cols)
        # the terms sklearn's expected_mutual_information sums for this set (n_ij from max(1, a_i + b_j - n) to
        # min(a_i, b_j), every class i and cluster j): a resample's cost, known without timing one
        self.emi_terms = int(np.clip(np.minimum.outer(a, b) - np.maximum(1, np.add.outer(a, b) - self.n) + 1,
                                     0, None).sum())

    def value(self, counts: np.ndarray | None = None) -> np.ndarray:
        if counts is None:
            counts = np.ones((1, self.n))
        if self.workers > 1 and counts.shape[0] > 1 and self.emi_terms * counts.shape[0] >= PARALLEL_MIN_TERMS:
            return in_processes(self._values, counts, self.workers)
        return self._values(counts)

    def _values(self, counts: np.ndarray) -> np.ndarray:
        out = np.empty(counts.shape[0])
        for b in range(counts.shape[0]):
            table = np.bincount(self._cell, weights=counts[b], minlength=self._shape[0] * self._shape[1])
            table = np.rint(table).astype(np.int64).reshape(self._shape)
            out[b] = adjusted_mutual_info(table[table.sum(axis=1) > 0][:, table.sum(axis=0) > 0])
        return out


def in_processes(fn: Callable[[np.ndarray], np.ndarray], rows: np.ndarray, workers: int) -> np.ndarray:
    """``fn(rows)`` for an ``fn`` that treats each row on its own, computed as ``workers`` contiguous blocks of
    rows, each on its own forked process (it reads ``fn`` and ``rows`` from the parent's memory, only the results
    travel back through a pipe): the same values as one call. Fork, because the callers are CPU-only numpy /
    scikit-learn code (the children start no OpenMP or CUDA work of the parent's). A process per block, not a pool:
    the blocks are equal by construction, and a pool lets one worker take them all while another starts."""
    ctx = multiprocessing.get_context("fork")
    edges = np.linspace(0, len(rows), min(workers, len(rows)) + 1).astype(int)
    children = []
    for a, b in zip(edges[:-1], edges[1:]):
        receive, send = ctx.Pipe(duplex=False)
        child = ctx.Process(target=_rows_part, args=(fn, rows, int(a), int(b), send), daemon=True)
        child.start()
        send.close()  # the child holds the only sending end: one that dies gives EOF here, not a hang
        children.append((child, receive))
    try:
        parts = [_received(child, receive) for child, receive in children]
    finally:
        for child, receive in children:
            receive.close()
            if child.is_alive():
                child.terminate()
            child.join()
    return np.concatenate(parts)


def _rows_part(fn: Callable[[np.ndarray], np.ndarray], rows: np.ndarray, a: int, b: int, send) -> None:
    """One forked block of :func:`in_processes`: sends ``(True, values)``, or ``(False, the traceback)``."""
    try:
        send.send((True, fn(rows[a:b])))
    except BaseException:  # noqa: BLE001 - the parent raises it
        send.send((False, traceback.format_exc()))
    finally:
        send.close()


def _received(child, receive) -> np.ndarray:
    try:
        ok, part = receive.recv()
    except EOFError:
        raise RuntimeError(f"in_processes: worker pid {child.pid} ended without a result") from None
    if not ok:
        raise RuntimeError(f"in_processes: worker pid {child.pid} failed:\n{part}")
    return part


def adjusted_mutual_info(table: np.ndarray) -> float:
    """sklearn's ``adjusted_mutual_info_score`` (average_method "arithmetic") from a contingency table of counts
    (classes x clusters, no empty row or column), its special cases and float guards included."""
    from sklearn.metrics import mutual_info_score  # heavy: sklearn, only for AMI resamples
    from sklearn.metrics.cluster._expected_mutual_info_fast import expected_mutual_information  # heavy: sklearn

    rows, cols = table.shape
    if rows == cols == 1:
        return 1.0  # one class and one cluster: a perfect match
    if rows == 1 or cols == 1:
        return 0.0
    n = int(table.sum())
    mi = mutual_info_score(None, None, contingency=table)
    emi = expected_mutual_information(table, n)

    def entropy(counts: np.ndarray) -> float:
        p = counts[counts > 0] / n
        return float(-(p * np.log(p)).sum())

    tiny = np.finfo(np.float64).eps
    denominator = (entropy(table.sum(axis=1)) + entropy(table.sum(axis=0))) / 2.0 - emi
    denominator = min(denominator, -tiny) if denominator < 0 else max(denominator, tiny)
    numerator = mi - emi
    numerator = min(numerator, -tiny) if numerator < 0 else max(numerator, tiny)
    return float(numerator / denominator)


@dataclass(frozen=True)
class Component:
    """The two families' results on one data set (or one set of episodes): ``a`` and ``b`` list one
    :class:`Units` per seed run (``b`` empty for a one-family statistic such as a share of ``a``'s time)."""
    a: list[Units]
    b: list[Units] = field(default_factory=list)
    paired: bool = True  # same units for every run (test images); False: each run its own (episodes)
    key: str = ""  # the stream's name (the data set): the same key, the same draw; "" = its position

    def __post_init__(self) -> None:
        if not self.a:
            raise ValueError("Component: family a has no run")
        if self.paired:
            sizes = {u.n for u in self.a + self.b}
            if len(sizes) != 1:
                raise ValueError(f"Component: paired runs must score the same units, got sizes {sorted(sizes)}")


def stream(seed: int, name: str) -> np.random.Generator:
    """The generator of one named stream of draws: ``np.random.default_rng([seed, zlib.crc32(name)])``. Named, so
    that a naive loop reproduces a draw and the same data set gets the same draw in every cell and claim."""
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def _draw(rng: np.random.Generator, n_resamples: int, n: int) -> np.ndarray:
    """[B, n] unit indices: one call when it fits MAX_DRAW (scipy.stats.bootstrap's draw, bit for bit), else
    chunks of resamples (an equally valid bootstrap that no longer matches scipy's draw)."""
    if n_resamples * n <= MAX_DRAW:
        return rng.integers(0, n, (n_resamples, n))
    step = max(1, MAX_DRAW // n)
    return np.concatenate([rng.integers(0, n, (min(step, n_resamples - s), n)) for s in range(0, n_resamples, step)])


def _counts(idx: np.ndarray) -> list[np.ndarray]:
    """How often each unit is drawn in each resample of ``idx`` ([B, n]), as float64 chunks of resamples."""
    n_resamples, n = idx.shape
    step = max(1, MAX_DRAW // (4 * n))
    out = []
    for s in range(0, n_resamples, step):
        rows = idx[s:s + step]
        flat = (rows + (np.arange(len(rows)) * n)[:, None]).ravel()
        out.append(np.bincount(flat, minlength=len(rows) * n).reshape(len(rows), n).astype(np.float64))
    return out


def _values(units: list[Units], counts: list[np.ndarray]) -> np.ndarray:
    """Each of ``units``' value under each resample (``counts`` chunks) -> [len(units), B]."""
    return np.stack([np.concatenate([u.value(c) for c in counts]) for u in units])


class CountsCache(dict):
    """Draw counts of paired streams kept between :func:`resample` calls, up to ``max_elements`` counts in all
    (float64: 8 bytes each; beyond it a set's counts are built again for each call)."""

    def __init__(self, max_elements: int = MAX_DRAW):
        super().__init__()
        self.max_elements = max_elements

    def __setitem__(self, key, counts: list[np.ndarray]) -> None:
        held = sum(c.size for v in self.values() for c in v)
        if held + sum(c.size for c in counts) <= self.max_elements:
            super().__setitem__(key, counts)


def resample_runs(components: list[Component], n_resamples: int = 2000, seed: int = 0, cache: dict | None = None
                  ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per component, each run's value under every example resample, seeds not resampled: ``[(A [S_a, B],
    B [S_b, B])]``. Draws (step 1 of docs/claims.md#protoclipclaimsbootstrap): a paired component one
    ``integers(0, n, (B, n))`` draw from stream ``examples/<key>``, shared by every run of both families; an
    unpaired one (each run its own units, e.g. its episodes) one draw per run from ``examples/<key>/a<i>`` /
    ``examples/<key>/b<i>``. protoclip.claims.intervals builds the seed level from these with a small-sample
    correction."""
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    if not components:
        raise ValueError("resample: no component")
    per_run: list[tuple[np.ndarray, np.ndarray]] = []
    for i, comp in enumerate(components):
        key = f"examples/{comp.key or i}"
        if comp.paired:
            n = comp.a[0].n
            ck = (key, n, n_resamples, seed)
            counts = cache.get(ck) if cache is not None else None
            if counts is None:
                counts = _counts(_draw(stream(seed, key), n_resamples, n))
                if cache is not None:
                    cache[ck] = counts
            v = _values(comp.a + comp.b, counts)
        else:
            names = [f"{key}/a{j}" for j in range(len(comp.a))] + [f"{key}/b{j}" for j in range(len(comp.b))]
            v = np.concatenate([_values([u], _counts(_draw(stream(seed, name), n_resamples, u.n)))
                                for u, name in zip(comp.a + comp.b, names)])
        per_run.append((v[:len(comp.a)], v[len(comp.a):]))
    return per_run


def resample(components: list[Component], n_resamples: int = 2000, seed: int = 0, cache: dict | None = None
             ) -> tuple[np.ndarray, np.ndarray | None]:
    """(A, B): each family's value per component in every resample of the two-level bootstrap (examples, then
    seeds with replacement), ``[components, n_resamples]`` (B: None when no component has a family b). Draws:
    :func:`resample_runs`', then per family of S > 1 seeds ``integers(0, S, (B, S))`` from stream ``seeds/a`` /
    ``seeds/b``, the same seeds for every component (docs/claims.md#protoclipclaimsbootstrap). ``cache``: a dict
    (:class:`CountsCache`) that keeps each paired stream's draw counts for later calls (a report builds each set's
    counts once). Its percentile interval undercovers at few seeds (protoclip.claims.intervals): the ledger does
    not use it; protoclip.claims.coverage compares it with the ledger's. With one seed a side::

        comp = Component([Units.mean(hits_a)], [Units.mean(hits_b)], key="fashion_mnist")
        a, b = resample([comp], n_resamples=2000, seed=0)                 # [components, B] each
        lo, hi = percentile_interval((a - b).mean(0), 0.95)"""
    per_run = resample_runs(components, n_resamples, seed, cache)
    seeds_a = _seed_draw(stream(seed, "seeds/a"), len(components[0].a), n_resamples)
    n_b = len(components[0].b)
    seeds_b = _seed_draw(stream(seed, "seeds/b"), n_b, n_resamples) if n_b else None
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
    method computes: ``np.quantile`` at (1 - confidence) / 2 and its complement, linear interpolation). With one
    seed per family and one paired component, that of :func:`resample` is exactly ``scipy.stats.bootstrap(...,
    paired=True, method='percentile', rng=stream(seed, "examples/<key>"))`` (tests/unit/test_claims_bootstrap.py)."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(np.asarray(theta, dtype=np.float64), [alpha, 1.0 - alpha])
    return float(lo), float(hi)


__all__ = ["MAX_DRAW", "PARALLEL_MIN_TERMS", "Component", "CountsCache", "MutualInfo", "RandIndex", "Units",
           "adjusted_mutual_info", "in_processes", "percentile_interval", "point", "resample", "resample_runs",
           "stream"]
