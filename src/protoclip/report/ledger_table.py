"""The claims ledger: each claim of the papers (config/claims.yaml) asked two questions, direction and
magnitude, from our measured number and its intervals; also the intervals of the paper tables' difference rows.

    protoclip report --config config/config.yaml     # -> results/tables/claims.{md,csv,tex,html,json},
                                                     #    results/figures/claims.png (forest plot)

A claim names a paper target's rows and column(s) (protoclip.claims.config), so our point estimate is exactly
the tables' number (difference of the two rows' means over their seeds, each a mean over the column's sets). The
intervals resample what that number is computed from: the per-example results the evaluation kept beside each
metrics file (``<task>.examples.npz``: a hit per test image, a first-match rank per retrieval query) and, for
the cost claims, the train logs' per-episode phase times (a share paired within each run: the phase's seconds
over the training phase's, the same episodes); the seed level with a small-sample t correction
(protoclip.claims.intervals); a clustering score adds its k-means initialisations' variance. The rules:
protoclip.claims.ledger (direction on the 95 % interval, a count by the sign test over its sets, magnitude by two
one-sided tests on the 90 % interval against the paper's number with claims.yaml's margin, never decided off the
paper's scale or without the runs' own seed spread). Each side's score is held against its chance level (a side
not above it: "at chance: not judged"). Ledger-wide (:func:`finish`): one seed a side takes the seed spread of
its task and metric from the ledger's repeated runs, else its decisive direction reads "examples only: not
decisive"; Holm within each paper's claims decides the verdict; for each direction left undecided, the seeds a
side (and test examples) that would resolve it with 80 % power, at our estimate and at the paper's. A claim
whose runs, data or per-example results are absent reads "not run" with the reason.

    engine = ClaimEngine(cfg, Results(cfg))
    rows = finish([engine.evaluate(c) for c in cfg.paper_claims()], engine.settings)
    write_ledger(cfg, rows)
"""
from __future__ import annotations

import dataclasses
import html
import logging
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from protoclip.files import records
from protoclip.files.atomic import atomic_path, write_text
from protoclip.claims import ledger
from protoclip.claims.bootstrap import (
    Component,
    CountsCache,
    MutualInfo,
    RandIndex,
    Units,
    resample_runs,
)
from protoclip.claims.config import ClaimConfig
from protoclip.claims.intervals import combine, holm
from protoclip.files.layout import Layout
from protoclip.report import ledger_grid
from protoclip.report.ledger_rows import (HOLM_ALPHA, LedgerRow, NotRun, Side, at_chance, claim_sign, finish,
                                         judge, judge_estimate, needs_text, summary_text)
from protoclip.report.paper_targets import ColumnConfig, ReportProject, TargetConfig, first_configured
from protoclip.report.tables import rst_escape
from protoclip.report.values import Results, episode_times
from protoclip.tasks import task_names

log = logging.getLogger(__name__)

RECALL = re.compile(r"(image_to_text|text_to_image)_R@(\d+)")


def metric_units(task: str, metric: str, examples: dict[str, np.ndarray],
                 workers: int = 1) -> Units | RandIndex | MutualInfo | None:
    """The resampling units of ``metric`` from a task's per-example arrays (records.read_examples); None when the
    metric has no resampling unit here (AMI, NEMD, ...). With every unit drawn once it is the metrics file's
    number. Clustering ``ari`` / ``ami``: the test images with their fixed k-means assignments (:class:`RandIndex`,
    :class:`MutualInfo`, whose resamples use ``workers`` processes).

    zero-shot / linear / kNN ``top1`` / ``top5``: the mean hit of the test images; retrieval ``<dir>_R@k`` and
    ``mean_recall``: units are the images, each with its captions (image queries: hit or not; caption queries:
    the image's captions hit, over its number of captions), so an image is drawn together with its captions."""
    if task in task_names(lambda t: t.examples == "hits"):
        return Units.mean(examples[metric]) if metric in ("top1", "top5") and metric in examples else None
    if task == "clustering":
        if "cluster" not in examples or metric not in ("ari", "ami"):
            return None
        if metric == "ami":
            return MutualInfo(examples["cluster"], examples["labels"], workers=workers)
        return RandIndex(examples["cluster"], examples["labels"])
    if task != "retrieval" or "image_to_text_rank" not in examples:
        return None
    owner = np.asarray(examples["text_to_image"])
    n_img = len(examples["image_to_text_rank"])
    captions = np.bincount(owner, minlength=n_img).astype(np.float64)

    def term(direction: str, k: int) -> tuple[np.ndarray, np.ndarray]:
        hit = examples[f"{direction}_rank"] < k
        if direction == "image_to_text":
            return hit.astype(np.float64), np.ones(n_img)
        return np.bincount(owner, weights=hit, minlength=n_img), captions

    if (m := RECALL.fullmatch(metric)) is not None:
        num, den = term(m.group(1), int(m.group(2)))
        return Units(num[None], den[None], np.array([100.0]))
    if metric == "mean_recall":  # the mean of the six recalls at k = 1, 5, 10 (metrics.retrieval)
        terms = [term(d, k) for d in ("image_to_text", "text_to_image") for k in (1, 5, 10)]
        return Units(np.stack([t[0] for t in terms]), np.stack([t[1] for t in terms]), np.full(6, 100.0 / 6))
    return None


@dataclass
class Interval:
    point: float
    lo: float
    hi: float


