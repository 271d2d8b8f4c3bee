"""The claims ledger's config: the ``claims:`` section of the project config (:class:`ClaimsConfig`) and one claim of
``config/claims.yaml`` (:class:`ClaimConfig`), which names the paper's number, where it is printed, and the runs and
metric to judge it on. The fields are documented below and in config/claims.yaml.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Literal

from protoclip.files.records import PHASES

KINDS = ("difference", "gain", "count", "share", "overhead", "time_ratio", "best", "most", "equilibrium", "toy")
MAGNITUDE_TESTS = ("equivalence", "at_most", "at_least", "none")


@dataclass
class Citation:
    """Another place the paper prints the same claim (the same runs and column): checked against the text too."""
    line: int  # the line of the claim's `source` text
    where: str  # its table / figure / section
    quote: str  # the paper's words on that line, verbatim
    paper_text: str = ""  # the number as printed there, when it differs ("+1.79%")


@dataclass
class PaperComparison:
    """The claim's runs and metric in the paper configuration (config/paper.yaml), whose targets are not the
    offline default's: the same fields as the claim's own, used where the claim's ``target`` is not declared."""
    target: str | None = None  # a target config/paper.yaml declares (e.g. table_methods_paper)
    a: str | None = None  # its row labels, as the claim's `a` / `b`
    b: str | None = None
    columns: list[str] = field(default_factory=list)
    metric: str | None = None
    a_runs: list[str] = field(default_factory=list)
    b_runs: list[str] = field(default_factory=list)
    unavailable: str | None = None  # no run of the paper configuration can test it: the reason (data, hardware)
    note: str = ""  # replaces the claim's note there (its offline stand-ins do not apply)


