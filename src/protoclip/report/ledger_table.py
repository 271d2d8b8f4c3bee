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
(protoclip.claims.intervals). The rules: protoclip.claims.ledger (direction on the 95 % interval, magnitude by
two one-sided tests on the 90 % interval against the paper's number with claims.yaml's margin, never decided
off the paper's scale or from one seed a side). Ledger-wide: Holm's adjustment over the direction tests, and
for each direction left not resolved, the seeds a side (and test examples) that would resolve it with 80 %
power. A claim whose runs, data or per-example results are absent reads "not run" with the reason.

    engine = ClaimEngine(cfg, Results(cfg))
    rows = finish([engine.evaluate(c) for c in cfg.paper_claims()])
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
from protoclip.claims.intervals import Estimate, combine, holm
from protoclip.files.layout import Layout
from protoclip.report.paper_targets import ColumnConfig, ReportProject, TargetConfig, first_configured
from protoclip.report.values import Results, episode_times
from protoclip.tasks import task_names

log = logging.getLogger(__name__)

UNITS = {"difference": "points", "count": "sets", "share": "% of time", "overhead": "% of time",
         "time_ratio": "% of time"}
RECALL = re.compile(r"(image_to_text|text_to_image)_R@(\d+)")


class NotRun(Exception):
    """Why a claim (or an interval) cannot be decided: its one-line reason."""


def metric_units(task: str, metric: str, examples: dict[str, np.ndarray]) -> Units | RandIndex | MutualInfo | None:
    """The resampling units of ``metric`` from a task's per-example arrays (records.read_examples); None when the
    metric has no resampling unit here (AMI, NEMD, ...). With every unit drawn once it is the metrics file's
    number. Clustering ``ari`` / ``ami``: the test images with their fixed k-means assignments (:class:`RandIndex`,
    :class:`MutualInfo`).

    zero-shot / linear / kNN ``top1`` / ``top5``: the mean hit of the test images; retrieval ``<dir>_R@k`` and
    ``mean_recall``: units are the images, each with its captions (image queries: hit or not; caption queries:
    the image's captions hit, over its number of captions), so an image is drawn together with its captions."""
    if task in task_names(lambda t: t.examples == "hits"):
        return Units.mean(examples[metric]) if metric in ("top1", "top5") and metric in examples else None
    if task == "clustering":
        unit = {"ari": RandIndex, "ami": MutualInfo}.get(metric)
        return unit(examples["cluster"], examples["labels"]) if unit is not None and "cluster" in examples else None
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


@dataclass
class LedgerRow:
    """One claim as the ledger prints it: the two questions' verdicts and what they rest on."""
    claim: ClaimConfig
    direction: str = ledger.NOT_RUN
    magnitude: str = ledger.NOT_RUN
    reason: str = ""  # not run: why
    magnitude_why: str = ""  # a magnitude left not resolved by the gate (offline scale, one seed): why
    ours: float | None = None  # our point estimate (the tables' number), in the claim's unit
    lo: float | None = None  # the 95 % interval (the direction question)
    hi: float | None = None
    lo90: float | None = None  # the 90 % interval (the magnitude question)
    hi90: float | None = None
    p: float | None = None  # the direction test's one-sided p-value
    p_holm: float | None = None  # Holm-adjusted over the ledger's direction tests
    seed_note: str = ""  # "examples only, seed spread not measured", ...
    needs: str = ""  # what it would take (direction not resolved)
    runs: str = ""  # "protoclip_tiny (3 seeds) - clip_tiny (3 seeds)"
    measured: str = ""  # "linear top1 on fashion_mnist (ImageNet linear: imagenet -> fashion_mnist)"
    units: int = 0  # test examples (or episodes) the interval resamples, summed over sets
    unit_name: str = "test examples"
    seconds: float = 0.0  # wall time to compute the row
    estimate: Estimate | None = dataclasses.field(default=None, repr=False)
    set_estimates: list = dataclasses.field(default_factory=list, repr=False)  # a count: (Estimate, a - b) per set

    @property
    def unit(self) -> str:
        if self.claim.kind == "difference" and self.measured.split(" ")[0] in task_names(lambda t: t.score):
            return "score (ARI, AMI, NEMD)"  # not percentages: their own panel
        return UNITS[self.claim.kind]

    @property
    def verdict(self) -> str:
        return ledger.verdict_text(self.direction, self.magnitude)

    @property
    def holm(self) -> str:
        """The direction verdict after Holm's adjustment ("" when no direction test ran)."""
        if self.p_holm is None:
            return ""
        return ledger.REPRODUCED if self.p_holm < HOLM_ALPHA and self.direction == ledger.REPRODUCED else \
            ledger.NOT_RESOLVED if self.direction != ledger.CONTRADICTED else ledger.CONTRADICTED

    def _fmt(self, point, lo, hi) -> str:
        signed = self.claim.kind in ("difference", "overhead")
        digits = 0 if self.claim.kind == "count" else 2
        if lo is None:
            return ledger.signed(point, digits) if signed else f"{point:.{digits}f}"
        return ledger.with_interval(point, lo, hi, digits, sign=signed)

    def ours_text(self) -> str:
        return "-" if self.ours is None else self._fmt(self.ours, self.lo, self.hi)

    def rules(self) -> str:
        c = self.claim
        if self.direction == ledger.NOT_RUN:
            return ledger.RULES["not run"]
        out = []
        if c.direction != "none":
            out.append("direction: " + ledger.RULES["count" if c.kind == "count" else "direction"])
        if c.magnitude != "none":
            out.append("magnitude: " + ledger.RULES[c.magnitude])
        return "; ".join(out)

    def record(self) -> dict:
        c = self.claim
        return {"id": c.id, "paper": c.paper, "where": c.where, "source": c.source, "line": c.line,
                "quote": c.quote, "also": "; ".join(f"{a.where} (line {a.line}): {a.quote}" for a in c.also),
                "paper_value": c.paper_value, "paper_text": c.paper_text, "kind": c.kind, "unit": self.unit,
                "direction_claimed": c.direction, "magnitude_test": c.magnitude, "margin": c.margin,
                "margin_why": c.margin_why, "ours": self.ours, "ci_low": self.lo, "ci_high": self.hi,
                "ci90_low": self.lo90, "ci90_high": self.hi90, "ours_text": self.ours_text(),
                "direction": self.direction, "magnitude": self.magnitude, "verdict": self.verdict,
                "magnitude_why": self.magnitude_why, "p_one_sided": self.p, "p_holm": self.p_holm,
                "holm": self.holm, "seed_note": self.seed_note, "needs": self.needs, "reason": self.reason,
                "rule": self.rules(), "runs": self.runs, "measured": self.measured, "note": c.note,
                "seconds": round(self.seconds, 3)}


HOLM_ALPHA = 0.025  # one-sided, the two-sided 95 % interval's side
# The effect "what it would take" plans for when our estimate is on the wrong side of 0 and the paper prints no
# number (a figure's bars): the smallest accuracy difference the ledger's margins count (claims.yaml's
# max(1 point, half the paper's difference)).
PLANNING_FLOOR = {"points": 1.0}
# AMI's resamples each recompute the expected mutual information (MutualInfo): seconds each at ImageNet's 1,000
# classes, so a run and set whose resampling would take longer than this is "not run", saying how long. The time
# is estimated from the sums' terms (MutualInfo.emi_terms) at EMI_TERMS_PER_S, not timed, so that the verdict
# does not depend on the machine's load (sklearn's loop, one core of the 2-core dev machine: 1.7e7 terms/s)
AMI_BUDGET_S = 600
EMI_TERMS_PER_S = 1.7e7


class ClaimEngine:
    """Intervals and verdicts from a project's result files (one per report: per-example arrays are cached)."""

    def __init__(self, cfg: ReportProject, results: Results):
        self.cfg, self.results = cfg, results
        self.settings = cfg.claims
        self._units: dict[tuple, tuple[Units, np.ndarray]] = {}
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
        units = metric_units(task, metric, examples)
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
        comps = self.column_components(runs_a, runs_b, column, sets)
        per_run = resample_runs(comps, self.settings.resamples, self.settings.seed, self._counts)
        pa = np.mean([[u.value()[0] for u in c.a] for c in comps], axis=0)
        pb = np.mean([[u.value()[0] for u in c.b] for c in comps], axis=0)
        da = np.mean([a for a, _ in per_run], axis=0)
        db = np.mean([b for _, b in per_run], axis=0)
        return combine(pa, pb, da, db, "difference"), sum(c.a[0].n for c in comps)

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
            target = self.target(claim)
            base_a, runs_a = self.family(target, claim.a, claim.a_runs)
            base_b, runs_b = self.family(target, claim.b, claim.b_runs)
            row.runs = f"{_group(base_a, runs_a)} vs {_group(base_b, runs_b)}"
            if claim.kind == "difference":
                self._difference(claim, target, base_a, base_b, runs_a, runs_b, row)
            elif claim.kind == "count":
                self._count(claim, target, base_a, base_b, runs_a, runs_b, row)
            else:
                self._cost(claim, runs_a, runs_b, row)
        except NotRun as why:
            row.direction = row.magnitude = ledger.NOT_RUN
            row.reason = str(why)
        row.seconds = time.perf_counter() - t0
        return row

    def _judge(self, row: LedgerRow, seed_measured: bool, lo95: float, hi95: float, lo90: float, hi90: float
               ) -> None:
        """Both questions from the intervals (protoclip.claims.ledger)."""
        c = row.claim
        row.lo, row.hi, row.lo90, row.hi90 = lo95, hi95, lo90, hi90
        if c.direction == "none":
            row.direction = ledger.NOT_TESTED
        elif c.kind == "count":
            row.direction = ledger.count_verdict(lo95, hi95, len(c.columns))
        else:
            row.direction = ledger.direction_verdict(_sign(c), lo95, hi95)
        if c.magnitude == "none":
            row.magnitude = ledger.NOT_TESTED
        else:
            raw = ledger.magnitude_verdict(c.magnitude, lo90, hi90, c.paper_value, c.margin)
            row.magnitude, row.magnitude_why = ledger.gate_magnitude(raw, self.settings.paper_scale, seed_measured)

    def _estimate(self, row: LedgerRow, est: Estimate) -> None:
        row.estimate, row.ours, row.seed_note = est, est.point, est.seed_note
        lo, hi = est.interval(self.settings.confidence)
        lo90, hi90 = est.interval(1.0 - 2.0 * (1.0 - self.settings.confidence))
        if row.claim.direction != "none":
            row.p = est.p_one_sided(_sign(row.claim))
        self._judge(row, est.seed_measured, lo, hi, lo90, hi90)

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
        est, row.units = self.column_estimate(runs_a, runs_b, col, sets)
        self._estimate(row, est)
        row.ours = diffs[0]  # the tables' number printed (the estimate's point: the same mean, summed otherwise)

    def _count(self, claim: ClaimConfig, target: TargetConfig, base_a: str, base_b: str, runs_a: list[str],
               runs_b: list[str], row: LedgerRow) -> None:
        """The number of sets where a - b has the paper's sign, bounded as in the replicability analysis of
        Dror et al. (2017): each set's own one-sided test (its interval: seeds with the t correction, examples
        bootstrapped), Holm over the sets; the lower bound is the number of sets significant on the paper's side,
        the upper bound N minus those significant on the other side (valid under any dependence between sets,
        e.g. shared seeds). At 2.5 % a side for the 95 % interval, 5 % for the 90 %."""
        columns, diffs, _ = self._columns(claim, target, base_a, base_b, runs_a, runs_b)
        sign = _sign(claim)
        p_same, p_other, units = [], [], 0
        for (col, sets), diff in zip(columns, diffs):
            est, n = self.column_estimate(runs_a, runs_b, col, sets)
            row.set_estimates.append((est, diff))
            p_same.append(est.p_one_sided(sign))
            p_other.append(est.p_one_sided(-sign))
            units += n
        row.units, n_sets = units, len(columns)
        row.ours = float(sum(sign * d > 0 for d in diffs))
        adj_same, adj_other = holm(p_same), holm(p_other)

        def bounds(alpha: float) -> tuple[float, float]:
            return float(sum(p <= alpha for p in adj_same)), float(n_sets - sum(p <= alpha for p in adj_other))

        (lo, hi), (lo90, hi90) = bounds(HOLM_ALPHA), bounds(2 * HOLM_ALPHA)
        # the p-value of "more than half the sets": Holm's adjusted p of the (floor(N/2) + 1)-th smallest
        need = n_sets // 2 + 1
        row.p = float(sorted(adj_same)[need - 1])
        first = columns[0][0]
        row.measured = (f"{first.task} {first.metric} on {n_sets} sets; {int(lo)} of {n_sets} significant on the "
                        f"paper's side and {n_sets - int(hi)} on the other, on their own after Holm over the sets")
        seeded = len(runs_a) > 1 and len(runs_b) > 1
        row.seed_note = "" if seeded else ledger.ONE_SEED if max(len(runs_a), len(runs_b)) == 1 else \
            "one family has one seed: its seed spread taken from the other"
        self._judge(row, seeded, lo, hi, lo90, hi90)

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


def _sign(claim: ClaimConfig) -> float:
    return -1.0 if claim.direction == "negative" else 1.0


def _group(base: str, runs: list[str]) -> str:
    return f"{base} ({len(runs)} seed{'s' if len(runs) != 1 else ''})"


# --------------------------------------------------------------------------- outputs
_NO_CLAIM = ClaimConfig(id="none", paper="", source="", line=0, where="", quote="", paper_value=None, paper_text="",
                        unavailable="none")


def finish(rows: list[LedgerRow]) -> list[LedgerRow]:
    """The ledger-wide steps: Holm's adjustment over the direction tests that ran, and, for each direction left
    not resolved, what it would take (:func:`needs_text`)."""
    tested = [r for r in rows if r.p is not None]
    for r, adj in zip(tested, holm([r.p for r in tested])):
        r.p_holm = adj
    for r in rows:
        if r.direction == ledger.NOT_RESOLVED:
            r.needs = needs_text(r, rows)
    return rows


def _seed_fallback(row: LedgerRow, rows: list[LedgerRow], kind: str | None = None) -> tuple[float | None, str]:
    """A per-seed variance for a row whose seed spread is not measured: the median over the ledger's rows of the
    same kind (``kind``, default the row's) and task that measured theirs (else of the same kind), and which rows
    those were."""
    task = row.measured.split(" ")[0]
    measured = [r for r in rows if r.estimate is not None and r.estimate.seed_measured and r.claim.kind ==
                (kind or row.claim.kind)]
    same = [r for r in measured if r.measured.split(" ")[0] == task] or measured
    if not same:
        return None, ""
    var = float(np.median([r.estimate.seed_var[0] for r in same]))
    return var, "seed spread of " + ", ".join(r.claim.id for r in same)


def needs_text(row: LedgerRow, rows: list[LedgerRow]) -> str:
    """What would resolve the direction: seeds a side (and test examples where the test set is the limit) at
    which the one-sided 2.5 % test reaches the paper's side with 80 % power, at our measured seed and example
    variance; the effect is our estimate when it is on the paper's side, else the paper's own value, else (no
    number printed) :data:`PLANNING_FLOOR`."""
    est, c = row.estimate, row.claim
    if c.kind == "count":
        return _count_needs(row, rows)
    if est is None:
        return ""
    sign = _sign(c)
    if sign * row.ours > 0:
        effect, at = row.ours, f"our estimate {ledger.signed(row.ours)}"
    elif c.paper_value is not None:
        effect, at = c.paper_value, (f"our estimate is not on the paper's side of 0; at the paper's "
                                     f"{ledger.signed(c.paper_value)}")
    elif row.unit in PLANNING_FLOOR:
        effect = sign * PLANNING_FLOOR[row.unit]
        at = (f"our estimate is not on the paper's side of 0 and the paper prints no number; at "
              f"{ledger.signed(effect)}")
    else:
        return "our estimate is not on the paper's side of 0 and the paper prints no number to plan for"
    fallback, source = (None, "") if est.seed_measured else _seed_fallback(row, rows)
    n, k = est.seeds_needed(effect, fallback)
    sd = math.sqrt(est.seed_var[0] if est.seed_measured else (fallback or 0.0))
    spread = (f"seed sd {sd:.2f} {row.unit}" + (f" taken from {source}" if source else "")
              if est.seed_measured or fallback is not None else "")
    if n is None and not est.seed_measured and fallback is None:
        return f"{at}: the seed spread is not measured here; run 2 or more seeds a side to plan"
    more = f" and {k:g}x the {row.unit_name} ({row.units} -> {int(k * row.units)})" if k > 1 else ""
    count = f"{n} seeds a side{more}" if n is not None else f"more than 1000 seeds a side{more}"
    return f"{count} ({at} {row.unit}, {spread}, 80 % power)" if spread else f"{count} ({at}, 80 % power)"


def _count_needs(row: LedgerRow, rows: list[LedgerRow]) -> str:
    """What would resolve a count ("more than half of N sets"): it takes need = floor(N/2) + 1 sets significant
    on the paper's side after Holm over the sets, i.e. each of them at Holm's level for the need-th rejection,
    2.5 % / (N - need + 1), one-sided. Each set whose estimate is on the paper's side is planned as a difference
    (:meth:`Estimate.seeds_needed` at that level, 80 % power, its own effect and variance; one seed: the seed
    spread of the ledger's measured differences of the same task); the count's number is the need-th smallest.
    A plan, not a power calculation for the count itself (80 % for each of those sets, not for all at once)."""
    n_sets = len(row.set_estimates)
    if not n_sets:
        return ""
    need, sign = n_sets // 2 + 1, _sign(row.claim)
    alpha = 0.025 / (n_sets - need + 1)
    fallback, source = _seed_fallback(row, rows, kind="difference")
    plans, borrowed = [], False
    for est, diff in row.set_estimates:
        if sign * diff <= 0:
            continue  # not on the paper's side here: more seeds are not planned to turn it
        n, k = est.seeds_needed(diff, None if est.seed_measured else fallback, alpha=alpha)
        borrowed |= not est.seed_measured
        if n is not None:
            plans.append((n, k))
    on_side = sum(sign * d > 0 for _, d in row.set_estimates)
    if len(plans) < need:
        why = (f"only {on_side} of the {n_sets} sets are on the paper's side here" if on_side < need else
               "the seed spread is not measured here; run 2 or more seeds a side to plan" if fallback is None
               and any(not e.seed_measured for e, _ in row.set_estimates) else
               f"fewer than {need} sets reach it within 1000 seeds a side")
        return f"not planned: {need} of {n_sets} sets must each be significant, and {why}"
    n, k = sorted(plans)[need - 1]
    more = f" and {k:g}x the test examples" if k > 1 else ""
    spread = f"; seed spread taken from {source}" if borrowed and source else ""
    return (f"{n} seeds a side{more} ({need} of {n_sets} sets each significant at one-sided {100 * alpha:.2g} %, "
            f"Holm's level for the {need}th of {n_sets}, at our estimate per set, 80 % power each{spread})")


def ledger_frame(rows: list[LedgerRow]) -> pd.DataFrame:
    return pd.DataFrame([r.record() for r in rows])


def _magnitude_cell(r: LedgerRow) -> str:
    if r.magnitude in (ledger.NOT_RUN, ledger.NOT_TESTED):
        return r.magnitude
    iv = r._fmt(r.ours, r.lo90, r.hi90) if r.lo90 is not None else ""
    return f"{r.magnitude}: 90 % {iv}" + (f"; {r.magnitude_why}" if r.magnitude_why else "")


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
        "paper's number (margin)": _paper_cell(r.claim),
        f"ours [{confidence:.0%} interval]": r.ours_text() + ("" if r.ours is None else f" {r.unit}")
        + (f" ({r.seed_note})" if r.seed_note else ""),
        "verdict": r.verdict + (f": {r.reason}" if r.reason else ""),
        "direction (Holm)": r.direction + (
            f"; after Holm: {'holds' if r.holm == ledger.REPRODUCED else 'does not hold'} (adjusted p = "
            f"{r.p_holm:.2g})" if r.p_holm is not None and r.direction == ledger.REPRODUCED else ""),
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
            f"questions per claim: direction, {ledger.RULES['direction']} (counts: {ledger.RULES['count']}); "
            f"magnitude against the paper's number with the margin m of claims.yaml, "
            f"{ledger.RULES['equivalence']}; the paper's one-sided words (\"only\", \"negligible\", \"less than\"), "
            f"{ledger.RULES['at_most']}. "
            f"{ledger.RULES['gate'].capitalize()}. {ledger.RULES['holm']}. This ledger: {scale}. Not run: "
            f"{ledger.RULES['not run']}.")


