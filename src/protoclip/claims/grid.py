"""Claims over the rows of a grid or table (config/claims.yaml ``kind: best``, ``most``, ``equilibrium``, ``toy``),
judged from the same cells and intervals as the ledger's differences (protoclip.claims.engine.ClaimEngine). Each
kind's rule is in its function's docstring; how to read them: docs/claims.md.
"""
from __future__ import annotations

import math

import pandas as pd

from protoclip.claims import ledger
from protoclip.claims.config import ClaimConfig
from protoclip.claims.rows import HOLM_ALPHA, LedgerRow, NotRun, at_chance, claim_sign, judge_best
from protoclip.files.records import read_train_log


def compared(target, claim: ClaimConfig) -> list[str]:
    """The row labels held against ``a`` (best) or ``b`` (most): the claim's ``rows`` (NotRun naming one the
    target lacks), else every other row of the target that has a run of ours."""
    if claim.rows:
        missing = [label for label in claim.rows if label not in {r.label for r in target.rows}]
        if missing:
            raise NotRun(f"{target.id} has no row {missing[0]!r} (claims.yaml `rows`)")
        return list(claim.rows)
    return [r.label for r in target.rows if r.run is not None and r.label not in (claim.a, claim.b)]


def final_scale(train_log) -> float | None:
    """The logit scale s = 1/tau of a run's last step record that has one (``clip_scale``, written by the
    trainer for every CLIP-term method); None when no step has one."""
    scales = [rec["clip_scale"] for rec in read_train_log(train_log, kind="step") if "clip_scale" in rec]
    return float(scales[-1]) if scales else None


def family_text(base: str, runs: list[str]) -> str:
    """A run family as the ledger names it: ``clip_tiny (3 seeds)``."""
    return f"{base} ({len(runs)} seed{'s' if len(runs) != 1 else ''})"


def evaluate(engine, claim: ClaimConfig, target, row: LedgerRow) -> LedgerRow:
    """The row of a ``best``, ``most``, ``equilibrium`` or ``toy`` claim (each kind's function says its rule);
    NotRun where a cell or its examples are absent."""
    return {"best": _best, "most": _most, "equilibrium": _equilibrium, "toy": _toy}[claim.kind](
        engine, claim, target, row)


def _best(engine, claim: ClaimConfig, target, row: LedgerRow) -> LedgerRow:
    """``best``: "0.2M is the best episode size" (Fig. 6a): the row ``a`` against each other row of the target (or
    ``rows``) on one column; each comparison a - b_i is a difference with its interval, and the claim holds when
    every one has the paper's sign (:func:`protoclip.claims.rows.judge_best`: the smallest difference, a against
    the runner-up, with an intersection-union interval). One seed a row borrows the task's seed spread as a
    one-seed difference does."""
    base_a, runs_a = engine.family(target, claim.a, claim.a_runs)
    others = [(label, *engine.family(target, label, [])) for label in compared(target, claim)]
    if not others:
        raise NotRun(f"{target.id}: no other row to hold {claim.a} against")
    row.runs = f"{family_text(base_a, runs_a)} vs each of " + ", ".join(family_text(b, r) for _, b, r in others)
    low, parts = [], []
    for label, base_b, runs_b in others:
        ((col, sets),), (diff,), _ = engine._columns(claim, target, base_a, base_b, runs_a, runs_b)
        est, n, pa, pb, sides, _, _ = engine.column_parts(runs_a, runs_b, col, sets)
        on = " + ".join(sets)
        row.families.update({(col.task, col.metric, f"{base_a} on {on}"): pa,
                             (col.task, col.metric, f"{base_b} on {on}"): pb})
        row.set_estimates.append((est, diff))
        low += [name for side, name in zip(sides, (base_a, base_b)) if not side.above and name not in low]
        parts.append(f"{label} {ledger.signed(diff)}")
        row.units = n
    row.task_metric, row.seeds_run = (col.task, col.metric), min(len(runs_a), *(len(r) for _, _, r in others))
    row.measured = f"{col.task} {col.metric} on {on}: {claim.a} minus each other row: " + ", ".join(parts)
    judge_best(row, engine.settings)
    if low:
        at_chance(row, f"{' and '.join(low)} not above chance by the 95 % interval")
    return row