def chance_of(task: str, metric: str, examples: dict[str, np.ndarray], metrics: dict) -> tuple[float, str]:
    """(chance level of ``metric`` in its unit, from what): the class count is the metrics file's
    ``n_classes`` (zero-shot: the classifier's classes) or the distinct labels of the test examples (a probe
    predicts the classes it was trained on); the candidates of a recall are the test images (an image's captions
    are one target: a caption query has one image among N, an image query its captions among N images')."""
    if metric in ("ari", "ami"):
        return 0.0, "0 for a chance-adjusted score"
    if task == "retrieval":
        n = int(len(examples["image_to_text_rank"]))
        return ledger.chance_level(metric, candidates=n), f"{n} candidates"
    if "n_classes" in metrics:
        n, what = int(metrics["n_classes"]), "classes of the classifier"
    else:
        n, what = int(len(np.unique(examples["labels"]))), "classes in the test labels"
    return ledger.chance_level(metric, classes=n), f"{n} {what}"


def init_variance(metrics: dict, metric: str) -> tuple[float, int] | None:
    """(variance, df) of a clustering score over its k-means initialisations, from the metrics file's
    ``<metric>_std`` (numpy's, ddof 0) and ``n_init``: the sample variance std^2 * n / (n - 1); None when
    the file has no spread (one initialisation, or an older file)."""
    n, std = metrics.get("n_init"), metrics.get(f"{metric}_std")
    if not isinstance(n, int) or n < 2 or not isinstance(std, (int, float)):
        return None
    return float(std) ** 2 * n / (n - 1), n - 1


# AMI's resamples each recompute the expected mutual information (MutualInfo): seconds each at ImageNet's 1,000
# classes, so a run and set whose resampling would take longer than this is "not run", saying how long. The time
# is estimated from the sums' terms (MutualInfo.emi_terms) at EMI_TERMS_PER_S, not timed, so that the verdict
# does not depend on the machine's load (sklearn's loop, one core of the 2-core dev machine: 1.7e7 terms/s)
AMI_BUDGET_S = 600
EMI_TERMS_PER_S = 1.7e7


