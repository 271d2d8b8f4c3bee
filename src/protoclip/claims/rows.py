"""One claim's row of the ledger and the ledger-wide steps over all rows: both questions judged from a row's
intervals (:func:`judge`), the seed spread a one-seed row borrows from the ledger's repeated runs of its task and
metric (:func:`task_spread`), Holm's adjustment within each paper and what it would take (:func:`finish`), and
the first line's counts (:func:`summary_text`). The rows' numbers come from protoclip.claims.engine's ClaimEngine,
the rules from protoclip.claims.ledger; protoclip.report.ledger_table only writes the rows.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from protoclip.claims import ledger
from protoclip.claims.config import ClaimConfig, ClaimsConfig
from protoclip.claims.intervals import Estimate, holm, pooled_seed_variance
from protoclip.tasks import task_names

UNITS = {"difference": "points", "gain": "points", "count": "sets", "share": "% of time", "overhead": "% of time",
         "time_ratio": "% of time", "best": "points", "most": "rows", "equilibrium": "% of the initial spread",
         "toy": "settings"}


class NotRun(Exception):
    """Why a claim (or an interval) cannot be decided: its one-line reason; ``verdict`` is the row's."""

    verdict = ledger.NOT_RUN


class Skipped(NotRun):
    """The claim's runs are configured, but data they or their evaluation need is absent (or left out here)."""

    verdict = ledger.SKIPPED


class Unavailable(NotRun):
    """No run or evaluation of this project can test the claim (claims.yaml ``unavailable``)."""

    verdict = ledger.UNAVAILABLE

@dataclass
class Side:
    """One family's score (mean over seeds and sets) with its 95 % interval, against its chance level."""
    point: float
    lo: float
    hi: float
    chance: float
    why: str  # where the chance level came from ("188 classes of the eval set", "434 candidates")

    @property
    def above(self) -> bool:
        return self.lo > self.chance

    def text(self, name: str) -> str:
        return f"{name} {self.point:.2f} [{self.lo:.2f}, {self.hi:.2f}] vs chance {self.chance:.3g} ({self.why})"


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
    count_signs: tuple[int, int] = (0, 0)  # a count: sets ahead and behind on the paper's side (ties dropped)
    # the direction's raw outcome on its 95 % interval (before the one-seed gate, chance and Holm) and the side of
    # 0 its p-value is taken on (+1 the paper's, -1 the other)
    raw_direction: str = ""
    p_side: float = 1.0
    task_metric: tuple[str, str] | None = None  # (task, metric) of a difference or count
    # each run family's per-seed values (means over the column's sets), by (task, metric, "base on sets"): the
    # seed spreads a one-seed row of the same task and metric can borrow (a gain's two columns each their own)
    families: dict = dataclasses.field(default_factory=dict, repr=False)
    sides: str = ""  # each side's score against its chance level
    spread: str = ""  # the seed spread the row's interval used, the runs named ("" when none: its margin's scale)
    seeds_run: int = 0  # the fewest seeds a side these runs have

    @property
    def unit(self) -> str:
        """The claim's ``unit`` where it names one (a memory share, a temperature), a score's own (ARI, AMI, NEMD:
        not percentages, their own panel), else its kind's (UNITS)."""
        if self.claim.unit:
            return self.claim.unit
        if self.claim.kind == "difference" and self.task_metric and self.task_metric[0] in task_names(
                lambda t: t.score):
            return "score (ARI, AMI, NEMD)"
        return UNITS[self.claim.kind]

    @property
    def verdict(self) -> str:
        return ledger.verdict_text(self.direction, self.magnitude)

    @property
    def holm(self) -> str:
        """The direction verdict after Holm's adjustment ("" when no direction test ran): the verdict itself."""
        return "" if self.p_holm is None else self.direction

    def _fmt(self, point, lo, hi) -> str:
        signed = self.claim.kind in ("difference", "gain", "overhead", "best")
        digits = 0 if self.claim.kind in ("count", "most", "toy") else 2
        if lo is None:
            return ledger.signed(point, digits) if signed else f"{point:.{digits}f}"
        return ledger.with_interval(point, lo, hi, digits, sign=signed)

    def ours_text(self) -> str:
        return "-" if self.ours is None else self._fmt(self.ours, self.lo, self.hi)

    def rules(self) -> str:
        c = self.claim
        if self.direction in ledger.NOT_JUDGED:
            return ledger.RULES[self.direction]
        out = []
        if self.direction == ledger.ONE_VALUE:
            out.append("direction: " + ledger.RULES["one value"])
        elif c.direction != "none":
            out.append("direction: " + ledger.RULES["sign test" if c.kind == "count" else "direction"])
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
                "holm": self.holm, "raw_direction": self.raw_direction, "sides": self.sides, "spread": self.spread,
                "seed_note": self.seed_note, "needs": self.needs, "reason": self.reason,
                "rule": self.rules(), "runs": self.runs, "measured": self.measured, "note": c.note,
                "seconds": round(self.seconds, 3)}


