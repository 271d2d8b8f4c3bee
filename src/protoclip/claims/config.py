"""The claims ledger's config: the ``claims:`` section of the project config and one claim of ``config/claims.yaml``.

The project config names the claim files and the bootstrap's settings::

    claims:
      files: [claims.yaml]    # relative to the config file; each holds a top-level `claims:` list
      resamples: 2000         # bootstrap resamples per interval
      seed: 0                 # every interval draws from numpy's default_rng(seed) afresh
      confidence: 0.95        # two-sided percentile interval

A claim names the paper's number and where it is printed, and the two run families and the metric through a
paper target's rows and column (``target``, ``a``, ``b``, ``columns``: the labels of config/experiments/*.yaml),
so the ledger compares exactly what the tables show; ``a_runs`` / ``b_runs`` pin other runs where the table's
own rows are not the claim's configuration. The loader (protoclip.config) checks that a target's rows and columns
exist; a claim whose target this config does not declare reads "not run". The fields are documented below and
in config/claims.yaml.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

KINDS = ("difference", "count", "share", "overhead", "time_ratio")
PHASES = ("extract", "kmeans", "pbt", "train")  # the episode phases train_log.jsonl times (time/<phase>)


@dataclass
class ClaimConfig:
    id: str  # the ledger's row id (letters, digits, '_')
    paper: str  # whose claim: ProtoCLIP, nCLIP/xCLIP, temperature (multi-token), PCL, PAUC
    source: str  # the paper's text file (../shared/papers/<source>)
    line: int  # the line of that text where the claim is printed
    where: str  # its table / figure / section ("Table IV, Sec. IV-E3")
    quote: str  # the paper's words on that line, verbatim (a test checks it is there)
    paper_value: float | None  # the paper's number in the ledger's unit (None: the paper states none)
    paper_text: str  # the number as printed ("+5.81%"), or the words ("negligible")
    # difference: a - b of one column (points); count: in how many of `columns` a - b has the claimed sign;
    # share: a's time per epoch in `phase`, in % of b's time per epoch (Fig. 9's base: CLIP's epoch, see
    # protoclip.report.figures.TIME_SPLIT_NOTE); overhead: % more time per epoch of a than b;
    # time_ratio: a's total training time in % of b's
    kind: Literal["difference", "count", "share", "overhead", "time_ratio"] = "difference"
    target: str | None = None  # the paper target whose rows / columns name the runs and the metric
    a: str | None = None  # row label of the claimed-better run family (the minuend)
    b: str | None = None  # row label of the baseline (the subtrahend; for `share`, the time base)
    columns: list[str] = field(default_factory=list)  # column label(s): one, or the sets a count runs over
    metric: str | None = None  # another metric of the column's task than the column's own (e.g. image_to_text_R@1)
    a_runs: list[str] = field(default_factory=list)  # candidate runs for a instead of the row's (first configured)
    b_runs: list[str] = field(default_factory=list)
    # positive / negative: the sign rule; within: the interval must lie inside `band` (a magnitude or parity claim)
    direction: Literal["positive", "negative", "within"] = "positive"
    band: list[float] = field(default_factory=list)  # [low, high] for `within`, in the ledger's unit
    phase: str | None = None  # `share`: extract | kmeans | pbt | train
    unavailable: str | None = None  # no target of the project can test it: the reason (the claim reads not run)
    note: str = ""  # our reading and the offline stand-ins, printed with the claim

    def validate(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_]+", self.id):
            raise ValueError(f"claim id '{self.id}' must be letters, digits and '_'")
        if self.unavailable:
            return
        if not self.target or not self.a:
            raise ValueError(f"claim {self.id}: needs `target` and `a` (or `unavailable` with the reason)")
        if not (self.b or self.b_runs):
            raise ValueError(f"claim {self.id}: a {self.kind} claim needs `b` (the baseline row)")
        if self.kind in ("difference", "count") and not self.columns:
            raise ValueError(f"claim {self.id}: a {self.kind} claim needs `columns`")
        if self.kind == "difference" and len(self.columns) != 1:
            raise ValueError(f"claim {self.id}: a difference compares one column, got {len(self.columns)}")
        if self.kind == "count" and self.direction == "within":
            raise ValueError(f"claim {self.id}: a count claim has direction positive or negative")
        if self.kind == "share" and self.phase not in PHASES:
            raise ValueError(f"claim {self.id}: a share claim needs `phase` ({', '.join(PHASES)})")
        if self.direction == "within":
            if len(self.band) != 2 or self.band[0] > self.band[1]:
                raise ValueError(f"claim {self.id}: direction within needs `band: [low, high]`")
        elif self.band:
            raise ValueError(f"claim {self.id}: `band` is for direction within only")
        if self.paper_value is not None and self.direction in ("positive", "negative") and self.kind != "count":
            if (self.paper_value > 0) != (self.direction == "positive"):
                raise ValueError(f"claim {self.id}: paper_value {self.paper_value} contradicts direction "
                                 f"{self.direction}")


@dataclass
class ClaimsConfig:
    """The ``claims:`` section of the project config (module docstring)."""
    files: list[str] = field(default_factory=list)  # claim files, relative to the config that lists them
    resamples: int = 2000  # bootstrap resamples per interval
    seed: int = 0  # each interval: numpy default_rng(seed), drawn afresh (the same cell, the same interval)
    confidence: float = 0.95

    def validate(self) -> None:
        if self.resamples < 100:
            raise ValueError(f"resamples must be >= 100 for a percentile interval, got {self.resamples}")
        if not 0.5 <= self.confidence < 1.0:
            raise ValueError(f"confidence must be in [0.5, 1), got {self.confidence}")


__all__ = ["ClaimConfig", "ClaimsConfig", "KINDS", "PHASES"]