class ClaimEngine:
    """Intervals and verdicts from a project's result files (one per report: per-example arrays are cached)."""

    def __init__(self, cfg: ReportProject, results: Results, workers: int = 1):
        self.cfg, self.results = cfg, results
        self.workers = workers  # processes for the AMI resamples (MutualInfo)
        self.settings = cfg.claims
        self._units: dict[tuple, tuple[Units, np.ndarray]] = {}
        self._chance: dict[tuple, tuple[float, str]] = {}  # (run, task, set, metric) -> (chance level, from what)
        self._inits: dict[tuple, tuple[float, int]] = {}  # clustering: (variance over k-means inits, df)
        self._counts = CountsCache()  # each set's resample counts, built once per report (bootstrap.resample)
        self._targets = {t.id: t for t in cfg.paper_targets()}

    # ---- per-example results of one run
    def units(self, run: str, task: str, dataset: str, metric: str) -> tuple[Units, np.ndarray]:
        """(units of ``metric``, the test labels / caption owners the run was scored on); NotRun with the reason
        when there is nothing to resample."""
        key = (run, task, dataset, metric)
        if key not in self._units:
            self._units[key] = self._load_units(*key)
        return self._units[key]

    def _load_units(self, run: str, task: str, dataset: str, metric: str) -> tuple[Units, np.ndarray]:
        examples = records.read_examples(self.results.layout, run, task, dataset)
        what = metric if metric == task else f"{task} {metric}"
        if examples is None:
            if task not in task_names(lambda t: bool(t.examples)):
                raise NotRun(f"{what} is not a mean over test examples: no per-example results, no interval")
            raise NotRun(f"{run}: no per-example results for {task} on {dataset} (evaluated before they were "
                         "kept: rerun its evaluation)")
        units = metric_units(task, metric, examples, self.workers)
        if units is None:
            raise NotRun(f"{what}: no resampling of test examples is implemented for it, no interval")
        expected = self.results.value(run, task, dataset, metric)
        if isinstance(units, MutualInfo) and (
                cost := units.emi_terms * self.settings.resamples / EMI_TERMS_PER_S) > AMI_BUDGET_S:
            raise NotRun(f"{run}: AMI on {dataset} takes {cost / 60:.0f} min to resample ({self.settings.resamples} "
                         f"expected mutual informations of {units.n} images; over the {AMI_BUDGET_S // 60} min "
                         "allowed per run and set): its ARI carries the clustering comparison")
        got = float(units.value()[0])
        if expected is None or not math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-9):
            raise NotRun(f"{run}: the per-example results of {task} on {dataset} give {got:.6g}, its metrics "
                         f"file {expected}: rerun its evaluation")
        align = examples["text_to_image"] if task == "retrieval" else examples["labels"]
        key = (run, task, dataset, metric)
        self._chance[key] = chance_of(task, metric, examples, self.results.metrics(run, task, dataset) or {})
        if task == "clustering":
            self._inits[key] = init_variance(self.results.metrics(run, task, dataset) or {}, metric)
        return units, np.asarray(align)

    # ---- run families
    def target(self, claim: ClaimConfig) -> TargetConfig:
        if claim.target not in self._targets:
            raise NotRun(f"target {claim.target} is not declared in {self.cfg.source}")
        return self._targets[claim.target]

    def family(self, target: TargetConfig, label: str | None, pinned: list[str]) -> tuple[str, list[str]]:
        """(base run name, its runs) of a row (or of the claim's pinned candidates)."""
        if pinned:
            base = first_configured(self.cfg, pinned)
        else:
            row = next(r for r in target.rows if r.label == label)
            base = row.run
            if base is None:
                raise NotRun(f"{target.id} row '{label}' is the paper's only (no run of ours)")
        runs = self.cfg.run_group(base)
        if not runs:
            raise NotRun(f"run {base} is not configured in {self.cfg.source}")
        return base, runs

    # ---- differences of table columns
    def column_components(self, runs_a: list[str], runs_b: list[str], column: ColumnConfig, sets: list[str]
                          ) -> list[Component]:
        comps = []
        for d in sets:
            ua = [self.units(r, column.task, d, column.metric) for r in runs_a]
            ub = [self.units(r, column.task, d, column.metric) for r in runs_b]
            first = ua[0][1]
            odd = next((r for r, (_, y) in zip(runs_a + runs_b, ua + ub) if not np.array_equal(y, first)), None)
            if odd is not None:
                raise NotRun(f"{runs_a[0]} and {odd} were scored on different test examples of {d}")
            comps.append(Component([u for u, _ in ua], [u for u, _ in ub], key=d))
        return comps

    def column_estimate(self, runs_a: list[str], runs_b: list[str], column: ColumnConfig, sets: list[str]
                        ) -> tuple[Estimate, int]:
        """(the :class:`Estimate` of a - b of ``column`` averaged over ``sets``, as the tables average them;
        the test examples summed over the sets)."""
        return self.column_parts(runs_a, runs_b, column, sets, inits=False)[:2]

    def column_parts(self, runs_a: list[str], runs_b: list[str], column: ColumnConfig, sets: list[str],
                     inits: bool = True) -> tuple:
        """(:class:`Estimate` of a - b, test examples, per-seed values of a and of b, each side's :class:`Side`,
        the example resamples of a and of b [S, B]), all means over ``sets``. A clustering score
        also carries the variance of its k-means initialisations (:func:`init_variance`): the score is one
        initialisation's (the lowest objective of n_init), a draw neither the seeds nor the examples resample,
        entering as mean_runs(var_a) / S_a + mean_runs(var_b) / S_b over the sets' mean, df the runs' n_init - 1
        summed (``inits``; the tables' difference cells keep the examples' and seeds' levels alone)."""
        comps = self.column_components(runs_a, runs_b, column, sets)
        per_run = resample_runs(comps, self.settings.resamples, self.settings.seed, self._counts)
        pa = np.mean([[u.value()[0] for u in c.a] for c in comps], axis=0)
        pb = np.mean([[u.value()[0] for u in c.b] for c in comps], axis=0)
        da = np.mean([a for a, _ in per_run], axis=0)
        db = np.mean([b for _, b in per_run], axis=0)
        est = combine(pa, pb, da, db, "difference")
        singles = [combine(pa, None, da, None, "single"), combine(pb, None, db, None, "single")]
        if inits and column.task == "clustering":
            terms = [[self._inits.get((r, column.task, d, column.metric)) for d in sets] for r in runs_a + runs_b]
            if all(t is not None for ts in terms for t in ts):
                var = [sum(v for v, _ in ts) / len(sets) ** 2 for ts in terms]  # of the mean over the sets
                va, vb = float(np.mean(var[:len(runs_a)])), float(np.mean(var[len(runs_a):]))
                dfa = sum(k for ts in terms[:len(runs_a)] for _, k in ts)
                dfb = sum(k for ts in terms[len(runs_a):] for _, k in ts)
                note = "k-means initialisations' spread included (metrics.json's n_init and std)"
                est = est.with_term(va / len(runs_a) + vb / len(runs_b), dfa + dfb, note)
                singles = [singles[0].with_term(va / len(runs_a), dfa, note),
                           singles[1].with_term(vb / len(runs_b), dfb, note)]
        sides = []
        for runs, single in zip((runs_a, runs_b), singles):
            levels = [self._chance[(runs[0], column.task, d, column.metric)] for d in sets]
            lo, hi = single.interval(self.settings.confidence)
            sides.append(Side(single.point, lo, hi, float(np.mean([c for c, _ in levels])),
                              "; ".join(dict.fromkeys(w for _, w in levels))))
        return est, sum(c.a[0].n for c in comps), pa, pb, sides, da, db

    def column_interval(self, runs_a: list[str], runs_b: list[str], column: ColumnConfig, sets: list[str],
                        point_value: float) -> Interval:
        """The interval of one difference cell (a - b of ``column`` on ``sets``); NotRun when there is none."""
        est, _ = self.column_estimate(runs_a, runs_b, column, sets)
        lo, hi = est.interval(self.settings.confidence)
        return Interval(point_value, lo, hi)

    # ---- one claim
    def evaluate(self, claim: ClaimConfig) -> LedgerRow:
        t0 = time.perf_counter()
        row = LedgerRow(claim)
        try:
            if claim.unavailable:
                raise NotRun(claim.unavailable)
            target = None if claim.kind == "toy" else self.target(claim)
            if claim.kind in ("best", "most", "equilibrium", "toy"):  # grids and tables (protoclip.report.ledger_grid)
                return ledger_grid.evaluate(self, claim, target, row)
            base_a, runs_a = self.family(target, claim.a, claim.a_runs)
            base_b, runs_b = self.family(target, claim.b, claim.b_runs)
            row.runs = f"{_group(base_a, runs_a)} vs {_group(base_b, runs_b)}"
            if claim.kind == "difference":
                col = next(c for c in target.columns if c.label == claim.columns[0])
                row.task_metric = (col.task, claim.metric or col.metric)  # its unit, also where no result exists
                self._difference(claim, target, base_a, base_b, runs_a, runs_b, row)
            elif claim.kind == "count":
                self._count(claim, target, base_a, base_b, runs_a, runs_b, row)
            elif claim.kind == "gain":
                self._gain(claim, target, base_a, base_b, runs_a, runs_b, row)
            else:
                self._cost(claim, runs_a, runs_b, row)
        except NotRun as why:
            row.direction = row.magnitude = ledger.NOT_RUN
            row.reason = str(why)
        finally:
            row.seconds = time.perf_counter() - t0
        return row

    def _judge(self, row: LedgerRow, seed_measured: bool, lo95: float, hi95: float, lo90: float, hi90: float
               ) -> None:
        judge(row, self.settings, seed_measured, lo95, hi95, lo90, hi90)

    def _estimate(self, row: LedgerRow, est: Estimate) -> None:
        judge_estimate(row, est, self.settings)

    def _columns(self, claim: ClaimConfig, target: TargetConfig, base_a: str, base_b: str, runs_a: list[str],
                 runs_b: list[str]) -> tuple[list[tuple[ColumnConfig, list[str]]], list[float], list[str]]:
        columns, diffs, notes = [], [], []
        for label in claim.columns:
            col = next(c for c in target.columns if c.label == label)
            if claim.metric:
                col = dataclasses.replace(col, metric=claim.metric)
            sets, note = self.results.column_sets(target, col)
            cells = [self.results.cell(base, col, sets) for base in (base_a, base_b)]
            missing = next((c for c in cells if c.mean is None), None)
            if missing is not None:
                if claim.kind == "count" or len(claim.columns) > 1:
                    raise NotRun(f"{label}: {self._why_empty(missing.note, runs_a + runs_b, col, sets)}"
                                 + (f" ({len(claim.columns)} sets needed)" if claim.kind == "count" else ""))
                raise NotRun(self._why_empty(missing.note, runs_a + runs_b, col, sets))
            columns.append((col, sets))
            diffs.append(cells[0].mean - cells[1].mean)
            notes.append(note)
        return columns, diffs, notes

    def _difference(self, claim: ClaimConfig, target: TargetConfig, base_a: str, base_b: str, runs_a: list[str],
                    runs_b: list[str], row: LedgerRow) -> None:
        columns, diffs, notes = self._columns(claim, target, base_a, base_b, runs_a, runs_b)
        (col, sets), = columns
        row.measured = f"{col.task} {col.metric} on " + " + ".join(sets) + (f" ({notes[0]})" if notes[0] else "")
        row.ours = diffs[0]  # shown even when the interval cannot be computed (NotRun below)
        row.task_metric = (col.task, col.metric)  # its unit, also where no interval follows
        row.seeds_run, on = min(len(runs_a), len(runs_b)), " + ".join(sets)
        if col.task not in task_names(lambda t: bool(t.examples)):  # NEMD: nothing per test example
            return self._seeds_only(row, col, sets, (base_a, runs_a), (base_b, runs_b))
        est, row.units, pa, pb, sides, _, _ = self.column_parts(runs_a, runs_b, col, sets)
        row.families = {(col.task, col.metric, f"{base_a} on {on}"): pa,
                        (col.task, col.metric, f"{base_b} on {on}"): pb}
        row.sides = "; ".join(side.text(name) for side, name in zip(sides, (base_a, base_b)))
        self._estimate(row, est)
        low = [name for side, name in zip(sides, (base_a, base_b)) if not side.above]
        if low:  # a comparison against a floor says nothing of the methods
            at_chance(row, f"{' and '.join(low)} not above chance by the 95 % interval ({row.sides})")
        row.ours = diffs[0]  # the tables' number printed (the estimate's point: the same mean, summed otherwise)

    def _seeds_only(self, row: LedgerRow, col: ColumnConfig, sets: list[str], *sides: tuple[str, list[str]]
                    ) -> None:
        """A score with no test examples to resample (NEMD: a mean of transport costs over class pairs): the
        seeds' spread alone, the pooled two-sample t interval, where a side has two or more runs; one run a
        side: the tables' point, no interval, the direction :data:`~protoclip.claims.ledger.ONE_VALUE`."""
        values = []
        for base, runs in sides:
            v = [self.results.value(r, col.task, d, col.metric) for r in runs for d in sets]
            if any(x is None for x in v):
                raise NotRun(f"{base}: no {col.task} {col.metric} on {' + '.join(sets)} for every seed")
            values.append(np.asarray(v, dtype=np.float64).reshape(len(runs), len(sets)).mean(axis=1))
            row.families[(col.task, col.metric, f"{base} on {' + '.join(sets)}")] = values[-1]
        (pa, pb), ours, c = values, row.ours, row.claim
        row.units, row.unit_name = len(sets), "sets (no test examples to resample)"
        if max(len(pa), len(pb)) > 1:
            self._estimate(row, combine(pa, pb, pa[:, None], pb[:, None], "difference"))
            row.seed_note, row.ours = "the seeds' spread alone: no test examples to resample", ours
            return
        row.direction = ledger.ONE_VALUE if c.direction != "none" else ledger.NOT_TESTED
        row.magnitude = ledger.NOT_RESOLVED if c.magnitude != "none" else ledger.NOT_TESTED
        row.magnitude_why = "one value a side, no interval" if c.magnitude != "none" else ""
        row.seed_note = f"one run a side and no test examples to resample ({col.task} {col.metric}): no interval"

    def _gain(self, claim: ClaimConfig, target: TargetConfig, base_a: str, base_b: str, runs_a: list[str],
              runs_b: list[str], row: LedgerRow) -> None:
        """Two gains compared ("more advantage in kNN than in linear probing"): (a - b on the first column) -
        (a - b on the second), each run's two scores on the same test images resampled together (the same
        resample counts per set), the seeds' spread of the per-run differences."""
        columns, diffs, _ = self._columns(claim, target, base_a, base_b, runs_a, runs_b)
        parts = [self.column_parts(runs_a, runs_b, col, sets) for col, sets in columns]
        (est0, n, pa0, pb0, sides0, da0, db0), (_, _, pa1, pb1, sides1, da1, db1) = parts
        for (col, sets), pa, pb in zip(columns, (pa0, pa1), (pb0, pb1)):  # each column's seeds, for task_spread
            on = " + ".join(sets)
            row.families.update({(col.task, col.metric, f"{base_a} on {on}"): pa,
                                 (col.task, col.metric, f"{base_b} on {on}"): pb})
        names = [f"{base} {col.task}" for col, _ in columns for base in (base_a, base_b)]
        row.sides = "; ".join(side.text(name) for side, name in zip(sides0 + sides1, names))
        (c0, s0), (c1, s1) = columns
        row.measured = (f"{c0.task} {c0.metric} on {' + '.join(s0)} minus {c1.task} {c1.metric} on "
                        f"{' + '.join(s1)}: gains {ledger.signed(diffs[0])} and {ledger.signed(diffs[1])}")
        row.units, row.seeds_run = n, min(len(runs_a), len(runs_b))
        self._estimate(row, combine(pa0 - pa1, pb0 - pb1, da0 - da1, db0 - db1, "difference"))
        row.ours = diffs[0] - diffs[1]
        low = [name for side, name in zip(sides0 + sides1, names) if not side.above]
        if low:
            at_chance(row, f"{' and '.join(low)} not above chance by the 95 % interval ({row.sides})")

    def _count(self, claim: ClaimConfig, target: TargetConfig, base_a: str, base_b: str, runs_a: list[str],
               runs_b: list[str], row: LedgerRow) -> None:
        """The number of sets where a - b has the paper's sign: its direction by the sign test over the sets
        (:func:`judge`), its interval the percentiles of that number under the sets' example resamples with
        each set's seed level added (normal, its seed variance), which the magnitude holds against the paper's
        count. Printed beside it, as in the replicability analysis of Dror et al. (2017): the sets significant
        each on their own (one-sided 2.5 %, Holm over the sets) on either side. A set where either side is
        not above chance by its interval carries no sign: it is left out of the sign test (and named)."""
        columns, diffs, _ = self._columns(claim, target, base_a, base_b, runs_a, runs_b)
        sign = claim_sign(claim)
        p_same, p_other, units, floor = [], [], 0, []
        for (col, sets), diff in zip(columns, diffs):
            est, n, pa, pb, sides, *_ = self.column_parts(runs_a, runs_b, col, sets)
            if not all(side.above for side in sides):
                floor.append(" + ".join(sets))
            on = " + ".join(sets)
            row.families.update({(col.task, col.metric, f"{base_a} on {on}"): pa,
                                 (col.task, col.metric, f"{base_b} on {on}"): pb})
            row.set_estimates.append((est, diff))
            p_same.append(est.p_one_sided(sign))
            p_other.append(est.p_one_sided(-sign))
            units += n
        row.units, n_sets = units, len(columns)
        judged = [d for d, (_, sets) in zip(diffs, columns) if " + ".join(sets) not in floor]
        row.count_signs = (int(sum(sign * d > 0 for d in judged)), int(sum(sign * d < 0 for d in judged)))
        row.task_metric, row.seeds_run = (columns[0][0].task, columns[0][0].metric), min(len(runs_a), len(runs_b))
        adj_same, adj_other = holm(p_same), holm(p_other)

        def bounds(alpha: float) -> tuple[float, float]:
            return float(sum(p <= alpha for p in adj_same)), float(n_sets - sum(p <= alpha for p in adj_other))

        held_lo, held_hi = bounds(HOLM_ALPHA)
        # the count's own interval (its magnitude against the paper's count): the sets ahead under each example
        # resample, each set's seed level added as a normal draw of its seed variance; percentiles
        rng = np.random.default_rng(self.settings.seed)
        draws = np.zeros(len(row.set_estimates[0][0].draws))
        for (est, _), (_, sets) in zip(row.set_estimates, columns):
            if " + ".join(sets) not in floor:
                seed_sd = math.sqrt(sum(v for v, _ in est.seed_terms))
                draws += sign * (est.draws + rng.normal(0.0, seed_sd, len(est.draws))) > 0
        tail = 1.0 - self.settings.confidence
        lo, hi, lo90, hi90 = (float(v) for v in np.quantile(draws, [tail / 2, 1 - tail / 2, tail, 1 - tail]))
        first = columns[0][0]
        ahead, behind = row.count_signs
        row.ours = float(ahead)
        row.measured = (f"{first.task} {first.metric} on {n_sets} sets; ahead on {ahead}, behind on {behind} "
                        f"(sign test p = {ledger.sign_test(ahead, behind):.2g}); {int(held_lo)} of {n_sets} "
                        f"significant on the paper's side and {n_sets - int(held_hi)} on the other, each on its own "
                        "after Holm over the sets") + (f"; at chance, no sign: {', '.join(floor)}" if floor else "")
        seeded = len(runs_a) > 1 and len(runs_b) > 1
        row.seed_note = "" if seeded else ledger.ONE_SEED if max(len(runs_a), len(runs_b)) == 1 else \
            "one family has one seed: its seed spread taken from the other"
        self._judge(row, seeded, lo, hi, lo90, hi90)
        if len(floor) == n_sets:
            at_chance(row, f"every set has a side not above chance by its 95 % interval ({', '.join(floor)})")

    def _cost(self, claim: ClaimConfig, runs_a: list[str], runs_b: list[str], row: LedgerRow) -> None:
        """Share (paired within each run: a phase's seconds over the training phase's, the same episodes),
        overhead or time ratio (between runs; repeated runs' spread where the row has several seeds) from the
        train logs' per-episode phase times."""
        def times(run: str) -> dict[str, np.ndarray]:
            t = episode_times(self.results.layout.train_log(run))
            if t is None or not np.isfinite(t["total"]).all() or t["total"].sum() <= 0:
                raise NotRun(f"{run}: no episode times in its train log")
            return t

        if claim.kind == "share":
            units = []
            for r in runs_a:
                t = times(r)
                if t["train"].sum() <= 0:
                    raise NotRun(f"{r}: no training-phase time in its train log")
                units.append(Units(t[claim.phase][None], t["train"][None], np.array([100.0])))
            comp = Component(units, paired=False, key="episodes")
            stat = "single"
            row.runs = row.runs.split(" vs ")[0]  # a share within each run of a: no baseline run
            row.measured = (f"{claim.phase} seconds in % of the training phase's seconds, the same episodes of "
                            "each run (train_log.jsonl)")
        else:
            per_epoch = claim.kind == "overhead"

            def units(run: str) -> Units:
                t = times(run)
                n = len(t["total"])
                return Units.mean(t["total"], scale=n / self.cfg.run(run).epochs if per_epoch else float(n))

            comp = Component([units(r) for r in runs_a], [units(r) for r in runs_b], paired=False,
                             key="episodes")
            stat = "overhead" if per_epoch else "ratio"
            row.measured = ("time per epoch, % more than the baseline's" if per_epoch else
                            "total training time in % of the baseline's") + " (train_log.jsonl episode times)"
        (da, db), = resample_runs([comp], self.settings.resamples, self.settings.seed)
        pa = np.array([u.value()[0] for u in comp.a])
        pb = np.array([u.value()[0] for u in comp.b]) if comp.b else None
        row.units, row.unit_name = comp.a[0].n, "episodes per run"
        self._estimate(row, combine(pa, pb, da, None if stat == "single" else db, stat))
        if len(runs_a) == 1 and (stat == "single" or len(runs_b) == 1):
            row.seed_note = "one run a side: episodes only, the spread between repeated runs not measured"

    def _why_empty(self, note: str, runs: list[str], col: ColumnConfig, sets: list[str]) -> str:
        """The one-line reason of an empty cell: the first skip line of its runs' result files, or the note."""
        for r in runs:
            # a set whose data is missing has no evaluation folder: `collect` put its skip line in metrics.json
            summary = self.results.summary(r).get(col.task, {})
            for d in sets:
                result = self.results.metrics(r, col.task, d) or summary.get(d)
                if (line := records.skip_line(result)) is not None:
                    more = sum(self.results.value(r, col.task, x, col.metric) is None for x in sets) - 1
                    return line + (f" (and {more} more of {len(sets)} sets)" if more > 0 else "")
        return {"no result": f"no result of {col.task} {col.metric} on {' + '.join(sets)} for {', '.join(runs)}"
                }.get(note, note or "no result")


