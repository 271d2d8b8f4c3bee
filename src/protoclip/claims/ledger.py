"""The verdict rules of the claims ledger and how its numbers are printed. Pure functions, no files. Each claim is
asked two questions, direction and magnitude, each with its rule fixed here (and in words in :data:`RULES`) and its
margin in config/claims.yaml before any number of ours is seen; the three gates before a direction is decisive
(seeds, chance, Holm) are here too. The rules in full: docs/claims.md#how-to-read-the-ledger.
"""
from __future__ import annotations

import math

REPRODUCED = "reproduced"
CONTRADICTED = "contradicted"
NOT_RESOLVED = "not resolved"
NOT_TESTED = "not tested"  # the claim asks no such question (direction: none / magnitude: none)
NOT_RUN = "not run"
# the runs are configured but the data a run or an evaluation needs is absent here, or this configuration leaves
# the evaluation out (a set's `tasks`): the reason names which
SKIPPED = "skipped"
UNAVAILABLE = "unavailable"  # no run or evaluation of this project can test it (claims.yaml `unavailable`)
NOT_DECISIVE = "examples only: not decisive"  # one seed a side and no seed spread of the task to combine
AT_CHANCE = "at chance: not judged"  # a side whose score is not above its chance level by its interval
# one run a side of a score with no test examples to resample (NEMD: a mean over class pairs): a point, no interval
ONE_VALUE = "one value a side: not decisive"
OUTCOMES = (REPRODUCED, CONTRADICTED, NOT_RESOLVED)
VERDICTS = (REPRODUCED, CONTRADICTED, NOT_RESOLVED, NOT_TESTED, NOT_RUN, SKIPPED, UNAVAILABLE, NOT_DECISIVE,
            AT_CHANCE, ONE_VALUE)  # of each question
NOT_JUDGED = (NOT_RUN, SKIPPED, UNAVAILABLE)  # no number of ours to judge: the row gives the reason
ONE_SEED = "examples only, seed spread not measured"
NO_SPREAD = "seed spread not measured on both sides"
OFFLINE = "not the paper's scale (claims.paper_scale: false)"

RULES = {
    "direction": "the 95 % interval excludes 0 on the paper's side: reproduced; on the other side: contradicted; "
                 "contains 0: not resolved",
    "equivalence": "the 90 % interval lies inside [paper - m, paper + m]: reproduced; wholly outside: "
                   "contradicted; else not resolved (two one-sided tests at 5 %)",
    "at_most": "a bound L = paper + m: the 90 % interval's upper end <= L: reproduced; its lower end > L: "
               "contradicted; else not resolved",
    "at_least": "the bound L = paper - m: the 90 % interval's lower end >= L: reproduced; its upper end < L: "
                "contradicted; else not resolved",
    "gate": "a magnitude is never decided from runs at a scale the paper did not use, nor without the runs' own "
            "seed spread (one seed a side, or a spread combined from other runs)",
    "holm": "the verdict is Holm's: each direction test's one-sided p-value on the side its interval points to, "
            "adjusted over the claims of one paper (the family); reproduced / contradicted only when the adjusted "
            "p < 0.025",
    "sign test": "the sets where the paper's side is ahead (ties dropped) against half by an exact one-sided sign "
                 "test: p < 0.025 on the paper's side: reproduced; on the other: contradicted; else not resolved "
                 "(fewer than 6 sets can never reach 2.5 %)",
    "decisive": "one seed a side decides nothing unless the seed spread of the same task and metric, pooled over "
                "the ledger's repeated runs (named), is combined into its interval; else: examples only: not "
                "decisive",
    "chance": "each side's score against its chance level (top-1: 1 / classes, top-5: 5 / classes, R@k: k / "
              "candidates, ARI / AMI: 0); a side whose 95 % interval does not lie above it: at chance: not judged",
    "not run": "the runs or the per-example results the claim needs are not among this configuration's results (the "
               "reason is given)",
    "skipped": "its runs are configured, but the data a run or an evaluation needs is absent, or this configuration "
               "leaves that evaluation out (the reason names which)",
    "unavailable": "no run or evaluation of this project can test it (claims.yaml `unavailable`: the data, evaluation "
                   "or hardware it would need)",
    "one value": "a score with no test examples to resample (NEMD) is judged on its seeds' spread alone (the "
                 "pooled two-sample t interval); one run a side gives a point and no interval: one value a side: "
                 "not decisive",
}


def _check(lo: float, hi: float) -> None:
    if lo > hi:
        raise ValueError(f"interval [{lo}, {hi}] is reversed")


def direction_verdict(sign: float, lo: float, hi: float) -> str:
    """The direction question on a 95 % interval ``[lo, hi]``; ``sign``: +1 (the paper says positive) or -1:
    reproduced when it excludes 0 on the paper's side, contradicted on the other, else not resolved
    (``direction_verdict(+1, 0.4, 3.9)``: 'reproduced')."""
    _check(lo, hi)
    if sign not in (1, -1):
        raise ValueError(f"sign must be +1 or -1, got {sign}")
    if lo <= 0.0 <= hi:
        return NOT_RESOLVED
    return REPRODUCED if (lo > 0.0) == (sign > 0) else CONTRADICTED


def sign_test(ahead: int, behind: int) -> float:
    """One-sided exact sign test: P(X >= ahead) for X ~ Binomial(ahead + behind, 1/2) (ties dropped before)."""
    if ahead < 0 or behind < 0:
        raise ValueError("set counts must be >= 0")
    n = ahead + behind
    return float(sum(math.comb(n, j) for j in range(ahead, n + 1)) / 2 ** n) if n else 1.0


