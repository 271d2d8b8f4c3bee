"""The verdict rules of the claims ledger and how its numbers are printed. Pure functions, no files.

Each claim is asked two questions, each with its rule fixed here and its margin in config/claims.yaml before
any number of ours is seen:

* **Direction** (``direction: positive | negative``): does our 95 % interval exclude 0 on the paper's side?
  *reproduced*: yes; *contradicted*: it excludes 0 on the other side; *not resolved*: it contains 0. A count
  ("better on 9 of 14 sets"): is the paper's side better on most sets, i.e. does the 95 % interval of the count
  (protoclip.report.ledger_table: Holm over the sets' own tests) lie above half the sets (*reproduced*), below it
  (*contradicted*), or contain it (*not resolved*)?
  ``direction: none``: the quantity has no sign to test (a share; an overhead positive by construction).
* **Magnitude** (against ``paper_value`` with margin m): two one-sided tests at 5 % each, i.e. the 90 %
  interval: ``equivalence``: inside [paper - m, paper + m] *reproduced*, wholly outside *contradicted*, else
  *not resolved*; ``at_most`` (the paper's "only", "negligible", "less than": a one-sided bound L = paper + m):
  the 90 % interval's upper end <= L *reproduced*, its lower end > L *contradicted*; ``at_least`` mirrored.
  A magnitude is never *reproduced* or *contradicted* from runs at a scale the paper did not use (the offline
  default: ``claims.paper_scale: false``) or from one seed a side (seed spread not measured): it reads *not
  resolved* with the reason and what the test alone would say.

The ledger also adjusts the direction tests for multiplicity (Holm over the claims it ran,
protoclip.claims.intervals.holm) and prints both.

    direction_verdict(+1, 0.4, 3.9)                          # 'reproduced'
    magnitude_verdict("equivalence", 2.0, 4.0, 3.0, 1.5)     # 'reproduced'
    verdict_text("reproduced", "not resolved")               # 'direction reproduced, magnitude not resolved'
"""
from __future__ import annotations

REPRODUCED = "reproduced"
CONTRADICTED = "contradicted"
NOT_RESOLVED = "not resolved"
NOT_TESTED = "not tested"  # the claim asks no such question (direction: none / magnitude: none)
NOT_RUN = "not run"
OUTCOMES = (REPRODUCED, CONTRADICTED, NOT_RESOLVED)
VERDICTS = (REPRODUCED, CONTRADICTED, NOT_RESOLVED, NOT_TESTED, NOT_RUN)  # of each question
ONE_SEED = "examples only, seed spread not measured"
NO_SPREAD = "seed spread not measured on both sides"
OFFLINE = "not the paper's scale (claims.paper_scale: false)"

RULES = {
    "direction": "the 95 % interval excludes 0 on the paper's side: reproduced; on the other side: contradicted; "
                 "contains 0: not resolved",
    "count": "the 95 % interval of the number of sets where the paper's side is better lies above half the sets: "
             "reproduced; below: contradicted; contains half: not resolved",
    "equivalence": "the 90 % interval lies inside [paper - m, paper + m]: reproduced; wholly outside: "
                   "contradicted; else not resolved (two one-sided tests at 5 %)",
    "at_most": "a bound L = paper + m: the 90 % interval's upper end <= L: reproduced; its lower end > L: "
               "contradicted; else not resolved",
    "at_least": "the bound L = paper - m: the 90 % interval's lower end >= L: reproduced; its upper end < L: "
                "contradicted; else not resolved",
    "gate": "a magnitude is never decided from runs at a scale the paper did not use, nor from one seed a side",
    "holm": "Holm: the direction tests' one-sided p-values adjusted over the ledger's claims; reproduced "
            "family-wise when the adjusted p < 0.025",
    "not run": "the runs, the data set or the per-example results are absent (the reason is given)",
}


def _check(lo: float, hi: float) -> None:
    if lo > hi:
        raise ValueError(f"interval [{lo}, {hi}] is reversed")


def direction_verdict(sign: float, lo: float, hi: float) -> str:
    """The direction question on a 95 % interval ``[lo, hi]``; ``sign``: +1 (the paper says positive) or -1."""
    _check(lo, hi)
    if sign not in (1, -1):
        raise ValueError(f"sign must be +1 or -1, got {sign}")
    if lo <= 0.0 <= hi:
        return NOT_RESOLVED
    return REPRODUCED if (lo > 0.0) == (sign > 0) else CONTRADICTED


def count_verdict(lo: float, hi: float, n_sets: int) -> str:
    """The direction question of a count: the 95 % interval of the count against half the sets."""
    _check(lo, hi)
    if n_sets < 1:
        raise ValueError("a count verdict needs n_sets >= 1")
    half = n_sets / 2.0
    return REPRODUCED if lo > half else CONTRADICTED if hi < half else NOT_RESOLVED


def magnitude_verdict(test: str, lo: float, hi: float, paper: float | None, margin: float) -> str:
    """The magnitude question on a 90 % interval ``[lo, hi]`` (module docstring)."""
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
    """What held, in words: ``direction reproduced, magnitude not resolved``; ``not run`` alone."""
    if NOT_RUN in (direction, magnitude):
        return NOT_RUN
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


__all__ = ["REPRODUCED", "CONTRADICTED", "NOT_RESOLVED", "NOT_TESTED", "NOT_RUN", "OUTCOMES", "VERDICTS", "RULES",
           "ONE_SEED", "NO_SPREAD", "OFFLINE", "direction_verdict", "count_verdict", "magnitude_verdict", "gate_magnitude",
           "verdict_text", "signed", "with_interval"]