def _group(base: str, runs: list[str]) -> str:
    return f"{base} ({len(runs)} seed{'s' if len(runs) != 1 else ''})"


# --------------------------------------------------------------------------- outputs
_NO_CLAIM = ClaimConfig(id="none", paper="", source="", line=0, where="", quote="", paper_value=None, paper_text="",
                        unavailable="none")


def ledger_frame(rows: list[LedgerRow]) -> pd.DataFrame:
    return pd.DataFrame([r.record() for r in rows])


def _magnitude_cell(r: LedgerRow) -> str:
    if r.magnitude in (ledger.NOT_RUN, ledger.NOT_TESTED):
        return r.magnitude
    iv = f": 90 % {r._fmt(r.ours, r.lo90, r.hi90)}" if r.lo90 is not None else ""  # none: a point only
    return f"{r.magnitude}{iv}" + (f"; {r.magnitude_why}" if r.magnitude_why else "")


def _paper_cell(c: ClaimConfig) -> str:
    if c.margin is None:  # no magnitude test (or a claim no target can test)
        return c.paper_text
    if c.magnitude == "equivalence":
        return (f"{c.paper_text} (m = {c.margin:.4g}: [{c.paper_value - c.margin:.4g}, "
                f"{c.paper_value + c.margin:.4g}])")
    if c.magnitude in ("at_most", "at_least"):
        return f"{c.paper_text} ({'<=' if c.magnitude == 'at_most' else '>='} {c.bound():.4g})"
    return c.paper_text