HOLM_ALPHA = 0.025  # one-sided, the two-sided 95 % interval's side
# The effect "what it would take" plans for when our estimate is on the wrong side of 0 and the paper prints no
# number (a figure's bars): the smallest accuracy difference the ledger's margins count (claims.yaml's
# max(1 point, half the paper's difference)).
PLANNING_FLOOR = {"points": 1.0}


def claim_sign(claim: ClaimConfig) -> float:
    return -1.0 if claim.direction == "negative" else 1.0


def at_chance(row: LedgerRow, reason: str) -> None:
    """A side not above its chance level: each question the claim asks reads at chance (one it does not ask
    stays not tested, so the first line counts only the questions asked), no p-value for Holm."""
    row.direction = ledger.AT_CHANCE if row.claim.direction != "none" else ledger.NOT_TESTED
    row.magnitude = ledger.AT_CHANCE if row.claim.magnitude != "none" else ledger.NOT_TESTED
    row.p, row.magnitude_why, row.reason, row.needs = None, "", reason, ""


def judge(row: LedgerRow, settings: ClaimsConfig, seed_own: bool, lo95: float, hi95: float, lo90: float,
          hi90: float) -> None:
    """Both questions from the intervals (protoclip.claims.ledger), before the ledger-wide steps of
    :func:`finish`. A count's direction is the sign test over its sets (reachable at the paper's 14 sets: 12 of
    14 ahead); its interval (sets significant each, Holm over the sets) is printed and carries the magnitude."""
    c = row.claim
    row.lo, row.hi, row.lo90, row.hi90 = lo95, hi95, lo90, hi90
    if c.direction == "none":
        row.direction = ledger.NOT_TESTED
    elif c.kind == "count":
        ahead, behind = row.count_signs
        row.direction = ledger.sign_verdict(ahead, behind, HOLM_ALPHA)
        row.p_side = 1.0 if ahead >= behind else -1.0
        row.p = ledger.sign_test(*((ahead, behind) if ahead >= behind else (behind, ahead)))
    else:
        row.direction = ledger.direction_verdict(claim_sign(c), lo95, hi95)
    row.raw_direction = row.direction
    if c.magnitude == "none":
        row.magnitude = ledger.NOT_TESTED
    else:
        raw = ledger.magnitude_verdict(c.magnitude, lo90, hi90, c.paper_value, c.margin)
        row.magnitude, row.magnitude_why = ledger.gate_magnitude(raw, settings.paper_scale, seed_own)


def judge_estimate(row: LedgerRow, est: Estimate, settings: ClaimsConfig) -> None:
    """The row's numbers and verdicts from an :class:`Estimate`: its p-value on the side of 0 its interval points
    to; a decisive direction with no seed level in the interval reads examples only: not decisive."""
    row.estimate, row.ours, row.seed_note = est, est.point, est.seed_note
    lo, hi = est.interval(settings.confidence)
    lo90, hi90 = est.interval(1.0 - 2.0 * (1.0 - settings.confidence))
    if row.claim.direction != "none":
        same, other = est.p_one_sided(claim_sign(row.claim)), est.p_one_sided(-claim_sign(row.claim))
        row.p_side, row.p = (1.0, same) if same <= other else (-1.0, other)
    judge(row, settings, est.seed_own, lo, hi, lo90, hi90)
    if row.direction in (ledger.REPRODUCED, ledger.CONTRADICTED) and not est.seed_measured:
        row.direction = ledger.NOT_DECISIVE