def sign_verdict(ahead: int, behind: int, alpha: float = 0.025) -> str:
    """The direction of a count (\"better on most sets\") by :func:`sign_test` on both sides at ``alpha``."""
    if sign_test(ahead, behind) < alpha:
        return REPRODUCED
    return CONTRADICTED if sign_test(behind, ahead) < alpha else NOT_RESOLVED


def chance_level(metric: str, classes: int | None = None, candidates: int | None = None) -> float:
    """A score's chance level in its own unit (points; ARI / AMI: 0): top-1 100 / classes, top-5 100 * min(5,
    classes) / classes, R@k 100 * k / candidates, mean_recall the mean of its six recalls' (k = 1, 5, 10)."""
    if metric in ("ari", "ami"):
        return 0.0
    if metric in ("top1", "top5"):
        if not classes:
            raise ValueError(f"{metric}: chance needs the number of classes")
        return 100.0 * min(1 if metric == "top1" else 5, classes) / classes
    if not candidates:
        raise ValueError(f"{metric}: chance needs the number of candidates")
    if metric == "mean_recall":
        return sum(100.0 * min(k, candidates) / candidates for k in (1, 5, 10)) / 3.0
    if "_R@" in metric:
        k = int(metric.rsplit("@", 1)[1])
        return 100.0 * min(k, candidates) / candidates
    raise ValueError(f"no chance level for {metric!r}")


def decide(raw: str, p_holm: float | None, alpha: float = 0.025) -> str:
    """The direction verdict after Holm: ``raw`` (reproduced / contradicted on the 95 % interval) holds only when
    its Holm-adjusted p (on the side its interval points to) is below ``alpha``; else not resolved."""
    if raw not in (REPRODUCED, CONTRADICTED):
        return raw
    return raw if p_holm is not None and p_holm < alpha else NOT_RESOLVED


def magnitude_verdict(test: str, lo: float, hi: float, paper: float | None, margin: float) -> str:
    """The magnitude question on a 90 % interval ``[lo, hi]`` against ``paper`` with margin ``margin`` (two
    one-sided tests at 5 % each): ``equivalence``: inside [paper - m, paper + m] *reproduced*, wholly outside
    *contradicted*, else *not resolved*; ``at_most`` (the paper's "only", "negligible", "less than": a one-sided
    bound L = paper + m): the upper end <= L *reproduced*, the lower end > L *contradicted*; ``at_least``
    mirrored (L = paper - m). ``magnitude_verdict("equivalence", 2.0, 4.0, 3.0, 1.5)``: 'reproduced'."""
    _check(lo, hi)
    if test == "equivalence":
        if paper is None:
            raise ValueError("an equivalence test needs the paper's value")
        low, high = paper - margin, paper + margin
        if low <= lo and hi <= high:
            return REPRODUCED
        return CONTRADICTED if hi < low or lo > high else NOT_RESOLVED
    base = paper or 0.0
    if test == "at_most":
        bound = base + margin
        return REPRODUCED if hi <= bound else CONTRADICTED if lo > bound else NOT_RESOLVED
    if test == "at_least":
        bound = base - margin
        return REPRODUCED if lo >= bound else CONTRADICTED if hi < bound else NOT_RESOLVED
    raise ValueError(f"unknown magnitude test {test!r}")


def gate_magnitude(raw: str, paper_scale: bool, seed_measured: bool) -> tuple[str, str]:
    """(verdict, reason): a decisive magnitude verdict only from runs at the paper's scale with their seed
    spread measured; otherwise *not resolved*, saying why and what the test alone gave."""
    if raw not in OUTCOMES:
        raise ValueError(f"unknown outcome {raw!r}")
    why = [] if paper_scale else [OFFLINE]
    if not seed_measured:
        why.append(NO_SPREAD)
    if raw == NOT_RESOLVED or not why:
        return raw, "; ".join(why)
    return NOT_RESOLVED, "; ".join(why) + f" (the test alone: {raw})"


def verdict_text(direction: str, magnitude: str) -> str:
    """What held, in words: ``verdict_text("reproduced", "not resolved")`` is ``direction reproduced, magnitude not
    resolved``; ``not run``, ``skipped``, ``unavailable`` and ``at chance: not judged`` alone."""
    for alone in (*NOT_JUDGED, AT_CHANCE):
        if alone in (direction, magnitude):
            return alone
    parts = [f"direction {direction}" if direction != NOT_TESTED else "",
             f"magnitude {magnitude}" if magnitude != NOT_TESTED else ""]
    return ", ".join(p for p in parts if p)


def signed(value: float, digits: int = 2) -> str:
    """A difference as the paper prints it: ``+0.80``, ``-1.04``, ``0.00``."""
    text = f"{value:.{digits}f}"
    return text if float(text) == 0 else f"{value:+.{digits}f}"


def with_interval(point: float, lo: float, hi: float, digits: int = 2, sign: bool = True) -> str:
    """``+1.80 [-0.40, +3.90]`` (``sign``: signed as a difference; else plain numbers, e.g. a share)."""
    f = (lambda v: signed(v, digits)) if sign else (lambda v: f"{v:.{digits}f}")
    return f"{f(point)} [{f(lo)}, {f(hi)}]"


__all__ = ["REPRODUCED", "CONTRADICTED", "NOT_RESOLVED", "NOT_TESTED", "NOT_RUN", "SKIPPED", "UNAVAILABLE",
           "NOT_JUDGED", "OUTCOMES", "VERDICTS", "RULES",
           "ONE_SEED", "NO_SPREAD", "OFFLINE", "NOT_DECISIVE", "AT_CHANCE", "ONE_VALUE", "direction_verdict",
           "sign_test", "sign_verdict", "chance_level", "decide", "magnitude_verdict", "gate_magnitude",
           "verdict_text", "signed", "with_interval"]