def _display(rows: list[LedgerRow], confidence: float) -> pd.DataFrame:
    """The ledger as people read it: one line per claim."""
    return pd.DataFrame([{
        "claim": r.claim.id, "paper": f"{r.claim.paper}, {r.claim.where} (line {r.claim.line})"
        + "".join(f"; {a.where} (line {a.line})" for a in r.claim.also),
        "paper's number (margin)": _paper_cell(r.claim) + (
            f"; the seed spread in its interval: {r.spread}" if r.spread and r.claim.margin is not None else ""),
        f"ours [{confidence:.0%} interval]": r.ours_text() + ("" if r.ours is None else f" {r.unit}")
        + (f" ({r.seed_note})" if r.seed_note else ""),
        "verdict": r.verdict + (f": {r.reason}" if r.reason else ""),
        "direction (Holm within the paper)": r.direction + (
            f" (Holm-adjusted p = {r.p_holm:.2g} over {r.claim.paper}'s claims; the interval alone: "
            f"{r.raw_direction})" if r.p_holm is not None else
            f" (the interval alone: {r.raw_direction})" if r.direction == ledger.NOT_DECISIVE else ""),
        "each side vs chance": r.sides or "-",
        "magnitude": _magnitude_cell(r),
        "what it would take": r.needs or "-",
        "runs; metric": "; ".join(x for x in (r.runs, r.measured) if x)} for r in rows])