def judge_best(row: LedgerRow, settings: ClaimsConfig) -> None:
    """"a is the best of the rows": a - b_i has the paper's sign for every other row i (``row.set_estimates``,
    each with its difference). The statistic is the smallest of them on the paper's side (a against the
    runner-up); its interval: the lower end the smallest of the comparisons' lower ends (an intersection-union
    bound: valid without correction, since the comparison that is the minimum covers it), the upper end the
    smallest of their upper ends at Bonferroni's 1 - alpha / k (every comparison must cover). Direction: lower
    end above 0, every comparison ahead: reproduced; upper end below 0, some row significantly ahead of a:
    contradicted. p: the largest one-sided p on the paper's side (the intersection-union test), or k times the
    smallest on the other. A comparison without a seed spread leaves a decisive direction not decisive."""
    sign, k, conf = claim_sign(row.claim), len(row.set_estimates), settings.confidence
    ests = [e for e, _ in row.set_estimates]

    def bounds(level: float) -> tuple[float, float]:
        def on_side(e, c):  # the interval of sign * (a - b_i)
            lo, hi = e.interval(c)
            return (lo, hi) if sign > 0 else (-hi, -lo)
        low = min(on_side(e, level)[0] for e in ests)
        high = min(on_side(e, 1.0 - (1.0 - level) / k)[1] for e in ests)
        return (low, high) if sign > 0 else (-high, -low)

    row.ours = min((d for _, d in row.set_estimates), key=lambda d: sign * d)
    same = max(e.p_one_sided(sign) for e in ests)
    other = min(1.0, k * min(e.p_one_sided(-sign) for e in ests))
    row.p_side, row.p = (1.0, same) if same <= other else (-1.0, other)
    row.seed_note = "; ".join(dict.fromkeys(e.seed_note for e in ests if e.seed_note))
    judge(row, settings, all(e.seed_own for e in ests), *bounds(conf), *bounds(1.0 - 2.0 * (1.0 - conf)))
    if row.direction in (ledger.REPRODUCED, ledger.CONTRADICTED) and not all(e.seed_measured for e in ests):
        row.direction = ledger.NOT_DECISIVE
    closest = min(range(k), key=lambda i: sign * row.set_estimates[i][1])
    row.needs = "" if row.direction not in (ledger.NOT_RESOLVED, ledger.NOT_DECISIVE) else (
        f"every comparison's 95 % interval on the paper's side of 0; the closest now: "
        f"{ledger.with_interval(row.set_estimates[closest][1], *ests[closest].interval(conf))}"
        + ("" if all(e.seed_measured for e in ests) else "; a seed spread of the task (2 or more seeds a side)"))


def finish(rows: list[LedgerRow], settings: ClaimsConfig) -> list[LedgerRow]:
    """The ledger-wide steps. (1) A difference of one seed a side takes the seed spread of the same task and
    metric pooled over the ledger's repeated runs (:func:`task_spread`, the runs named) into its interval and is
    judged again; with none to take, a decisive direction reads examples only: not decisive. (2) Holm's
    adjustment of the direction tests, the family being the claims of one paper; the adjusted p decides the
    verdict (:func:`protoclip.claims.ledger.decide`). (3) For each direction left undecided, what it would take
    (:func:`needs_text`)."""
    for r in rows:
        est = r.estimate
        if r.claim.kind == "best" and r.direction not in (*ledger.NOT_JUDGED, ledger.AT_CHANCE) and not all(
                e.seed_measured for e, _ in r.set_estimates) and (spread := task_spread(r, rows)) is not None:
            var, dof, source = spread
            r.set_estimates = [(e if e.seed_measured else e.with_seed_spread(var, dof, source), d)
                               for e, d in r.set_estimates]
            judge_best(r, settings)
        if est is None or est.seed_measured or r.claim.kind != "difference" or r.direction in (
                *ledger.NOT_JUDGED, ledger.AT_CHANCE):
            continue
        spread = task_spread(r, rows)
        if spread is not None:
            var, dof, source = spread
            ours = r.ours
            judge_estimate(r, est.with_seed_spread(var, dof, source), settings)
            r.ours = ours
    tested = [r for r in rows if r.p is not None and r.direction not in (ledger.NOT_DECISIVE, ledger.AT_CHANCE,
                                                                         *ledger.NOT_JUDGED)]
    for paper in dict.fromkeys(r.claim.paper for r in tested):
        family = [r for r in tested if r.claim.paper == paper]
        for r, adj in zip(family, holm([r.p for r in family])):
            r.p_holm = adj
            r.direction = ledger.decide(r.direction, adj, HOLM_ALPHA)
    for r in rows:
        if r.direction in (ledger.NOT_RESOLVED, ledger.NOT_DECISIVE):
            r.needs = needs_text(r, rows)
        elif r.direction == ledger.ONE_VALUE:
            r.needs = "2 or more runs (seeds) a side: a score with no test examples to resample has only their spread"
        r.spread = used_spread(r)
    return rows