def _most(engine, claim: ClaimConfig, target, row: LedgerRow) -> LedgerRow:
    """``most``: "all these ablations outperform CLIP on most metrics" (Table III): each of ``rows`` against ``b`` on
    each of ``columns``; per row, the metrics where it is ahead against those where it is behind by the ledger's
    sign test (ties and metrics where a side is at chance carry no sign). The claim is about every row, so its p
    is the largest of the rows' p (intersection-union) and, for the other side, k times the smallest. Our number:
    the rows ahead on most of the metrics. With 4 metrics no row can reach one-sided 2.5 % (0.5^4 = 0.0625): the
    count is printed, the direction stays not resolved, and the row says so."""
    base_b, runs_b = engine.family(target, claim.b, claim.b_runs)
    labels = compared(target, claim)
    if not labels:
        raise NotRun(f"{target.id}: no row to hold against {claim.b}")
    sign, n_cols = claim_sign(claim), len(claim.columns)
    counts, groups = [], []
    for label in labels:
        base_a, runs_a = engine.family(target, label, [])
        groups.append(family_text(base_a, runs_a))
        columns, diffs, _ = engine._columns(claim, target, base_a, base_b, runs_a, runs_b)
        ahead = behind = 0
        for (col, sets), diff in zip(columns, diffs):
            *_, sides, _, _ = engine.column_parts(runs_a, runs_b, col, sets, inits=False)
            if all(side.above for side in sides):  # a metric at chance on either side carries no sign
                ahead, behind = ahead + (sign * diff > 0), behind + (sign * diff < 0)
        counts.append((label, ahead, behind))
    row.runs = f"each of {', '.join(groups)} vs {family_text(base_b, runs_b)}"
    row.ours = float(sum(ahead > n_cols / 2 for _, ahead, _ in counts))
    row.measured = (f"{' / '.join(claim.columns)}: metrics ahead / behind of {claim.b} per row: "
                    + ", ".join(f"{label} {a} / {b}" for label, a, b in counts)
                    + f"; {int(row.ours)} of {len(counts)} rows ahead on most of the {n_cols} metrics")
    same = max(ledger.sign_test(a, b) for _, a, b in counts)
    other = min(1.0, len(counts) * min(ledger.sign_test(b, a) for _, a, b in counts))
    row.p_side, row.p = (1.0, same) if same <= other else (-1.0, other)
    row.direction = row.raw_direction = (ledger.REPRODUCED if same < HOLM_ALPHA else ledger.CONTRADICTED
                                         if other < HOLM_ALPHA else ledger.NOT_RESOLVED)
    row.magnitude = ledger.NOT_TESTED if claim.magnitude == "none" else ledger.NOT_RESOLVED
    row.magnitude_why = "" if claim.magnitude == "none" else "a count of rows has no interval here"
    if max(a + b for _, a, b in counts) < 6:
        row.needs = (f"unreachable here: a sign test over {n_cols} metrics cannot reach one-sided 2.5 % for any "
                     f"row even all ahead (0.5^{n_cols} = {0.5 ** n_cols:.3g})")
    return row