def rule_text(cfg: ReportProject) -> str:
    s = cfg.claims
    scale = ("runs at the papers' scale (claims.paper_scale: true)" if s.paper_scale else
             "runs at a scale the papers did not use (claims.paper_scale: false): directions can be reproduced "
             "here, magnitudes cannot")
    return (f"Ours: the tables' number (difference of the two rows' means over seeds) with its {s.confidence:.0%} "
            f"interval: seeds with a small-sample t correction combined with the test examples' bootstrap "
            f"({s.resamples} resamples, seed {s.seed}; paired; retrieval: images with their captions; cost "
            "claims: training episodes, shares paired within each run; protoclip.claims.intervals). Two "
            f"questions per claim: direction, {ledger.RULES['direction']} (counts: {ledger.RULES['sign test']}); "
            f"magnitude against the paper's number with the margin m of claims.yaml, "
            f"{ledger.RULES['equivalence']}; the paper's one-sided words (\"only\", \"negligible\", \"less than\"), "
            f"{ledger.RULES['at_most']}. "
            f"{ledger.RULES['gate'].capitalize()}. Decisive: {ledger.RULES['decisive']}. Chance: "
            f"{ledger.RULES['chance']}. Holm: {ledger.RULES['holm']}. One value: {ledger.RULES['one value']}. "
            f"This ledger: {scale}. Not run: {ledger.RULES['not run']}.")


