"""The claim engine: each claim of the papers (config/claims.yaml) asked its two questions, direction and magnitude,
from our measured number and its intervals; also the intervals of the paper tables' difference rows. It reads the
results through the two objects it is handed (:class:`ClaimsProject`, :class:`ResultFiles`), so that claims/ imports
nothing above files/. How the claims modules fit together: docs/claims.md#protoclipclaimsengine.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from protoclip.claims import grid, ledger
from protoclip.claims.bootstrap import Component, CountsCache, MutualInfo, Units, resample_runs
from protoclip.claims.config import ClaimConfig, ClaimsConfig
from protoclip.claims.intervals import Estimate, combine, holm
from protoclip.claims.rows import HOLM_ALPHA, LedgerRow, NotRun, Side, Skipped, Unavailable, at_chance, claim_sign, \
    finish, judge, judge_estimate
from protoclip.claims.units import chance_of, examples_kind, init_variance, metric_units
from protoclip.files import records
from protoclip.tasks import TaskStatus


# a resolved paper target and one of its columns (protoclip.report.paper_targets.TargetConfig, ColumnConfig): the
# engine reads their ``id``, ``rows`` (``label``, ``run``), ``columns`` and a column's ``label``, ``task``, ``metric``
Target = Any
Column = Any


class ClaimsProject(Protocol):
    """What the engine reads of the project config (protoclip.project.ProjectConfig)."""

    claims: ClaimsConfig
    source: Any
    evaluate: Any  # its datasets' `tasks`: a task a set leaves out is skipped, not "not run"

    def paper_targets(self) -> list: ...
    def run_group(self, base: str) -> list[str]: ...
    def run(self, name: str) -> Any: ...


class ResultFiles(Protocol):
    """What the engine reads of the result files (protoclip.report.values.Results): the tables' cells and sets,
    each run's metrics and its files' ``layout``."""

    layout: Any

    def summary(self, run: str) -> dict: ...
    def metrics(self, run: str, task: str, dataset: str) -> dict | None: ...
    def value(self, run: str, task: str, dataset: str, metric: str) -> float | None: ...
    def column_sets(self, target: Target, column: Column) -> tuple[list[str], str]: ...
    def cell(self, base: str, column: Column, datasets: list[str]) -> Any: ...


@dataclass
class Interval:
    point: float
    lo: float
    hi: float



# AMI's resamples each recompute the expected mutual information (MutualInfo): seconds each at ImageNet's 1,000
# classes, so a run and set whose resampling would take longer than this is "not run", saying how long. The time
# is estimated from the sums' terms (MutualInfo.emi_terms) at EMI_TERMS_PER_S, not timed, so that the verdict
# does not depend on the machine's load (sklearn's loop, one core of the 2-core dev machine: 1.7e7 terms/s)
AMI_BUDGET_S = 600
EMI_TERMS_PER_S = 1.7e7


class ClaimEngine:
    """Intervals and verdicts from a project's result files (one per report: per-example arrays are cached). Our
    point estimate is exactly the tables' number: the difference of the two rows' means over their seeds, each a
    mean over the column's sets."""

    def __init__(self, cfg: ClaimsProject, results: ResultFiles, workers: int = 1):
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
            if not examples_kind(task):
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
        align = examples["text_to_image"] if examples_kind(task) == "ranks" else examples["labels"]
        key = (run, task, dataset, metric)
        self._chance[key] = chance_of(task, metric, examples, self.results.metrics(run, task, dataset) or {})
        if examples_kind(task) == "clusters":  # k-means assignments: the initialisations' spread
            self._inits[key] = init_variance(self.results.metrics(run, task, dataset) or {}, metric)
        return units, np.asarray(align)

    # ---- run families
    def target(self, claim: ClaimConfig) -> Target:
        if claim.target not in self._targets:
            raise NotRun(f"target {claim.target} is not declared in {self.cfg.source}")
        return self._targets[claim.target]

    def family(self, target: Target, label: str | None, pinned: list[str]) -> tuple[str, list[str]]:
        """(base run name, its runs) of a row (or of the claim's pinned candidates)."""
        if pinned:
            base = next((n for n in pinned if self.cfg.run_group(n)), pinned[0])  # the first configured
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
    def column_components(self, runs_a: list[str], runs_b: list[str], column: Column, sets: list[str]
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

    def column_estimate(self, runs_a: list[str], runs_b: list[str], column: Column, sets: list[str]
                        ) -> tuple[Estimate, int]:
        """(the :class:`Estimate` of a - b of ``column`` averaged over ``sets``, as the tables average them;
        the test examples summed over the sets)."""
        return self.column_parts(runs_a, runs_b, column, sets, inits=False)[:2]

    def column_parts(self, runs_a: list[str], runs_b: list[str], column: Column, sets: list[str],
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
        if inits and examples_kind(column.task) == "clusters":
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

    def column_interval(self, runs_a: list[str], runs_b: list[str], column: Column, sets: list[str],
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
                raise Unavailable(claim.unavailable)
            target = None if claim.kind == "toy" else self.target(claim)
            if claim.kind in ("best", "most", "equilibrium", "toy"):  # grids and tables (protoclip.claims.grid)
                return grid.evaluate(self, claim, target, row)
            base_a, runs_a = self.family(target, claim.a, claim.a_runs)
            base_b, runs_b = self.family(target, claim.b, claim.b_runs)
            row.runs = f"{grid.family_text(base_a, runs_a)} vs {grid.family_text(base_b, runs_b)}"
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
            row.direction = row.magnitude = why.verdict
            row.reason = str(why)
        finally:
            row.seconds = time.perf_counter() - t0
        return row

    def _judge(self, row: LedgerRow, seed_measured: bool, lo95: float, hi95: float, lo90: float, hi90: float
               ) -> None:
        judge(row, self.settings, seed_measured, lo95, hi95, lo90, hi90)

    def _estimate(self, row: LedgerRow, est: Estimate) -> None:
        judge_estimate(row, est, self.settings)

    def _columns(self, claim: ClaimConfig, target: Target, base_a: str, base_b: str, runs_a: list[str],
                 runs_b: list[str]) -> tuple[list[tuple[Column, list[str]]], list[float], list[str]]:
        columns, diffs, notes = [], [], []
        for label in claim.columns:
            col = next(c for c in target.columns if c.label == label)
            if claim.metric:
                col = dataclasses.replace(col, metric=claim.metric)
            sets, note = self.results.column_sets(target, col)
            cells = [self.results.cell(base, col, sets) for base in (base_a, base_b)]
            missing = next((c for c in cells if c.mean is None), None)
            if missing is not None:
                why = self._why_empty(missing.note, runs_a + runs_b, col, sets)
                if claim.kind == "count" or len(claim.columns) > 1:
                    why = type(why)(f"{label}: {why}" + (f" ({len(claim.columns)} sets needed)"
                                                         if claim.kind == "count" else ""))
                raise why
            columns.append((col, sets))
            diffs.append(cells[0].mean - cells[1].mean)
            notes.append(note)
        return columns, diffs, notes

    def _difference(self, claim: ClaimConfig, target: Target, base_a: str, base_b: str, runs_a: list[str],
                    runs_b: list[str], row: LedgerRow) -> None:
        columns, diffs, notes = self._columns(claim, target, base_a, base_b, runs_a, runs_b)
        (col, sets), = columns
        row.measured = f"{col.task} {col.metric} on " + " + ".join(sets) + (f" ({notes[0]})" if notes[0] else "")
        row.ours = diffs[0]  # shown even when the interval cannot be computed (NotRun below)
        row.task_metric = (col.task, col.metric)  # its unit, also where no interval follows
        row.seeds_run, on = min(len(runs_a), len(runs_b)), " + ".join(sets)
        if not examples_kind(col.task):  # NEMD: nothing per test example
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

    def _seeds_only(self, row: LedgerRow, col: Column, sets: list[str], *sides: tuple[str, list[str]]
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

    def _gain(self, claim: ClaimConfig, target: Target, base_a: str, base_b: str, runs_a: list[str],
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

    def _count(self, claim: ClaimConfig, target: Target, base_a: str, base_b: str, runs_a: list[str],
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
            t = records.episode_times(self.results.layout.train_log(run))
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

    def _why_empty(self, note: str, runs: list[str], col: Column, sets: list[str]) -> NotRun:
        """Why a cell is empty, as the exception its claim raises: :class:`Skipped` where data is absent (the first
        skip line of its runs' result files, or its runs' training data) or the set's ``tasks`` leave the task
        out, :class:`NotRun` naming the note else."""
        for r in runs:
            # a set whose data is missing has no evaluation folder: `collect` put its skip line in metrics.json
            summary = self.results.summary(r).get(col.task, {})
            for d in sets:
                result = self.results.metrics(r, col.task, d) or summary.get(d)
                if (line := records.skip_line(result)) is not None:
                    more = sum(self.results.value(r, col.task, x, col.metric) is None for x in sets) - 1
                    kind = Skipped if records.status_of(result).state == TaskStatus.MISSING else NotRun
                    return kind(line + (f" (and {more} more of {len(sets)} sets)" if more > 0 else ""))
        if note.startswith("skipped: "):  # the runs' training data is absent (Results.skipped_run)
            return Skipped(note)
        left_out = [d for d in sets if d in self.cfg.evaluate.datasets
                    and col.task not in self.cfg.evaluate.datasets[d].tasks]
        if left_out:
            return Skipped(f"skipped: {col.task} is not among evaluate.datasets.{left_out[0]}.tasks here")
        return NotRun({"no result": f"no result of {col.task} {col.metric} on {' + '.join(sets)} for "
                                    f"{', '.join(runs)}"}.get(note, note or "no result"))


def judge_claims(engine: ClaimEngine, claims: list[ClaimConfig]) -> list[LedgerRow]:
    """Every claim's row, then the ledger-wide steps over them all (:func:`protoclip.claims.rows.finish`);
    protoclip.report.ledger_table writes them::

        engine = ClaimEngine(cfg, Results(cfg))
        rows = judge_claims(engine, cfg.paper_claims())
    """
    return finish([engine.evaluate(c) for c in claims], engine.settings)


__all__ = ["AMI_BUDGET_S", "EMI_TERMS_PER_S", "ClaimEngine", "ClaimsProject", "Interval", "ResultFiles",
           "judge_claims"]