def summary_text(rows: list[LedgerRow]) -> str:
    """Counts of distinct claims (each claim is one row; one claim printed twice by a paper is one row)."""
    ran = [r for r in rows if r.direction != ledger.NOT_RUN]
    parts = [f"{len(rows)} distinct claims, {len(rows) - len(ran)} not run"]
    for q in ("direction", "magnitude"):
        vals = [getattr(r, q) for r in ran if getattr(r, q) != ledger.NOT_TESTED]
        if vals:
            parts.append(f"{q} ({len(vals)} tested): " + ", ".join(f"{vals.count(v)} {v}" for v in ledger.OUTCOMES))
    holm_rep = sum(r.holm == ledger.REPRODUCED for r in ran)
    if any(r.p_holm is not None for r in ran):
        parts.append(f"after Holm over the {sum(r.p_holm is not None for r in ran)} direction tests, "
                     f"{holm_rep} reproduced")
    return "; ".join(parts)


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
    write_text(rst, _rst(f"Claims ledger: each claim's paper number (red diamond) and its margin (red band) "
                         f"beside our estimate with its 95 % (thin) and 90 % (thick) intervals, one panel per "
                         f"unit. {summary}. {rule_text(cfg)}") + "\n")
    return {"md": md, "csv": csv, "tex": tex, "html": htm, "json": js, "png": png, "rst": rst}


def _rst(text: str) -> str:
    return re.sub(r"([\\`*|_<>\[\]])", r"\\\1", " ".join(text.split()))


COLORS = {ledger.REPRODUCED: "#2a9d4b", ledger.CONTRADICTED: "#c0392b", ledger.NOT_RESOLVED: "#7f7f7f",
          ledger.NOT_TESTED: "#7f7f7f", ledger.NOT_RUN: "#bbbbbb"}


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
    rows = finish([engine.evaluate(c) for c in cfg.paper_claims()])
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