def write_ledger(cfg: ReportProject, rows: list[LedgerRow]) -> dict[str, Path]:
    """``claims.{md,csv,tex,html,json}``, the forest plot and its caption; returns the paths by suffix."""
    lay = Layout.from_config(cfg)
    md, csv, tex, htm, js, png, rst = lay.claims_files()
    frame, shown = ledger_frame(rows), _display(rows, cfg.claims.confidence)
    summary = summary_text(rows)
    head = f"**Claims ledger.** {summary}. {rule_text(cfg)}"
    body = shown.to_markdown(index=False, disable_numparse=True) if rows else "(no claims configured)"
    write_text(md, f"{head}\n\n{body}\n")
    if not rows:  # no claim configured: the files still exist (DVC and Snakemake outputs), with their header
        frame = pd.DataFrame(columns=list(LedgerRow(_NO_CLAIM).record()))
        shown = pd.DataFrame(columns=["claim", "verdict"])
    with atomic_path(csv) as tmp:
        frame.to_csv(tmp, index=False)
    with atomic_path(tex) as tmp:
        shown.to_latex(tmp, index=False, caption=head.replace("**", ""), label="tab:claims", escape=True,
                       longtable=True)
    write_text(htm, f"<p>{html.escape(head.replace('**', ''))}</p>\n"
               + shown.to_html(classes="paper-table", border=1, index=False) + "\n")
    records.write_claims(js, {r.claim.id: {
        "ours": r.ours, "ci_low": r.lo, "ci_high": r.hi, "ci90_low": r.lo90, "ci90_high": r.hi90,
        "paper": r.claim.paper_value, "margin": r.claim.margin, "p_holm": r.p_holm, "verdict": r.verdict,
        "direction": r.direction, "magnitude": r.magnitude} for r in rows})
    forest_plot(rows, png)
    write_text(rst, rst_escape(f"Claims ledger: each claim's paper number (red diamond) and its margin (red band) "
                               f"beside our estimate with its 95 % (thin) and 90 % (thick) intervals, one panel per "
                               f"unit. {summary}. {rule_text(cfg)}") + "\n")
    return {"md": md, "csv": csv, "tex": tex, "html": htm, "json": js, "png": png, "rst": rst}


COLORS = {ledger.REPRODUCED: "#2a9d4b", ledger.CONTRADICTED: "#c0392b", ledger.NOT_RESOLVED: "#7f7f7f",
          ledger.NOT_TESTED: "#7f7f7f", ledger.NOT_RUN: "#bbbbbb", ledger.NOT_DECISIVE: "#7f7f7f",
          ledger.ONE_VALUE: "#7f7f7f",
          ledger.AT_CHANCE: "#bbbbbb"}