@dataclass
class ClaimConfig:
    """One claim: the paper's number and where it is printed, and the two run families and the metric through a
    paper target's rows and column (``target``, ``a``, ``b``, ``columns``: the labels of config/experiments/*.yaml),
    so the ledger compares exactly what the tables show; ``a_runs`` / ``b_runs`` pin other runs where the table's
    own rows are not the claim's configuration. The loader (protoclip.project) checks that a target's rows and
    columns exist; a claim whose target this config does not declare reads "not run". ``paper_config``: its rows
    and columns in config/paper.yaml, whose targets are not the offline default's (:meth:`resolved`, docs/claims.md)."""
    id: str  # the ledger's row id (letters, digits, '_')
    paper: str  # whose claim: ProtoCLIP, nCLIP/xCLIP, temperature (multi-token), PCL, PAUC
    source: str  # the paper's text file (../shared/papers/<source>)
    line: int  # the line of that text where the claim is printed
    where: str  # its table / figure / section ("Table IV, Sec. IV-E3")
    quote: str  # the paper's words on that line, verbatim (a test checks it is there)
    paper_value: float | None  # the paper's number in the ledger's unit (None: the paper states none)
    paper_text: str  # the number as printed ("+5.81%"), or the words ("negligible")
    # difference: a - b of one column (points); count: in how many of `columns` a - b has the claimed sign;
    # share: a's time in `phase` in % of a's own training-phase time over the same episodes (paired within the
    # run; the training phase is the work CLIP does per epoch, Fig. 9's base); overhead: % more time per epoch of
    # a than b (between runs); time_ratio: a's total training time in % of b's; gain: two gains compared,
    # (a - b on columns[0]) - (a - b on columns[1]) ("more advantage in kNN than in linear probing"); best: a
    # ahead of each of `rows` on one column ("0.2M is the best episode size": a minus the best of the others);
    # most: each of `rows` ahead of b on most of `columns` ("all ablations beat CLIP on most metrics");
    # equilibrium: the final logit scales of `rows` (runs from different initial scales), their log-range in % of
    # the initial scales' ("the temperature converges to an equilibrium value irrespective of initialization");
    # toy: PAUC's toy table (results/toy/pauc_toy.csv, no target): in how many of its class settings method a's
    # `columns[0]` minus method b's has the claimed sign (a count, by the sign test)
    kind: Literal["difference", "gain", "count", "share", "overhead", "time_ratio", "best", "most",
                  "equilibrium", "toy"] = "difference"
    target: str | None = None  # the paper target whose rows / columns name the runs and the metric
    a: str | None = None  # row label of the claimed-better run family (the minuend)
    b: str | None = None  # row label of the baseline (the subtrahend; for `share`, the time base)
    columns: list[str] = field(default_factory=list)  # column label(s): one, or the sets a count runs over
    metric: str | None = None  # another metric of the column's task than the column's own (e.g. image_to_text_R@1)
    rows: list[str] = field(default_factory=list)  # best / most: the row labels compared (empty: every other row)
    a_runs: list[str] = field(default_factory=list)  # candidate runs for a instead of the row's (first configured)
    b_runs: list[str] = field(default_factory=list)
    # the direction question: positive / negative: the paper's sign (the 95 % interval must exclude 0 on it);
    # none: the claim has no sign to test (a share, or an overhead that is positive by construction)
    direction: Literal["positive", "negative", "none"] = "positive"
    # the magnitude question against paper_value: equivalence (two one-sided tests, [paper - margin, paper +
    # margin]), at_most / at_least (the paper's one-sided words: "only", "negligible", "less than": the bound is
    # paper_value (0 when null) + / - margin), none (the paper prints no magnitude)
    magnitude: Literal["equivalence", "at_most", "at_least", "none"] = "equivalence"
    margin: float | None = None  # m, in the ledger's unit, fixed before any number of ours (margin_why says how)
    margin_why: str = ""  # the margin's justification, printed with the claim
    phase: str | None = None  # `share`: extract | kmeans | pbt
    unavailable: str | None = None  # no target of the project can test it: the reason (the claim reads unavailable)
    note: str = ""  # our reading and the offline stand-ins, printed with the claim
    also: list[Citation] = field(default_factory=list)  # other places the paper prints this claim
    # the ledger's unit where neither the kind nor the column says it ("% of memory", "logit scale"); None:
    # the kind's (points, sets, % of time) or the column's score (ARI, AMI, NEMD)
    unit: str | None = None
    # the comparison in config/paper.yaml where `target` (the offline default's) is not declared there
    paper_config: PaperComparison | None = None

    def validate(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_]+", self.id):
            raise ValueError(f"claim id '{self.id}' must be letters, digits and '_'")
        if self.paper_config is not None:  # its paper-configuration comparison, checked in every config
            self.in_paper_config()
        if self.unavailable:
            return
        if not (self.target or self.kind == "toy") or not (self.a or self.kind in ("most", "equilibrium")):
            raise ValueError(f"claim {self.id}: needs `target` and `a` (or `unavailable` with the reason)")
        if self.kind == "equilibrium" and len(self.rows) < 2:
            raise ValueError(f"claim {self.id}: an equilibrium claim needs two or more `rows` (initialisations)")
        if not (self.b or self.b_runs or self.kind in ("best", "equilibrium")):
            raise ValueError(f"claim {self.id}: a {self.kind} claim needs `b` (the baseline row)")
        if self.kind in ("difference", "gain", "count", "best", "most", "toy") and not self.columns:
            raise ValueError(f"claim {self.id}: a {self.kind} claim needs `columns`")
        if self.kind in ("difference", "best") and len(self.columns) != 1:
            raise ValueError(f"claim {self.id}: a {self.kind} compares one column, got {len(self.columns)}")
        if self.kind == "gain" and len(self.columns) != 2:
            raise ValueError(f"claim {self.id}: a gain compares two columns' differences, got {len(self.columns)}")
        if self.kind in ("count", "best", "most", "toy") and self.direction == "none":
            raise ValueError(f"claim {self.id}: a {self.kind} claim has direction positive or negative")
        if self.kind == "share" and self.phase not in PHASES[:3]:
            raise ValueError(f"claim {self.id}: a share claim needs `phase` ({', '.join(PHASES[:3])})")
        if self.magnitude != "none":
            if self.margin is None or self.margin < 0 or not self.margin_why:
                raise ValueError(f"claim {self.id}: a magnitude test needs `margin` >= 0 and `margin_why`")
            if self.magnitude == "equivalence" and (self.paper_value is None or self.margin <= 0):
                raise ValueError(f"claim {self.id}: an equivalence test needs `paper_value` and `margin` > 0")
        elif self.margin is not None:
            raise ValueError(f"claim {self.id}: `margin` is for a magnitude test (magnitude: none)")
        if self.direction == "none" and self.magnitude == "none":
            raise ValueError(f"claim {self.id}: neither a direction nor a magnitude to test")
        if self.paper_value is not None and self.direction != "none" and self.kind not in ("count", "most", "toy"):
            if (self.paper_value > 0) != (self.direction == "positive"):
                raise ValueError(f"claim {self.id}: paper_value {self.paper_value} contradicts direction "
                                 f"{self.direction}")

    def resolved(self, declared: Collection[str]) -> "ClaimConfig":
        """The claim as a config with targets ``declared`` judges it: itself where its ``target`` is declared (or
        it has no ``paper_config``, or it is unavailable and ``paper_config``'s target is not declared either),
        else with ``paper_config``'s runs, metric, note and reason. One claim, one paper number and quote: only
        what it is measured on differs between configurations."""
        alt = self.paper_config
        if alt is None or self.target in declared or (self.unavailable and alt.target not in declared):
            return self
        return self.in_paper_config()

    def in_paper_config(self) -> "ClaimConfig":
        """The claim with ``paper_config``'s fields in place of its own (validated)."""
        alt = self.paper_config
        fields = {k: getattr(alt, k) for k in ("target", "a", "b", "columns", "metric", "a_runs", "b_runs",
                                              "unavailable")}
        out = dataclasses.replace(self, **fields, note=alt.note or self.note, paper_config=None)
        out.validate()
        return out

    def bound(self) -> float | None:
        """The magnitude test's one-sided bound (at_most / at_least), in the ledger's unit."""
        base = self.paper_value or 0.0
        return {"at_most": base + (self.margin or 0.0), "at_least": base - (self.margin or 0.0)}.get(self.magnitude)


