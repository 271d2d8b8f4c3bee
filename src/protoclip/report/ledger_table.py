"""The claims ledger's files: the rows that protoclip.claims judges (the engine, the verdict rules, the first
line's counts), written as tables, drawn as a forest plot and logged to MLflow (docs/claims.md).

    protoclip report --config config/config.yaml     # -> results/tables/claims.{md,csv,tex,html,json}, claims.png
"""
from __future__ import annotations

import html
import logging
import math
from pathlib import Path

import numpy as np
import pandas as pd

from protoclip.claims import ledger
from protoclip.claims.config import ClaimConfig
from protoclip.claims.engine import ClaimEngine, judge_claims
from protoclip.claims.rows import LedgerRow, summary_text
from protoclip.files import records
from protoclip.files.atomic import atomic_path, write_text
from protoclip.files.layout import ClaimsFiles, Layout
from protoclip.report.paper_targets import ReportProject
from protoclip.report.tables import rst_escape
from protoclip.report.values import Results

log = logging.getLogger(__name__)

_NO_CLAIM = ClaimConfig(id="none", paper="", source="", line=0, where="", quote="", paper_value=None, paper_text="",
                        unavailable="none")


def ledger_frame(rows: list[LedgerRow]) -> pd.DataFrame:
    return pd.DataFrame([r.record() for r in rows])


def _magnitude_cell(r: LedgerRow) -> str:
    if r.magnitude in (*ledger.NOT_JUDGED, ledger.NOT_TESTED):
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
            f"This ledger: {scale}. Not run: {ledger.RULES['not run']}. Skipped: {ledger.RULES['skipped']}. "
            f"Unavailable: {ledger.RULES['unavailable']}.")


def write_ledger(cfg: ReportProject, rows: list[LedgerRow]) -> ClaimsFiles:
    """``claims.{md,csv,tex,html,json}``, the forest plot and its caption; returns their paths by name."""
    files = Layout.from_config(cfg).claims_files()
    frame, shown = ledger_frame(rows), _display(rows, cfg.claims.confidence)
    summary = summary_text(rows)
    head = f"**Claims ledger.** {summary}. {rule_text(cfg)}"
    body = shown.to_markdown(index=False, disable_numparse=True) if rows else "(no claims configured)"
    write_text(files.md, f"{head}\n\n{body}\n")
    if not rows:  # no claim configured: the files still exist (DVC and Snakemake outputs), with their header
        frame = pd.DataFrame(columns=list(LedgerRow(_NO_CLAIM).record()))
        shown = pd.DataFrame(columns=["claim", "verdict"])
    with atomic_path(files.csv) as tmp:
        frame.to_csv(tmp, index=False)
    with atomic_path(files.tex) as tmp:
        shown.to_latex(tmp, index=False, caption=head.replace("**", ""), label="tab:claims", escape=True,
                       longtable=True)
    write_text(files.html, f"<p>{html.escape(head.replace('**', ''))}</p>\n"
               + shown.to_html(classes="paper-table", border=1, index=False) + "\n")
    records.write_claims(files.json, {r.claim.id: {
        "ours": r.ours, "ci_low": r.lo, "ci_high": r.hi, "ci90_low": r.lo90, "ci90_high": r.hi90,
        "paper": r.claim.paper_value, "margin": r.claim.margin, "p_holm": r.p_holm, "verdict": r.verdict,
        "direction": r.direction, "magnitude": r.magnitude} for r in rows})
    forest_plot(rows, files.png)
    write_text(files.rst, rst_escape(f"Claims ledger: each claim's paper number (red diamond) and its margin (red "
                                     f"band) beside our estimate with its 95 % (thin) and 90 % (thick) intervals, "
                                     f"one panel per unit. {summary}. {rule_text(cfg)}") + "\n")
    return files


COLORS = {ledger.REPRODUCED: "#2a9d4b", ledger.CONTRADICTED: "#c0392b", ledger.NOT_RESOLVED: "#7f7f7f",
          ledger.NOT_TESTED: "#7f7f7f", ledger.NOT_RUN: "#bbbbbb", ledger.SKIPPED: "#bbbbbb",
          ledger.UNAVAILABLE: "#bbbbbb", ledger.NOT_DECISIVE: "#7f7f7f",
          ledger.ONE_VALUE: "#7f7f7f",
          ledger.AT_CHANCE: "#bbbbbb"}


def forest_plot(rows: list[LedgerRow], out: Path) -> Path:
    """Each claim's paper number and margin beside our estimate and intervals, one panel per unit (points, %
    of time, sets); the verdict in words at the right, coloured by the direction (or the magnitude)."""
    import matplotlib  # heavy: matplotlib, only when the plot is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy: matplotlib, only when the plot is drawn

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


def run_ledger(cfg: ReportProject, results: Results, engine: ClaimEngine | None = None
               ) -> tuple[list[LedgerRow], ClaimsFiles]:
    """Every configured claim evaluated and written; returns the rows and the files.

        rows, files = run_ledger(cfg, Results(cfg))
    """
    engine = engine or ClaimEngine(cfg, results)
    rows = judge_claims(engine, cfg.paper_claims())
    for r in rows:
        log.info("claim %s: %s%s (%.1f s)", r.claim.id, r.verdict, f" ({r.reason})" if r.reason else "",
                 r.seconds)
    return rows, write_ledger(cfg, rows)


def log_ledger(cfg: ReportProject, tracker) -> None:
    """Each claim's result into a ``claims`` MLflow run (protoclip.tracking.claims_run): tags per claim (its
    verdict in words, and each question's: filter the runs table with
    ``tags.`protoclip.claim.cc_linear_32ep.direction` = 'reproduced'``), our estimate, intervals, the paper's
    number and margin and the Holm-adjusted p as metrics, the ledger files as artifacts."""
    files = Layout.from_config(cfg).claims_files()
    ledger_json = files.json
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
    for path in files.artifacts():
        tracker.log_artifact(path, "claims")


__all__ = ["run_ledger", "write_ledger", "forest_plot", "log_ledger", "rule_text"]