def used_spread(row: LedgerRow) -> str:
    """The seed spread the row's interval used, in words: one combined from other runs (its source, as
    :func:`task_spread` names it), or these runs' own (their seeds, the pooled sd and df: a count's per set);
    "" when its interval holds none (one run a side and nothing to combine)."""
    est = row.estimate
    if est is not None and est.seed_source:
        return est.seed_source
    if est is not None and est.seed_own:
        (_, dof), = est.seed_terms
        sa, sb = est.seeds
        return (f"these runs' own seeds ({sa}" + (f" and {sb}" if sb else "") + f"): pooled seed sd "
                f"{math.sqrt(est.seed_var[0]):.2f} {row.unit}, {dof:g} df")
    if row.claim.kind == "best" and (borrowed := [e.seed_source for e, _ in row.set_estimates if e.seed_source]):
        return borrowed[0]
    sets = [e for e, _ in row.set_estimates if e.seed_own]
    if row.claim.kind in ("count", "best") and sets:
        sds = ", ".join(f"{math.sqrt(e.seed_var[0]):.2f}" for e in sets)
        return f"these runs' own seeds ({sets[0].seeds[0]} and {sets[0].seeds[1]}) on each set: seed sd {sds}"
    return ""


def task_spread(row: LedgerRow, rows: list[LedgerRow]) -> tuple[float, int, str] | None:
    """(per-seed variance, df, its source) for a row whose seed spread is not measured: the seeds' variance
    pooled over the distinct run families of the ledger's rows with the row's task and metric that have two or
    more seeds (its own units: a linear top-1 borrows linear top-1 spreads, never zero-shot's or ARI's), those
    on the row's own sets where there are any; None when there is none."""
    if row.task_metric is None:
        return None
    fams: dict[str, np.ndarray] = {}
    where: dict[str, list[str]] = {}  # family -> the ledger rows it appears in
    for r in rows:
        for (task, metric, name), values in r.families.items():
            if (task, metric) == row.task_metric and len(values) > 1:
                fams.setdefault(name, values)
                where.setdefault(name, []).append(r.claim.id)
    own = {name.split(" on ", 1)[1] for (task, metric, name) in row.families if (task, metric) == row.task_metric}
    fams = {n: v for n, v in fams.items() if n.split(" on ", 1)[1] in own} or fams
    var, dof = pooled_seed_variance(fams.values())
    if not dof:
        return None
    task, metric = row.task_metric
    names = ", ".join(f"{n} ({len(v)} seeds)" for n, v in fams.items())
    ids = ", ".join(dict.fromkeys(i for n in fams for i in where[n]))
    return var, dof, f"{task} {metric} of {names}: pooled seed sd {math.sqrt(var):.2f}, {dof} df; rows {ids}"


def _plan(row: LedgerRow, est: Estimate, effect: float, fallback: float | None) -> str:
    """Seeds a side (and examples) for one effect; never fewer than one more than the seeds already run."""
    n, k = est.seeds_needed(effect, fallback)
    more = f" and {k:g}x the {row.unit_name} ({row.units} -> {int(k * row.units)})" if k > 1 else ""
    if n is None:
        return f"more than 1000 seeds a side{more}"
    if n <= row.seeds_run:  # the power calculation's n already ran without a verdict: at least one more
        return f"{row.seeds_run + 1} seeds a side{more} (the plan's {n} already ran without a verdict)"
    return f"{n} seeds a side{more}"