@dataclass
class ClaimsConfig:
    """The ``claims:`` section of the project config: the claim files and the bootstrap's settings.

    ::

        claims:
          files: [claims.yaml]    # relative to the config file; each holds a top-level `claims:` list
          resamples: 2000         # bootstrap resamples per interval
          seed: 0                 # every interval draws from numpy's default_rng(seed) afresh
          confidence: 0.95        # the direction question's two-sided interval (magnitudes: 90 %)
          paper_scale: false      # true only where the runs use the papers' data and sizes (config/paper.yaml)
    """
    files: list[str] = field(default_factory=list)  # claim files, relative to the config that lists them
    resamples: int = 2000  # bootstrap resamples per interval
    seed: int = 0  # each interval: numpy default_rng(seed), drawn afresh (the same cell, the same interval)
    confidence: float = 0.95  # the direction question's two-sided interval (the magnitude's: 1 - 2 (1 - this))
    # the runs use the papers' data and sizes (config/paper.yaml): only then can a magnitude be reproduced;
    # false (the offline default): the ledger judges directions and says why magnitudes stay not resolved
    paper_scale: bool = False

    def validate(self) -> None:
        if self.resamples < 100:
            raise ValueError(f"resamples must be >= 100 for a percentile interval, got {self.resamples}")
        if not 0.5 <= self.confidence < 1.0:
            raise ValueError(f"confidence must be in [0.5, 1), got {self.confidence}")


__all__ = ["ClaimConfig", "ClaimsConfig", "Citation", "PaperComparison", "KINDS", "PHASES", "MAGNITUDE_TESTS"]
