"""Figures over the whole report, read faster than its tables (``protoclip report`` writes them after the targets):
ours against the paper, Table VI's per-set differences, and the runs' training curves, each with a caption
``results/report/<name>.rst``. The points drawn come from pure functions (:func:`comparable_points`,
:func:`difference_points`, :func:`curve_panels`) that the tests check against the result files.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from protoclip.report.paper_targets import ReportProject, TargetConfig
from protoclip.report.figures import _empty, _plt, _save
from protoclip.report.values import Results, paper_numbers

OURS_VS_PAPER = "ours_vs_paper"
TRAIN_CURVES = "train_curves"
DIFFERENCE_TARGETS = ("table_VI",)  # tables whose per-set differences get a figure (the paper's "+/-" rows)
FRACTION_METRICS = ("ari", "ami")  # printed in [0, 1]; every other metric of a table is a % (accuracy, recall)


def difference_figure(target_id: str) -> str:
    return f"{target_id}_differences"


def summary_names(cfg: ReportProject) -> list[str]:
    """The summary figures ``cfg`` gets (names: ``results/figures/<name>.png``, ``results/report/<name>.rst``)."""
    declared = {t.id for t in cfg.paper_targets() if t.kind == "table"}
    return ([OURS_VS_PAPER] + [difference_figure(t) for t in DIFFERENCE_TARGETS if t in declared]
            + [TRAIN_CURVES])


# --------------------------------------------------------------------------- ours against the paper
def _number(value) -> float | None:
    """A finite number, or None (empty cells, the paper's strings such as "16 (21.5)", NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def comparable_points(records: list[dict]) -> pd.DataFrame:
    """One row per comparable cell of the report's table records (``targets_long.csv``): a run row's cell
    where ours and the paper's are both numbers. Difference rows are left out (they have their own figure and
    a scale of their own), as are epochs columns (the paper prints "16 (21.5)"). Columns: target, row, column,
    metric, paper, ours, stand_in, unit ("%" or "[0, 1]")."""
    rows = []
    for rec in records:
        paper, ours = _number(rec.get("paper")), _number(rec.get("ours_mean"))
        if rec.get("row_kind") != "run" or rec.get("metric") == "epochs" or paper is None or ours is None:
            continue
        rows.append({"target": rec["target"], "row": rec["row"], "column": rec["column"], "metric": rec["metric"],
                     "paper": paper, "ours": ours, "stand_in": bool(rec.get("stand_in")),
                     "unit": "[0, 1]" if rec["metric"] in FRACTION_METRICS else "%"})
    return pd.DataFrame(rows, columns=["target", "row", "column", "metric", "paper", "ours", "stand_in", "unit"])


def plot_ours_vs_paper(points: pd.DataFrame, out: Path, title: str) -> None:
    """``results/figures/ours_vs_paper.png``: every comparable cell of the paper tables, one point each (x: the
    paper's number, y: ours), the diagonal drawn, coloured by table; hollow where the column used an offline
    stand-in set (a different data set than the paper's, named in the table's caption). ARI / AMI (in [0, 1])
    get a panel of their own beside accuracies and recalls (in %)."""
    plt = _plt()
    units = [u for u in ("%", "[0, 1]") if u in set(points["unit"])] or ["%"]
    fig, axes = plt.subplots(1, len(units), figsize=(5.2 * len(units) + 1.8, 5.4), squeeze=False)
    targets = list(dict.fromkeys(points["target"]))
    cmap = plt.get_cmap("tab10" if len(targets) <= 10 else "tab20")
    colors = {t: cmap(i % cmap.N) for i, t in enumerate(targets)}
    for ax, unit in zip(axes[0], units):
        sub = points[points["unit"] == unit]
        if sub.empty:
            _empty(ax, "no comparable cell yet: no table row has both our number and the paper's")
            continue
        for target, part in sub.groupby("target", sort=False):
            for stand_in, marker_part in part.groupby("stand_in"):
                ax.scatter(marker_part["paper"], marker_part["ours"], s=26, linewidths=1.2,
                           facecolors="none" if stand_in else colors[target], edgecolors=colors[target])
        lo = min(sub["paper"].min(), sub["ours"].min())
        hi = max(sub["paper"].max(), sub["ours"].max())
        pad = 0.05 * (hi - lo or 1.0)
        lims = (lo - pad, hi + pad)
        ax.plot(lims, lims, color="0.4", linewidth=1, linestyle="--", zorder=0)
        ax.set_xlim(lims)
        ax.set_ylim(lims)
        ax.set_aspect("equal")
        ax.set_xlabel(f"paper ({unit})")
        ax.set_ylabel(f"ours ({unit})")
        ax.set_title("accuracy / recall" if unit == "%" else "ARI / AMI", fontsize=10)
        ax.grid(alpha=0.3)
    from matplotlib.lines import Line2D  # heavy: matplotlib, only when a figure is drawn

    counts = points.groupby("target", sort=False).size()
    handles = [Line2D([], [], marker="o", linestyle="", color=colors[t], label=f"{t} ({counts[t]})") for t in targets]
    handles += [Line2D([], [], marker="o", linestyle="", color="0.3", label="paper's data set"),
                Line2D([], [], marker="o", linestyle="", markerfacecolor="none", color="0.3",
                       label="offline stand-in set"),
                Line2D([], [], color="0.4", linestyle="--", label="ours = paper")]
    axes[0][-1].legend(handles=handles, loc="center left", bbox_to_anchor=(1.03, 0.5), fontsize=8, frameon=False,
                       title="table (cells)", title_fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    _save(fig, out)


# --------------------------------------------------------------------------- a table's per-set differences
@dataclass
class DifferencePoint:
    """One set of one difference row: ours (difference of our means over seeds) and its error, the paper's."""
    difference: str  # the paper's difference row ("RN50 ProtoCLIP - CLIP")
    column: str  # the paper's column (a data set or an average)
    ours: float | None  # mean(minuend seeds) - mean(subtrahend seeds); None: a side has no result
    error: float | None  # standard error of that difference over seeds; None with one seed on a side
    seeds: tuple[int, int]  # seeds with a result (minuend, subtrahend)
    paper: float | None  # the paper's printed difference
    sets: list[str] = field(default_factory=list)  # the data sets ours used (stand-ins where the paper's lack)


def difference_points(cfg: ReportProject, results: Results, target: TargetConfig) -> list[DifferencePoint]:
    """The per-set differences of ``target``'s difference rows (paper_numbers.yaml ``differences``), ours and
    the paper's. The error is sqrt(s_a^2 / n_a + s_b^2 / n_b) with s the sample std over a row's seeds: the
    standard error of a difference of two independent means (the seeds of two methods are not paired)."""
    entry = paper_numbers(target.paper_key)
    runs = {row.paper_key: row.run for row in target.rows}
    out = []
    for label, diff in (entry.get("differences") or {}).items():
        for col in target.columns:
            if col.task == "epochs":
                continue
            sets, _ = results.column_sets(target, col)
            a, b = (runs.get(diff[k]) for k in ("minuend", "subtrahend"))
            ca, cb = (results.cell(r, col, sets) if r else None for r in (a, b))
            ours = error = None
            seeds = (ca.n if ca else 0, cb.n if cb else 0)
            if ca is not None and cb is not None and ca.mean is not None and cb.mean is not None:
                ours = ca.mean - cb.mean
                if ca.n > 1 and cb.n > 1:
                    error = math.sqrt(ca.std ** 2 / ca.n + cb.std ** 2 / cb.n)
            out.append(DifferencePoint(label, col.label, ours, error, seeds,
                                       _number((diff.get("values") or {}).get(col.paper_key)), list(sets)))
    return out


def plot_differences(points: list[DifferencePoint], out: Path, title: str, xlabel: str) -> None:
    """``results/figures/table_VI_differences.png``: Table VI's per-set differences (ProtoCLIP minus CLIP, one bar
    per set and model pair) with seed error bars, the paper's printed difference beside each."""
    plt = _plt()
    columns = list(dict.fromkeys(p.column for p in points))
    groups = list(dict.fromkeys(p.difference for p in points))
    fig, ax = plt.subplots(figsize=(11, 0.26 * max(len(columns), 1) * max(len(groups), 1) + 1.6))
    if not points:
        _empty(ax, "no difference rows")
        _save(fig, out)
        return
    height = 0.8 / len(groups)
    colors = plt.get_cmap("tab10")
    y = np.arange(len(columns))
    for g, group in enumerate(groups):
        offset = (g - (len(groups) - 1) / 2) * height
        pts = {p.column: p for p in points if p.difference == group}
        ys = y + offset
        ours = [pts[c].ours if pts[c].ours is not None else np.nan for c in columns]
        errs = [pts[c].error if pts[c].error is not None else 0.0 for c in columns]
        drawn = sum(v == v for v in ours)
        ax.barh(ys, ours, height=height * 0.9, xerr=errs, capsize=2.5, color=colors(g), alpha=0.85,
                error_kw={"elinewidth": 1}, label=f"ours: {group} ({drawn} of {len(columns)} sets)")
        paper = [pts[c].paper if pts[c].paper is not None else np.nan for c in columns]
        ax.scatter(paper, ys, marker="D", s=20, color="black", zorder=3,
                   label="the paper's printed difference" if g == 0 else None)
        for yy, c in zip(ys, columns):
            p = pts[c]
            if p.ours is not None:  # which seeds the bar and its error bar rest on, past the bar's tip
                tip = p.ours + math.copysign(p.error or 0.0, p.ours)
                ax.text(tip, yy, f" {p.seeds[0]} vs {p.seeds[1]} seeds ", va="center", fontsize=6.5, color="0.25",
                        ha="left" if p.ours >= 0 else "right")
    ax.axvline(0, color="0.3", linewidth=0.8)
    ax.margins(x=0.12)  # room for the seed counts past the bars' tips
    ax.set_yticks(y, columns, fontsize=8)
    for tick, c in zip(ax.get_yticklabels(), columns):  # a set no bar of ours reaches: grey label
        if all(p.ours is None for p in points if p.column == c):
            tick.set_color("0.5")
    ax.invert_yaxis()
    ax.set_xlabel(xlabel, fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, borderaxespad=0)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    _save(fig, out)


# --------------------------------------------------------------------------- training curves, small multiples
@dataclass
class CurvePanel:
    """One panel of the training curves: a target and, per row, its runs' (seeds') losses."""
    title: str
    lines: list[tuple[str, list[str]]]  # (legend label, the runs drawn as that line: a row's seeds)


def curve_panels(cfg: ReportProject, losses: pd.DataFrame) -> list[CurvePanel]:
    """One panel per paper target with the runs its rows compare (rows without a logged run left out), then
    one for logged runs that no target shows; a target whose runs logged nothing has no panel."""
    logged = set(losses["run"])
    panels, shown = [], set()
    for target in cfg.paper_targets():
        lines = []
        for row in target.rows:
            group = [r for r in cfg.run_group(row.run or "") if r in logged]
            if group and all(group != runs for _, runs in lines):  # a run two rows share: drawn once
                seeds = f", {len(group)} seeds" if len(group) > 1 else ""
                lines.append((f"{row.label} ({row.run}{seeds})", group))
                shown.update(group)
        if lines:
            panels.append(CurvePanel(f"{target.id}: {target.caption}", lines))
    rest = [r for r in cfg.run_names() if r in logged and r not in shown]
    if rest:
        panels.append(CurvePanel("runs of no paper target", [(r, [r]) for r in rest]))
    return panels


def _smooth(values: np.ndarray, window: int) -> np.ndarray:
    """Centred moving mean (edges: the points there are); window 1 = the values."""
    if window <= 1 or len(values) <= window:
        return values
    return pd.Series(values).rolling(window, center=True, min_periods=1).mean().to_numpy()


def plot_curve_panels(panels: list[CurvePanel], losses: pd.DataFrame, out: Path, smooth_points: int = 60) -> None:
    """``results/figures/train_curves.png``: the runs' training loss as small multiples (2 per line), one panel per
    paper target with the runs its rows compare (:func:`curve_panels`), each panel's legend beside it; a row with
    seeds is their mean per step with their range shaded. Each line is a moving mean over about 1/``smooth_points``
    of its steps."""
    plt = _plt()
    ncols = 2 if len(panels) > 1 else 1
    nrows = max(1, math.ceil(len(panels) / ncols))
    most = max((len(p.lines) for p in panels), default=1)
    panel_h = max(2.6, 0.16 * most + 1.2)
    fig, axes = plt.subplots(nrows, ncols, figsize=(8.2 * ncols, panel_h * nrows + 0.6), squeeze=False)
    by_run = {run: sub.sort_values("step") for run, sub in losses.groupby("run", sort=False)}
    cmap = plt.get_cmap("tab10" if most <= 10 else "tab20")
    for ax, panel in zip(axes.flat, panels):
        for i, (label, runs) in enumerate(panel.lines):
            wide = pd.concat([by_run[r].set_index("step")["loss"].rename(r) for r in runs], axis=1).sort_index()
            steps = wide.index.to_numpy()
            window = max(1, len(steps) // smooth_points)
            mean = _smooth(wide.mean(axis=1).to_numpy(), window)
            short = label if len(label) <= 60 else label[:57] + "..."  # the legend keeps the panel's width
            ax.plot(steps, mean, color=cmap(i % cmap.N), linewidth=1.1, label=short)
            if len(runs) > 1:
                ax.fill_between(steps, _smooth(wide.min(axis=1).to_numpy(), window),
                                _smooth(wide.max(axis=1).to_numpy(), window), color=cmap(i % cmap.N), alpha=0.18,
                                linewidth=0)
        ax.set_title(panel.title if len(panel.title) <= 80 else panel.title[:77] + "...", fontsize=8.5, loc="left")
        ax.set_xlabel("optimizer step", fontsize=8)
        ax.set_ylabel("total loss", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6.5, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, borderaxespad=0)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_axis_off()
    if not panels:
        _empty(axes.flat[0], "no run has a training log yet")
    fig.tight_layout(h_pad=1.2, w_pad=1.0)
    _save(fig, out)


# --------------------------------------------------------------------------- writing them, with captions
def write_summary_figures(cfg: ReportProject, results: Results, records: list[dict],
                          losses: pd.DataFrame) -> dict[str, tuple[Path, str]]:
    """Write every summary figure of :func:`summary_names`; returns {name: (png, caption)}."""
    layout = results.layout
    out: dict[str, tuple[Path, str]] = {}
    points = comparable_points(records)
    png = layout.figures / f"{OURS_VS_PAPER}.png"
    stand_ins, tables = int(points["stand_in"].sum()), points["target"].nunique()
    plot_ours_vs_paper(points, png, f"Ours against the paper: {len(points)} comparable table cells "
                                    f"({Path(cfg.source).name})")
    out[OURS_VS_PAPER] = (png, (
        f"Ours against the paper, one point per comparable table cell ({len(points)} cells of "
        f"{tables} table{'s' if tables != 1 else ''}): x the paper's number, y ours (mean over seeds), the dashed "
        "diagonal where they agree, coloured by table. A cell is comparable when its row is one of our runs and "
        "both numbers exist; difference rows and epochs columns are left out. Hollow points "
        f"({stand_ins}) are columns evaluated on an offline stand-in set, not the paper's data set (each table's "
        "caption names the mapping): there the distance to the diagonal also measures a different data set, "
        f"model size and training budget. ARI / AMI, in [0, 1], have their own panel. Config {cfg.source}."))
    for target in cfg.paper_targets():
        if target.kind != "table" or target.id not in DIFFERENCE_TARGETS:
            continue
        name = difference_figure(target.id)
        pts = difference_points(cfg, results, target)
        png = layout.figures / f"{name}.png"
        col = next(c for c in target.columns if c.task != "epochs")
        plot_differences(pts, png, f"{target.id}: per-set differences, ours and the paper's "
                                   f"({Path(cfg.source).name})",
                         f"difference in points of {col.task} {col.metric} (%); error bar: ±1 standard error "
                         "over seeds")
        drawn = [p for p in pts if p.ours is not None]
        out[name] = (png, (
            f"{target.id}, per data set: ProtoCLIP minus CLIP, ours (bars: the difference of our means over "
            "seeds; error bars: ±1 standard error of that difference, sqrt(s_a^2/n_a + s_b^2/n_b) over the two "
            "rows' seeds, none where a row has one seed) and the paper's printed difference (black diamonds, "
            f"{paper_numbers(target.paper_key).get('cite', '')}). {len(drawn)} of {len(pts)} bars have our "
            "result; a set we did not evaluate shows the paper's number only. Columns on offline stand-in sets "
            f"are named in the table's caption. Config {cfg.source}."))
    panels = curve_panels(cfg, losses)
    plot_curve_panels(panels, losses, layout.train_curves)
    out[TRAIN_CURVES] = (layout.train_curves, (
        f"Training curves: total loss per optimizer step, one panel per paper target with the runs its rows "
        f"compare ({len(panels)} panels; a run several targets share appears in each). A row with several "
        "seeds is their mean per step, its range shaded; every line is a centred moving mean over about 1/60 of "
        "its steps (the per-step values: results/tables/train_loss.csv). Losses of different methods sum "
        f"different terms, so compare shapes across methods, values within one. Config {cfg.source}."))
    return out


__all__ = ["comparable_points", "difference_points", "curve_panels", "write_summary_figures", "summary_names",
           "DifferencePoint", "CurvePanel", "OURS_VS_PAPER", "TRAIN_CURVES", "DIFFERENCE_TARGETS",
           "difference_figure"]