def needs_text(row: LedgerRow, rows: list[LedgerRow]) -> str:
    """What would resolve the direction: seeds a side (and test examples where the test set is the limit) at
    which the one-sided 2.5 % test reaches the paper's side with 80 % power, at our measured (or the task's
    pooled, :func:`task_spread`) seed variance and our example variance; planned at our estimate when it is on
    the paper's side and at the paper's own value, both shown (no paper number and our estimate on the wrong
    side: :data:`PLANNING_FLOOR`), never fewer seeds than already ran."""
    est, c = row.estimate, row.claim
    if c.kind == "count":
        return _count_needs(row, rows)
    if c.kind in ("best", "most", "toy"):  # written where the row is judged (judge_best, claims.grid)
        return row.needs
    if est is None:
        return ""
    sign = claim_sign(c)
    fallback, source = None, est.seed_source
    if not est.seed_measured:
        spread = task_spread(row, rows)
        if spread is None:
            return "the seed spread of this task is not measured here; run 2 or more seeds a side to plan"
        fallback, _, source = spread
    plans = []
    if sign * row.ours > 0:
        plans.append(f"at our estimate {ledger.signed(row.ours)}: {_plan(row, est, row.ours, fallback)}")
    else:
        plans.append(f"at our estimate {ledger.signed(row.ours)}: not on the paper's side of 0, no number of "
                     "seeds turns it")
    if c.paper_value is not None and c.kind != "count":
        plans.append(f"at the paper's {ledger.signed(c.paper_value)}: {_plan(row, est, c.paper_value, fallback)}")
    elif sign * row.ours <= 0 and row.unit in PLANNING_FLOOR:
        effect = sign * PLANNING_FLOOR[row.unit]
        plans.append(f"the paper prints no number; at {ledger.signed(effect)}: {_plan(row, est, effect, fallback)}")
    sd = math.sqrt(est.seed_var[0] if est.seed_measured else fallback)
    spread = f"seed sd {sd:.2f} {row.unit}" + (f" ({source})" if source else "")
    return "; ".join(plans) + f" ({row.unit}, {spread}, 80 % power)"


def _count_needs(row: LedgerRow, rows: list[LedgerRow]) -> str:
    """What would resolve a count: the sets ahead on the paper's side that the sign test needs at 2.5 % (ties
    dropped), against those ahead now; "unreachable" where even every set ahead cannot reach it (N < 6)."""
    ahead, behind = row.count_signs
    n, c = ahead + behind, row.claim
    need = next((k for k in range(n + 1) if ledger.sign_test(k, n - k) < HOLM_ALPHA), None)
    own = ""
    if c.paper_value is not None:  # what the paper's own count gives under the same test
        k, total = int(c.paper_value), len(c.columns)
        own = f"; the paper's own {k} of {total} gives p = {ledger.sign_test(k, total - k):.2g}"
    if need is None:
        return (f"unreachable here: {n} sets with a sign cannot reach one-sided 2.5 % even all ahead "
                f"(0.5^{n} = {0.5 ** n:.3g}){own}")
    return f"{need} of {n} sets ahead on the paper's side (sign test at one-sided 2.5 %); {ahead} now{own}"


def summary_text(rows: list[LedgerRow]) -> str:
    """Counts of distinct claims (each claim is one row; one claim printed twice by a paper is one row), each
    question counted over the rows whose claim asks it (``direction`` / ``magnitude`` not ``none``)."""
    ran = [r for r in rows if r.direction not in ledger.NOT_JUDGED]
    parts = [f"{len(rows)} distinct claims, " + ", ".join(
        f"{sum(r.direction == v for r in rows)} {v}" for v in ledger.NOT_JUDGED)]
    for q in ("direction", "magnitude"):
        vals = [getattr(r, q) for r in ran if getattr(r.claim, q) != "none" and getattr(r, q) != ledger.NOT_TESTED]
        if vals:
            decisive = [v for v in vals if v in (ledger.REPRODUCED, ledger.CONTRADICTED)]
            rest = [v for v in (ledger.NOT_RESOLVED, ledger.NOT_DECISIVE, ledger.ONE_VALUE, ledger.AT_CHANCE)
                    if v in vals]
            parts.append(f"{q} ({len(vals)} tested): {len(decisive)} decisive ({decisive.count(ledger.REPRODUCED)} "
                         f"reproduced, {decisive.count(ledger.CONTRADICTED)} contradicted"
                         + (", Holm within each paper" if q == "direction" else "") + ")"
                         + "".join(f", {vals.count(v)} {v}" for v in rest))
    return "; ".join(parts)


__all__ = ["UNITS", "HOLM_ALPHA", "PLANNING_FLOOR", "NotRun", "Skipped", "Unavailable", "Side", "LedgerRow",
           "claim_sign", "judge",
           "judge_estimate", "judge_best", "at_chance", "finish", "task_spread", "used_spread", "needs_text",
           "summary_text"]