def _equilibrium(engine, claim: ClaimConfig, target, row: LedgerRow) -> LedgerRow:
    """``equilibrium``: "the temperature converges to an equilibrium value irrespective of initialization" (Fig. 3,
    Table 7): the runs of ``rows``, started at different logit scales, end at the last step of their train logs;
    ours is the log-range of the final scales in % of the initial scales' (0: one value whatever the start; 100:
    no closer than they began), held to the claim's bound (``magnitude: at_most``). One run per initialisation: no
    interval, so the magnitude is not decided (the test alone is printed)."""
    starts, ends, groups = [], [], []
    for label in compared(target, claim):
        _, runs = engine.family(target, label, [])
        run = runs[0]
        end = final_scale(engine.results.layout.train_log(run))
        if end is None:
            raise NotRun(f"{run}: no clip_scale in its train log (not trained, or a method without a CLIP term)")
        starts.append(1.0 / engine.cfg.run(run).loss.init_temperature)
        ends.append(end)
        groups.append(f"{label}: {starts[-1]:.3g} -> {ends[-1]:.3g} ({run})")
    start = math.log(max(starts)) - math.log(min(starts))
    if start <= 0:
        raise NotRun("the rows start at one logit scale: nothing to converge from")
    end = math.log(max(ends)) - math.log(min(ends))
    row.ours, row.runs = 100.0 * end / start, "; ".join(groups)
    row.measured = (f"logit scale s = 1/tau, initial -> last step (train_log.jsonl): log-range {end:.3g} of the "
                    f"initial {start:.3g}")
    row.seed_note, row.unit_name = "one run per initialisation: no interval", "runs"
    row.direction = ledger.NOT_TESTED if claim.direction == "none" else ledger.NOT_RESOLVED
    if claim.magnitude == "none":
        row.magnitude = ledger.NOT_TESTED
    else:
        raw = ledger.magnitude_verdict(claim.magnitude, row.ours, row.ours, claim.paper_value, claim.margin)
        row.magnitude, row.magnitude_why = ledger.gate_magnitude(raw, engine.settings.paper_scale, False)
    return row


def _toy(engine, claim: ClaimConfig, target: None, row: LedgerRow) -> LedgerRow:
    """``toy``: PAUC's toy experiment (results/toy/pauc_toy.csv, the ``toy-nemd`` stage; one value per method and
    class setting, no seeds): the class settings where method ``a``'s ``columns[0]`` minus method ``b``'s has the
    paper's sign, by the ledger's sign test (ties dropped); 5 settings cannot reach one-sided 2.5 %."""
    path = engine.results.layout.toy_files()["csv"]
    if not path.exists():
        raise NotRun(f"{path}: no toy table (the toy-nemd stage has not run)")
    table = pd.read_csv(path)
    metric, sign = claim.columns[0], claim_sign(claim)
    wide = table.pivot(index="n_classes", columns="method", values=metric)
    if claim.a not in wide or claim.b not in wide:
        raise NotRun(f"{path}: no {metric} of methods {claim.a} and {claim.b}")
    diffs = (wide[claim.a] - wide[claim.b]).dropna()
    ahead, behind = int((sign * diffs > 0).sum()), int((sign * diffs < 0).sum())
    row.ours, row.count_signs = float(ahead), (ahead, behind)
    row.runs = f"{claim.a} vs {claim.b} ({path.name}, one run each per class setting)"
    row.measured = (f"{metric} of {claim.a} minus {claim.b} per class setting: "
                    + ", ".join(f"{n} classes {ledger.signed(d, 4)}" for n, d in diffs.items())
                    + f"; on the paper's side in {ahead}, the other in {behind} (sign test p = "
                    f"{ledger.sign_test(ahead, behind):.2g})")
    row.seed_note, row.unit_name = "one run per method and class setting: no interval", "class settings"
    same, other = ledger.sign_test(ahead, behind), ledger.sign_test(behind, ahead)
    row.p_side, row.p = (1.0, same) if same <= other else (-1.0, other)
    row.direction = row.raw_direction = ledger.sign_verdict(ahead, behind, HOLM_ALPHA)
    row.magnitude = ledger.NOT_TESTED if claim.magnitude == "none" else ledger.NOT_RESOLVED
    if ahead + behind < 6:
        row.needs = (f"unreachable here: {ahead + behind} class settings with a sign cannot reach one-sided 2.5 % "
                     f"even all on the paper's side (0.5^{ahead + behind} = {0.5 ** (ahead + behind):.3g})")
    return row


__all__ = ["evaluate", "compared", "final_scale", "family_text"]
