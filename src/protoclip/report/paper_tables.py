"""Paper tables with our numbers and the paper's side by side: ``results/tables/<id>.{csv,md,tex,html}``.

Each declared table (``kind: table`` targets) keeps the paper's rows and columns, every column a pair ``ours`` /
``paper``, so that a reader compares them cell by cell; the caption says what ours was trained and evaluated on.
"""
from __future__ import annotations

import html

import pandas as pd

from protoclip.files.atomic import atomic_path, write_text
from protoclip.claims.ledger import signed, with_interval
from protoclip.claims.rows import NotRun
from protoclip.files.layout import Layout
from protoclip.report.paper_targets import ReportProject, TargetConfig
from protoclip.report.values import Cell, Results, paper_numbers, paper_value
from protoclip.tasks import TASKS

OURS, PAPER = "ours", "paper"


def _fmt_paper(v) -> str:
    """The paper's number as printed (:class:`~protoclip.report.values.PaperNumber` keeps the transcribed text)."""
    if v is None:
        return "-"
    return getattr(v, "text", None) or str(v)


def run_label(cfg: ReportProject, base: str | None) -> str:
    """``clip_tiny: tiny-rn, offline, 4 ep, 3 seeds`` (what our row was trained as; ``108000 steps`` for a run
    whose budget is in optimizer steps, train.steps)."""
    if base is None:
        return "(paper only)"
    runs = cfg.run_group(base)
    if not runs:
        return f"{base}: not configured"
    rc = cfg.run(runs[0])
    seeds = f"{len(runs)} seeds" if len(runs) > 1 else "1 seed"
    teacher = f", teacher {rc.teacher}" if rc.reads_teacher() else ""  # the method says whether it reads one
    budget = f"{rc.steps} steps" if rc.steps is not None else f"{rc.epochs:g} ep"
    return f"{base}: {rc.method}, {rc.model}, {'+'.join(rc.data)}, {budget}{teacher}, {seeds}"


def build_table(cfg: ReportProject, results: Results, target: TargetConfig,
                engine=None) -> tuple[pd.DataFrame, str, list[dict]]:
    """(display table, caption, long records) of a table target. ``engine``: a
    :class:`protoclip.claims.engine.ClaimEngine` giving the difference rows their intervals (None: points only)."""
    entry = paper_numbers(target.paper_key)
    columns = []
    mappings, chance = [], {}  # chance: {task: {set: its chance level}} of the columns whose task states one
    for col in target.columns:
        if col.task == "epochs":
            columns.append((col, [], ""))
            continue
        sets, note = results.column_sets(target, col)
        columns.append((col, sets, note))
        if note:
            mappings.append(note)
        if TASKS[col.task].chance is not None:
            runs = [r for b in target.runs() for r in cfg.run_group(b)]
            chance.setdefault(col.task, {}).update(results.chance(col.task, sets, runs))
    data, long, labels = [], [], []
    cells: dict[str, dict[str, Cell]] = {}  # paper row key -> column label -> our cell (for difference rows)
    runs = {row.paper_key: row.run for row in target.rows}  # paper row key -> our run group (difference rows)
    differences = entry.get("differences") or {}
    for row in target.rows:
        line = {("", "ours: run"): run_label(cfg, row.run)}
        for col, sets, note in columns:
            if row.run is None:
                cell = Cell(note="")
            elif col.task == "epochs":
                cell = results.epoch_cell(row.run, target.reference_run)
            else:
                cell = results.cell(row.run, col, sets)
            cells.setdefault(row.paper_key, {})[col.label] = cell
            pv = paper_value(entry, row.paper_key, col.paper_key)
            digits = TASKS[col.task].digits if col.task in TASKS else 2
            line[(col.label, OURS)] = cell.fmt(digits) if row.run else ""
            line[(col.label, PAPER)] = _fmt_paper(pv)
            long.append({"target": target.id, "row": row.label, "row_kind": "run", "column": col.label,
                         "metric": col.metric if col.task != "epochs" else "epochs", "stand_in": bool(note),
                         "run": row.run or "", "datasets": "+".join(sets), "ours_mean": cell.mean,
                         "ours_std": cell.std, "ours_seeds": cell.n, "ours_text": cell.fmt(digits) if row.run else "",
                         "paper": pv if pv is not None else ""})
        data.append(line)
        labels.append(row.label)
        # the paper's "+/-" row under this row (Tables V-VIII: ProtoCLIP minus CLIP), ours beside it
        for diff_label, diff in differences.items():
            if diff.get("minuend") == row.paper_key:
                line, recs = difference_row(target, columns, cells, diff_label, diff, runs, cfg, engine)
                data.append(line)
                labels.append(diff_label)
                long += recs
    table = pd.DataFrame(data, index=pd.Index(labels, name=target.id))
    table.columns = pd.MultiIndex.from_tuples(table.columns)
    cap = [f"{target.id.replace('_', ' ')} (paper: {target.caption})"]
    if entry:
        cap.append(f"Paper numbers: ProtoCLIP {entry.get('cite', '')}, {entry.get('where', '')}.")
    else:
        cap.append("The paper prints no numbers for this target.")
    cap.append(f"Ours: config {cfg.source}, each row's run named in 'ours: run' (method, model, training data, "
               "epochs, seeds); mean ± sample std over seeds where a row has several.")
    if mappings:
        cap.append("Column mapping (paper set -> set used here): " + "; ".join(mappings) + ".")
    if differences and engine is not None:
        cap.append(f"Difference rows: ours = the difference of our means with its {cfg.claims.confidence:.0%} "
                   "interval in brackets (seeds with a small-sample t correction, test examples bootstrapped and "
                   "paired; results/tables/claims.md); "
                   "without brackets: no per-example results to resample.")
    for task, levels in chance.items():
        if levels:
            cap.append(f"{TASKS[task].title} chance level: "
                       + ", ".join(f"{d} {c:.1f}%" for d, c in sorted(levels.items())) + ".")
    return table, " ".join(cap), long


