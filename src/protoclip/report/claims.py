"""The claims ledger: each claim of the papers (config/claims.yaml), our measured difference, its 95 % interval
and a verdict; also the intervals of the paper tables' difference rows.

    protoclip report --config config/config.yaml     # -> results/tables/claims.{md,csv,tex,html,json},
                                                     #    results/figures/claims.png (forest plot)

A claim names a paper target's rows and column(s) (protoclip.claims.config), so our point estimate is exactly
the tables' number (difference of the two rows' means over their seeds, each a mean over the column's sets). The
interval resamples what that number is computed from: the per-example results the evaluation kept beside each
metrics file (``<task>.examples.npz``: a hit per test image, a first-match rank per retrieval query) and, for
the cost claims, the train logs' per-episode phase times; seeds then examples (protoclip.claims.bootstrap). The
verdict follows protoclip.claims.ledger. A claim whose runs, data or per-example results are absent reads
"not run" with the reason; nothing is left blank.

    engine = ClaimEngine(cfg, Results(cfg))
    rows = [engine.evaluate(c) for c in cfg.paper_claims()]
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

from protoclip import records
from protoclip.atomic import atomic_path, write_text
from protoclip.claims import ledger
from protoclip.claims.bootstrap import Component, CountsCache, Units, percentile_interval, point, resample
from protoclip.claims.config import ClaimConfig
from protoclip.layout import Layout
from protoclip.report.config import ColumnConfig, TargetConfig, first_configured
from protoclip.report.values import Results, episode_times

log = logging.getLogger(__name__)

UNITS = {"difference": "points", "count": "sets", "share": "% of time", "overhead": "% of time",
         "time_ratio": "% of time"}
RECALL = re.compile(r"(image_to_text|text_to_image)_R@(\d+)")


class NotRun(Exception):
    """Why a claim (or an interval) cannot be decided: its one-line reason."""


def metric_units(task: str, metric: str, examples: dict[str, np.ndarray]) -> Units | None:
    """The resampling units of ``metric`` from a task's per-example arrays (records.read_examples); None when the
    metric is no mean over them (ARI, NEMD, ...). With every unit drawn once it is the metrics file's number.

    zero-shot / linear / kNN ``top1`` / ``top5``: the mean hit of the test images; retrieval ``<dir>_R@k`` and
    ``mean_recall``: units are the images, each with its captions (image queries: hit or not; caption queries:
    the image's captions hit, over its number of captions), so an image is drawn together with its captions."""
    if task in ("zeroshot", "linear", "knn"):
        return Units.mean(examples[metric]) if metric in ("top1", "top5") and metric in examples else None
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
    """One claim as the ledger prints it."""
    claim: ClaimConfig
    verdict: str
    reason: str = ""  # not run: why
    ours: float | None = None  # our point estimate (the tables' number), in the claim's unit
    lo: float | None = None
    hi: float | None = None
    runs: str = ""  # "protoclip_tiny (3 seeds) - clip_tiny (3 seeds)"
    measured: str = ""  # "linear top1 on fashion_mnist (ImageNet linear: imagenet -> fashion_mnist)"
    seconds: float = 0.0  # wall time to compute the row

    @property
    def unit(self) -> str:
        return UNITS[self.claim.kind]

    def ours_text(self) -> str:
        if self.ours is None:
            return "-"
        signed = self.claim.kind in ("difference", "overhead")
        digits = 0 if self.claim.kind == "count" else 2
        if self.lo is None:
            return ledger.signed(self.ours, digits) if signed else f"{self.ours:.{digits}f}"
        return ledger.with_interval(self.ours, self.lo, self.hi, digits, sign=signed)

    def record(self) -> dict:
        c = self.claim
        return {"id": c.id, "paper": c.paper, "where": c.where, "source": c.source, "line": c.line,
                "quote": c.quote, "paper_value": c.paper_value, "paper_text": c.paper_text, "kind": c.kind,
                "unit": self.unit, "direction": c.direction, "band": list(c.band), "ours": self.ours,
                "ci_low": self.lo, "ci_high": self.hi, "ours_text": self.ours_text(), "verdict": self.verdict,
                "reason": self.reason, "rule": ledger.RULES[ledger.rule_of(c.kind, c.direction)]
                if self.verdict != ledger.NOT_RUN else ledger.RULES["not run"],
                "runs": self.runs, "measured": self.measured, "note": c.note, "seconds": round(self.seconds, 3)}


class ClaimEngine:
    """Intervals and verdicts from a project's result files (one per report: per-example arrays are cached)."""

    def __init__(self, cfg, results: Results):
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
            if task not in ("zeroshot", "linear", "knn", "retrieval"):
                raise NotRun(f"{what} is not a mean over test examples: no per-example results, no interval")
            raise NotRun(f"{run}: no per-example results for {task} on {dataset} (evaluated before they were "
                         "kept: rerun its evaluation)")
        units = metric_units(task, metric, examples)
        if units is None:
            raise NotRun(f"{what} is not a mean over test examples: no interval")
        expected = self.results.value(run, task, dataset, metric)
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

    def column_draws(self, runs_a: list[str], runs_b: list[str], columns: list[tuple[ColumnConfig, list[str]]]
                     ) -> np.ndarray:
        """[columns, resamples]: each column's resampled a - b (its sets averaged, as the tables average them)."""
        comps, owner = [], []
        for i, (col, sets) in enumerate(columns):
            new = self.column_components(runs_a, runs_b, col, sets)
            comps += new
            owner += [i] * len(new)
        a, b = resample(comps, self.settings.resamples, self.settings.seed, self._counts)
        owner = np.array(owner)
        return np.stack([(a - b)[owner == i].mean(axis=0) for i in range(len(columns))])

    def column_interval(self, runs_a: list[str], runs_b: list[str], column: ColumnConfig, sets: list[str],
                        point_value: float) -> Interval:
        """The interval of one difference cell (a - b of ``column`` on ``sets``); NotRun when there is none."""
        lo, hi = percentile_interval(self.column_draws(runs_a, runs_b, [(column, sets)])[0],
                                     self.settings.confidence)
        return Interval(point_value, lo, hi)

    # ---- one claim
    def evaluate(self, claim: ClaimConfig) -> LedgerRow:
        t0 = time.perf_counter()
        row = LedgerRow(claim, ledger.NOT_RUN)
        try:
            if claim.unavailable:
                raise NotRun(claim.unavailable)
            target = self.target(claim)
            base_a, runs_a = self.family(target, claim.a, claim.a_runs)
            base_b, runs_b = self.family(target, claim.b, claim.b_runs)
            row.runs = f"{_group(base_a, runs_a)} vs {_group(base_b, runs_b)}"
            if claim.kind in ("difference", "count"):
                interval = self._columns(claim, target, base_a, base_b, runs_a, runs_b, row)
            else:
                interval = self._cost(claim, runs_a, runs_b, row)
            row.ours, row.lo, row.hi = interval.point, interval.lo, interval.hi
            direction = "count" if claim.kind == "count" else claim.direction
            row.verdict = ledger.verdict(direction, interval.lo, interval.hi, claim.band,
                                         n_sets=len(claim.columns))
        except NotRun as why:
            row.verdict, row.reason = ledger.NOT_RUN, str(why)
        row.seconds = time.perf_counter() - t0
        return row

    def _columns(self, claim: ClaimConfig, target: TargetConfig, base_a: str, base_b: str, runs_a: list[str],
                 runs_b: list[str], row: LedgerRow) -> Interval:
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
        first = columns[0][0]
        row.measured = (f"{first.task} {first.metric} on " + " + ".join(columns[0][1])
                        + (f" ({notes[0]})" if notes[0] else "")) if claim.kind == "difference" else (
            f"{first.task} {first.metric} on {len(columns)} sets")
        sign = -1.0 if claim.direction == "negative" else 1.0
        if claim.kind == "difference":
            row.ours = diffs[0]  # shown even when the interval cannot be computed (NotRun below)
        draws = self.column_draws(runs_a, runs_b, columns)
        if claim.kind == "difference":
            lo, hi = percentile_interval(draws[0], self.settings.confidence)
            return Interval(diffs[0], lo, hi)
        counts = (sign * draws > 0).sum(axis=0).astype(np.float64)
        lo, hi = percentile_interval(counts, self.settings.confidence)
        return Interval(float(sum(sign * d > 0 for d in diffs)), lo, hi)

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

    def _cost(self, claim: ClaimConfig, runs_a: list[str], runs_b: list[str], row: LedgerRow) -> Interval:
        """Share, overhead or time ratio from the train logs' per-episode phase times (episodes resampled per run,
        then seeds)."""
        def units(run: str, phase: str, per_epoch: bool) -> Units:
            times = episode_times(self.results.layout.train_log(run))
            if times is None or not np.isfinite(times["total"]).all() or times["total"].sum() <= 0:
                raise NotRun(f"{run}: no episode times in its train log")
            n = len(times["total"])
            scale = n / self.cfg.run(run).epochs if per_epoch else float(n)
            return Units.mean(times[phase], scale=scale)

        per_epoch = claim.kind != "time_ratio"
        phase_a = claim.phase if claim.kind == "share" else "total"
        comp = Component([units(r, phase_a, per_epoch) for r in runs_a],
                         [units(r, "total", per_epoch) for r in runs_b], paired=False, key="episodes")
        pa, pb = point([comp])
        a, b = resample([comp], self.settings.resamples, self.settings.seed)
        stat = {"share": lambda x, y: 100.0 * x / y, "overhead": lambda x, y: 100.0 * (x / y - 1.0),
                "time_ratio": lambda x, y: 100.0 * x / y}[claim.kind]
        what = {"share": f"{claim.phase} time per epoch in % of the baseline's epoch time",
                "overhead": "time per epoch, % more than the baseline",
                "time_ratio": "total training time in % of the baseline's"}[claim.kind]
        row.measured = f"{what} (train_log.jsonl episode phase times)"
        lo, hi = percentile_interval(stat(a[0], b[0]), self.settings.confidence)
        return Interval(float(stat(pa[0], pb[0])), lo, hi)


def _group(base: str, runs: list[str]) -> str:
    return f"{base} ({len(runs)} seed{'s' if len(runs) != 1 else ''})"


# --------------------------------------------------------------------------- outputs
_NO_CLAIM = ClaimConfig(id="none", paper="", source="", line=0, where="", quote="", paper_value=None, paper_text="",
                        unavailable="none")


def ledger_frame(rows: list[LedgerRow]) -> pd.DataFrame:
    return pd.DataFrame([r.record() for r in rows])


def _display(rows: list[LedgerRow], confidence: float) -> pd.DataFrame:
    """The ledger as people read it: one line per claim."""
    return pd.DataFrame([{
        "claim": r.claim.id, "paper": f"{r.claim.paper}, {r.claim.where} (line {r.claim.line})",
        "paper's number": r.claim.paper_text,
        f"ours [{confidence:.0%} interval]": r.ours_text() + ("" if r.ours is None else f" {r.unit}"),
        "verdict": r.verdict + (f": {r.reason}" if r.reason else ""),
        "runs; metric": "; ".join(x for x in (r.runs, r.measured) if x)} for r in rows])


def rule_text(cfg) -> str:
    s = cfg.claims
    return (f"Ours: the tables' number (difference of the two rows' means over seeds) with its {s.confidence:.0%} "
            f"percentile bootstrap interval ({s.resamples} resamples, seed {s.seed}): test examples resampled "
            "(paired: both runs on the same images; retrieval: images with their captions), then seeds "
            "(protoclip.claims.bootstrap); cost claims resample training episodes, then seeds. Verdicts: "
            f"differences, {ledger.RULES['sign']}; counts, {ledger.RULES['count']}; magnitudes and parity "
            f"(band in claims.yaml), {ledger.RULES['within']}; not run: {ledger.RULES['not run']}.")


def write_ledger(cfg, rows: list[LedgerRow]) -> dict[str, Path]:
    """``claims.{md,csv,tex,html,json}``, the forest plot and its caption; returns the paths by suffix."""
    lay = Layout.from_config(cfg)
    md, csv, tex, htm, js, png, rst = lay.claims_files()
    frame, shown = ledger_frame(rows), _display(rows, cfg.claims.confidence)
    summary = ", ".join(f"{sum(r.verdict == v for r in rows)} {v}" for v in ledger.VERDICTS)
    head = f"**Claims ledger.** {len(rows)} claims: {summary}. {rule_text(cfg)}"
    body = shown.to_markdown(index=False, disable_numparse=True) if rows else "(no claims configured)"
    write_text(md, f"{head}\n\n{body}\n")
    if not rows:  # no claim configured: the files still exist (DVC and Snakemake outputs), with their header
        frame = pd.DataFrame(columns=list(LedgerRow(_NO_CLAIM, ledger.NOT_RUN).record()))
        shown = pd.DataFrame(columns=["claim", "verdict"])
    with atomic_path(csv) as tmp:
        frame.to_csv(tmp, index=False)
    with atomic_path(tex) as tmp:
        shown.to_latex(tmp, index=False, caption=head.replace("**", ""), label="tab:claims", escape=True,
                       longtable=True)
    write_text(htm, f"<p>{html.escape(head.replace('**', ''))}</p>\n"
               + shown.to_html(classes="paper-table", border=1, index=False) + "\n")
    records.write_claims(js, {r.claim.id: {"ours": r.ours, "ci_low": r.lo, "ci_high": r.hi,
                                           "paper": r.claim.paper_value, "verdict": r.verdict} for r in rows})
    forest_plot(rows, png)
    write_text(rst, _rst(f"Claims ledger: each claim's paper number (red) beside our estimate and its "
                         f"interval (black), one panel per unit. {summary}. {rule_text(cfg)}") + "\n")
    return {"md": md, "csv": csv, "tex": tex, "html": htm, "json": js, "png": png, "rst": rst}


def _rst(text: str) -> str:
    return re.sub(r"([\\`*|_<>\[\]])", r"\\\1", " ".join(text.split()))


COLORS = {ledger.REPRODUCED: "#2a9d4b", ledger.CONTRADICTED: "#c0392b", ledger.NOT_RESOLVED: "#7f7f7f",
          ledger.NOT_RUN: "#bbbbbb"}


def forest_plot(rows: list[LedgerRow], out: Path) -> Path:
    """Each claim's paper number beside our estimate and interval, one panel per unit (points, % of time, sets)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = {u: [r for r in rows if r.unit == u] for u in dict.fromkeys(r.unit for r in rows)} or {"points": []}
    heights = [max(len(g), 1) for g in groups.values()]
    fig, axes = plt.subplots(len(groups), 1, figsize=(10, 1.2 + 0.36 * sum(heights) + 0.6 * len(groups)),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    for ax, (unit, group) in zip(axes[:, 0], groups.items()):
        y = np.arange(len(group))[::-1]
        for yi, r in zip(y, group):
            color = COLORS[r.verdict]
            if r.ours is not None and r.lo is not None:
                ax.plot([r.lo, r.hi], [yi, yi], color="black", lw=2, solid_capstyle="butt")
                ax.plot(r.ours, yi, "o", color="black", ms=5)
            elif r.ours is not None:  # a point without an interval (not run: nothing to resample)
                ax.plot(r.ours, yi, "o", mfc="none", mec="#888888", ms=5)
            if r.claim.paper_value is not None:
                ax.plot(r.claim.paper_value, yi, "D", color="#d62728", ms=6, alpha=0.85)
            if len(r.claim.band) == 2:
                ax.plot(r.claim.band, [yi, yi], color="#d62728", lw=6, alpha=0.15, solid_capstyle="butt")
            ax.annotate(r.verdict if r.verdict != ledger.NOT_RUN else "not run", (1.01, yi),
                        xycoords=("axes fraction", "data"), va="center", fontsize=8, color=color)
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
    axes[0, 0].set_title("Claims: the paper's number (red diamond; band: the claim's range) vs ours (black: estimate "
                         "and 95 % interval; hollow: no interval)", fontsize=9)
    fig.tight_layout()
    fig.subplots_adjust(right=0.8)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return out


def run_ledger(cfg, results: Results, engine: ClaimEngine | None = None) -> tuple[list[LedgerRow], dict]:
    """Every configured claim evaluated and written; returns the rows and the files."""
    engine = engine or ClaimEngine(cfg, results)
    rows = [engine.evaluate(c) for c in cfg.paper_claims()]
    for r in rows:
        log.info("claim %s: %s%s (%.1f s)", r.claim.id, r.verdict, f" ({r.reason})" if r.reason else "",
                 r.seconds)
    return rows, write_ledger(cfg, rows)


def log_ledger(cfg, tracker) -> None:
    """Each claim's result into a ``claims`` MLflow run (protoclip.tracking.claims_run): a tag per claim (its
    verdict: filter the runs table with ``tags.`protoclip.claim.cc_linear_32ep` = 'reproduced'``), our
    estimate, interval and the paper's number as metrics, the ledger files as artifacts."""
    lay = Layout.from_config(cfg)
    ledger_json = lay.claims_files()[4]
    if not ledger_json.exists():
        return
    claims = records.read_claims(ledger_json)
    tracker.set_tags({f"protoclip.claim.{cid}": c["verdict"] for cid, c in claims.items()})
    metrics = {}
    for cid, c in claims.items():
        for key in ("ours", "ci_low", "ci_high", "paper"):
            if isinstance(c.get(key), (int, float)) and math.isfinite(c[key]):
                metrics[f"claim/{cid}/{key}"] = float(c[key])
    tracker.log_metrics(metrics)
    for path in lay.claims_files()[:6]:
        tracker.log_artifact(path, "claims")


__all__ = ["ClaimEngine", "LedgerRow", "NotRun", "metric_units", "run_ledger", "write_ledger", "forest_plot",
           "log_ledger", "rule_text"]
