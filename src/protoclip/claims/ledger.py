"""The verdict rules of the claims ledger and how its numbers are printed. Pure functions, no files.

Every claim gets one of four verdicts, decided from our estimate's 95 % interval (protoclip.claims.bootstrap):

* a **difference** (or a cost overhead) with a claimed sign (``direction: positive | negative``):
  *reproduced*: the interval excludes 0 on the paper's side; *contradicted*: it excludes 0 on the other side;
  *not resolved at this scale*: it includes 0;
* a **count** ("better on 9 of 14 sets"): the number of sets where the difference has the claimed sign, with its
  bootstrap interval (every set's test examples resampled, the same draws for all sets' seeds); the claim read as
  "on most of the sets": *reproduced* when the whole interval lies above half the sets, *contradicted* when it
  lies below, *not resolved* when it contains N / 2;
* a **magnitude or parity** claim (``direction: within``, a phase's share of the episode time, "matched"): the
  paper's words as a band ``[low, high]`` stated in claims.yaml; *reproduced*: the interval lies inside the band;
  *contradicted*: it lies wholly outside; *not resolved*: it straddles an edge;
* *not run*: the runs, the data set or the per-example results are absent, with the one-line reason.

    verdict("positive", 0.4, 3.9)            # 'reproduced'
    verdict("count", 6.0, 11.0, n_sets=14)   # 'not resolved at this scale'
    with_interval(1.8, -0.4, 3.9)            # '+1.80 [-0.40, +3.90]'
"""
from __future__ import annotations

REPRODUCED = "reproduced"
CONTRADICTED = "contradicted"
NOT_RESOLVED = "not resolved at this scale"
NOT_RUN = "not run"
VERDICTS = (REPRODUCED, CONTRADICTED, NOT_RESOLVED, NOT_RUN)

RULES = {
    "sign": "reproduced: the 95 % interval excludes 0 on the paper's side; contradicted: it excludes 0 on the "
            "other side; not resolved at this scale: it includes 0",
    "count": "the number of sets where the difference has the claimed sign, with its bootstrap interval; "
             "reproduced: the interval lies above half the sets; contradicted: below; not resolved: it contains "
             "half",
    "within": "reproduced: the 95 % interval lies inside the band (the paper's words as numbers, claims.yaml); "
              "contradicted: wholly outside it; not resolved: it straddles an edge",
    "not run": "the runs, the data set or the per-example results are absent (the reason is given)",
}


def verdict(direction: str, lo: float, hi: float, band: list[float] | None = None, n_sets: int | None = None
            ) -> str:
    """The verdict of an interval ``[lo, hi]`` (module docstring). ``direction``: positive | negative (the sign
    rule), within (``band``), or count (``n_sets`` compared: ``lo`` / ``hi`` bound the count)."""
    if lo > hi:
        raise ValueError(f"interval [{lo}, {hi}] is reversed")
    if direction == "count":
        if n_sets is None or n_sets < 1:
            raise ValueError("a count verdict needs n_sets >= 1")
        half = n_sets / 2.0
        return REPRODUCED if lo > half else CONTRADICTED if hi < half else NOT_RESOLVED
    if direction == "within":
        if not band or len(band) != 2:
            raise ValueError("a within verdict needs band [low, high]")
        low, high = band
        if low <= lo and hi <= high:
            return REPRODUCED
        return CONTRADICTED if hi < low or lo > high else NOT_RESOLVED
    if direction not in ("positive", "negative"):
        raise ValueError(f"unknown direction {direction!r}")
    if lo <= 0.0 <= hi:
        return NOT_RESOLVED
    same = lo > 0.0 if direction == "positive" else hi < 0.0
    return REPRODUCED if same else CONTRADICTED


def rule_of(kind: str, direction: str) -> str:
    """The key of :data:`RULES` a claim is judged by."""
    if kind == "count":
        return "count"
    return "within" if direction == "within" else "sign"


def signed(value: float, digits: int = 2) -> str:
    """A difference as the paper prints it: ``+0.80``, ``-1.04``, ``0.00``."""
    text = f"{value:.{digits}f}"
    return text if float(text) == 0 else f"{value:+.{digits}f}"


def with_interval(point: float, lo: float, hi: float, digits: int = 2, sign: bool = True) -> str:
    """``+1.80 [-0.40, +3.90]`` (``sign``: signed as a difference; else plain numbers, e.g. a share)."""
    f = (lambda v: signed(v, digits)) if sign else (lambda v: f"{v:.{digits}f}")
    return f"{f(point)} [{f(lo)}, {f(hi)}]"


__all__ = ["REPRODUCED", "CONTRADICTED", "NOT_RESOLVED", "NOT_RUN", "VERDICTS", "RULES", "verdict", "rule_of",
           "signed", "with_interval"]