def difference_row(target: TargetConfig, columns: list, cells: dict[str, dict[str, Cell]], label: str,
                   diff: dict, runs: dict[str, str | None] | None = None, cfg: ReportProject | None = None, engine=None
                   ) -> tuple[dict, list[dict]]:
    """(table line, long records) of a difference row: ours = minuend mean - subtrahend mean (same columns, same
    data sets), signed as the paper prints, with its interval when ``engine`` can resample it (``runs``: paper
    row key -> our run group); paper = its printed difference (``paper_numbers.yaml``)."""
    a, b = cells.get(diff["minuend"], {}), cells.get(diff["subtrahend"], {})
    line = {("", "ours: run"): f"difference of our means: {diff['minuend']} - {diff['subtrahend']}"}
    recs = []
    for col, sets, note in columns:
        pv = (diff.get("values") or {}).get(col.paper_key)
        ca, cb = a.get(col.label), b.get(col.label)
        ours = lo = hi = None
        if col.task != "epochs" and ca is not None and cb is not None and ca.mean is not None and cb.mean is not None:
            ours = ca.mean - cb.mean
        digits = 3 if col.metric in ("ari", "ami") else 2
        text = "-" if ours is None else signed(ours, digits)
        if ours is not None and engine is not None:
            group_a, group_b = (cfg.run_group((runs or {}).get(diff[k]) or "") for k in ("minuend", "subtrahend"))
            try:
                if not group_a or not group_b:
                    raise NotRun("no run group")
                iv = engine.column_interval(group_a, group_b, col, sets, ours)
                lo, hi, text = iv.lo, iv.hi, with_interval(ours, iv.lo, iv.hi, digits)
            except NotRun:
                pass  # the point without brackets (the caption says why)
        line[(col.label, OURS)] = "" if col.task == "epochs" else text
        line[(col.label, PAPER)] = "" if col.task == "epochs" else _fmt_paper(pv)
        if col.task != "epochs":
            recs.append({"target": target.id, "row": label, "row_kind": "difference", "column": col.label,
                         "metric": col.metric, "stand_in": bool(note), "run": "", "datasets": "+".join(sets),
                         "ours_mean": ours, "ours_std": None, "ours_seeds": 0,
                         "ours_text": line[(col.label, OURS)], "paper": pv if pv is not None else "",
                         "ours_ci_low": lo, "ours_ci_high": hi})
    return line, recs


def _markdown(table: pd.DataFrame) -> str:
    flat = table.copy()
    flat.columns = [a if not b or b == "ours: run" else f"{a} ({b})" for a, b in table.columns]
    flat.columns = ["ours: run" if c == "" else c for c in flat.columns]
    # disable_numparse: tabulate would re-parse "41.30" as a number and print 41.3 (the paper printed 41.30)
    return flat.reset_index().to_markdown(index=False, disable_numparse=True)


def write_table(cfg: ReportProject, results: Results, target: TargetConfig, engine=None) -> tuple[str, str, list[dict]]:
    """Write ``<id>.{csv,md,tex,html}``; returns (markdown, caption, long records).

    Every paper column becomes a column group of two: ``ours`` (mean ± std over the row's seeds, or "(1 seed)")
    and ``paper`` (transcribed, ``paper_numbers.yaml``, printed exactly as the paper prints it in every format).
    Where the paper prints a "+/-" row (Tables V-VIII: ProtoCLIP minus CLIP) the table has it too, ours (difference
    of our means, with its 95 % interval in brackets: ``+1.80 [-0.40, +3.90]``, protoclip.claims.intervals) beside
    the paper's (:func:`difference_row`). A leading ``ours: run`` column names the run group, its epochs and seeds
    (:func:`run_label`). The caption states the paper's caption and source, our config and training data, each
    column's mapping to offline stand-ins ("ImageNet zero-shot: imagenet -> fashion_mnist"), and chance level for
    zero-shot sets.
    """
    table, caption, long = build_table(cfg, results, target, engine)
    csv, md, tex, htm = Layout.from_config(cfg).target_files(target.id, target.kind)
    csv.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(csv) as tmp:
        table.to_csv(tmp)
    body = _markdown(table)
    write_text(md, f"**{target.id}.** {caption}\n\n{body}\n")
    with atomic_path(tex) as tmp:
        table.to_latex(tmp, caption=caption, label=f"tab:{target.id}", multicolumn=True, escape=True)
    write_text(htm, f"<p><b>{html.escape(target.id)}.</b> {html.escape(caption)}</p>\n"
               + table.to_html(classes="paper-table", border=1, na_rep="-", index_names=False) + "\n")
    return body, caption, long


__all__ = ["build_table", "write_table", "run_label"]