def forest_plot(rows: list[LedgerRow], out: Path) -> Path:
    """Each claim's paper number and margin beside our estimate and intervals, one panel per unit (points, %
    of time, sets); the verdict in words at the right, coloured by the direction (or the magnitude)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = {u: [r for r in rows if r.unit == u] for u in dict.fromkeys(r.unit for r in rows)} or {"points": []}
    heights = [max(len(g), 1) for g in groups.values()]
    fig, axes = plt.subplots(len(groups), 1, figsize=(11, 1.2 + 0.36 * sum(heights) + 0.6 * len(groups)),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    for ax, (unit, group) in zip(axes[:, 0], groups.items()):
        y = np.arange(len(group))[::-1]
        for yi, r in zip(y, group):
            c = r.claim
            color = COLORS[r.direction if r.direction != ledger.NOT_TESTED else r.magnitude]
            if c.margin is None:
                pass
            elif c.magnitude == "equivalence":
                ax.plot([c.paper_value - c.margin, c.paper_value + c.margin], [yi, yi], color="#d62728", lw=7,
                        alpha=0.15, solid_capstyle="butt")
            elif c.magnitude in ("at_most", "at_least"):
                ax.plot([c.bound()], [yi], "|", color="#d62728", ms=14, mew=2, alpha=0.6)
            if r.ours is not None and r.lo is not None:
                ax.plot([r.lo, r.hi], [yi, yi], color="black", lw=1.2, solid_capstyle="butt")
                if r.lo90 is not None:
                    ax.plot([r.lo90, r.hi90], [yi, yi], color="black", lw=3.5, solid_capstyle="butt")
                measured = r.estimate.seed_measured if r.estimate is not None else not r.seed_note
                ax.plot(r.ours, yi, "o", color="black" if measured else "white", mec="black", ms=5)
            elif r.ours is not None:  # a point without an interval (not run: nothing to resample)
                ax.plot(r.ours, yi, "o", mfc="none", mec="#888888", ms=5)
            if c.paper_value is not None:
                ax.plot(c.paper_value, yi, "D", color="#d62728", ms=6, alpha=0.85)
            ax.annotate(r.verdict, (1.01, yi), xycoords=("axes fraction", "data"), va="center", fontsize=7,
                        color=color)
        if unit == "points":
            ax.axvline(0.0, color="#888888", lw=0.8, ls="--")
        if unit == "sets":  # a count over N sets: the whole range, half marked (the count rule)
            n = max(len(r.claim.columns) for r in group)
            ax.set_xlim(-0.5, n + 0.5)
            ax.axvline(n / 2.0, color="#888888", lw=0.8, ls="--")
        ax.set_yticks(y, [r.claim.id for r in group], fontsize=8)
        ax.set_ylim(-0.7, max(len(group), 1) - 0.3)
        ax.set_xlabel(unit, fontsize=9)
        ax.grid(axis="x", color="#eeeeee")
    axes[0, 0].set_title("Claims: the paper's number (red diamond; band: [paper - m, paper + m]; bar: a one-sided "
                         "bound)\nvs ours (95 % interval thin, 90 % thick; hollow point: seed spread not measured)",
                         fontsize=8)
    fig.tight_layout()
    fig.subplots_adjust(right=0.72)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return out


def run_ledger(cfg: ReportProject, results: Results, engine: ClaimEngine | None = None) -> tuple[list[LedgerRow], dict]:
    """Every configured claim evaluated and written; returns the rows and the files."""
    engine = engine or ClaimEngine(cfg, results)
    rows = finish([engine.evaluate(c) for c in cfg.paper_claims()], engine.settings)
    for r in rows:
        log.info("claim %s: %s%s (%.1f s)", r.claim.id, r.verdict, f" ({r.reason})" if r.reason else "",
                 r.seconds)
    return rows, write_ledger(cfg, rows)


def log_ledger(cfg: ReportProject, tracker) -> None:
    """Each claim's result into a ``claims`` MLflow run (protoclip.tracking.claims_run): tags per claim (its
    verdict in words, and each question's: filter the runs table with
    ``tags.`protoclip.claim.cc_linear_32ep.direction` = 'reproduced'``), our estimate, intervals, the paper's
    number and margin and the Holm-adjusted p as metrics, the ledger files as artifacts."""
    lay = Layout.from_config(cfg)
    ledger_json = lay.claims_files()[4]
    if not ledger_json.exists():
        return
    claims = records.read_claims(ledger_json)
    tags = {}
    for cid, c in claims.items():
        tags[f"protoclip.claim.{cid}"] = c["verdict"]
        for q in ("direction", "magnitude"):
            if c.get(q):
                tags[f"protoclip.claim.{cid}.{q}"] = c[q]
    tracker.set_tags(tags)
    metrics = {}
    for cid, c in claims.items():
        for key in ("ours", "ci_low", "ci_high", "ci90_low", "ci90_high", "paper", "margin", "p_holm"):
            if isinstance(c.get(key), (int, float)) and math.isfinite(c[key]):
                metrics[f"claim/{cid}/{key}"] = float(c[key])
    tracker.log_metrics(metrics)
    for path in lay.claims_files()[:6]:
        tracker.log_artifact(path, "claims")


__all__ = ["ClaimEngine", "LedgerRow", "NotRun", "metric_units", "run_ledger", "write_ledger", "forest_plot",
           "log_ledger", "rule_text", "finish", "needs_text", "summary_text"]
