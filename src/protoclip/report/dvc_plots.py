"""DVC plots of the report: every run's training curve and each paper target's numbers, for ``dvc plots show`` and
``dvc plots diff`` (DVC's own way to compare revisions), beside the report's PNG figures (docs/dvc.md, "Plots and
metrics"): the data files ``protoclip report`` writes and the ``plots:`` entries of ``dvc.yaml`` that show them.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from protoclip.files.atomic import atomic_path
from protoclip.files.layout import Layout
from protoclip.report.paper_targets import ReportProject
from protoclip.report.summary_figures import summary_names

TRAIN_LOSS_PLOT = "training loss"  # plot id of the training curves in dvc.yaml


def write_plot_data(layout, runs: list[str], losses: pd.DataFrame, records: list[dict]) -> list[Path]:
    """Write (at ``layout``'s paths) the loss file of every run in ``runs`` (``losses``: run, step, loss; a run without a train log gets
    the header only, so DVC finds every declared file) and the per-table files (``records``: the report's target
    cells, ``ours_mean`` and ``paper`` numbers); returns the paths written. Both inside ``results/tables`` (an
    output of the report stage)::

        results/tables/plots/train_loss/<run>.csv   step, loss          every logged training step of the run
        results/tables/plots/<table id>.csv         cell, ours, paper   a paper table's cells ("row | column")

    DVC reads CSV / JSON / YAML data, not the runs' ``train_log.jsonl``, hence the per-run CSV copies of the step
    records."""
    out = []
    for run in runs:
        sub = losses[losses["run"] == run]
        path = layout.loss_curve(run)
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            sub[["step", "loss"]].to_csv(tmp, index=False)
        out.append(path)
    frame = pd.DataFrame(records, columns=["target", "row", "column", "ours_mean", "paper"])
    for target, sub in frame.groupby("target", sort=False):
        rows = pd.DataFrame({"cell": sub["row"] + " | " + sub["column"],
                             "ours": pd.to_numeric(sub["ours_mean"], errors="coerce"),
                             "paper": pd.to_numeric(sub["paper"], errors="coerce")})
        path = layout.target_plot_data(str(target))
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            rows.to_csv(tmp, index=False)
        out.append(path)
    return out


def dvc_plots(cfg: ReportProject) -> list[dict | str]:
    """The top-level ``plots:`` entries of dvc.yaml for ``cfg``'s runs and paper targets (paths as in dvc.yaml;
    ``protoclip dvc-yaml`` writes them from the same configured runs and targets as the stages): one ``linear``
    plot of every run's loss against its step (one series per file), per table target a ``bar_horizontal`` plot of
    our numbers and one of the paper's, and as image plots every figure target's PNG, the summary figures and the
    claims ledger's forest plot."""
    layout = Layout.from_config(cfg)
    runs = cfg.run_names()
    plots: list[dict] = []
    if runs:
        plots.append({TRAIN_LOSS_PLOT: {"template": "linear", "x": "step",
                                        "y": {str(layout.loss_curve(r)): "loss" for r in runs},
                                        "x_label": "training step", "y_label": "total loss"}})
    for t in cfg.paper_targets():
        if t.kind == "table":
            data = str(layout.target_plot_data(t.id))
            for field in ("ours", "paper"):
                plots.append({f"{t.id} ({field})": {"template": "bar_horizontal", "x": field, "y": {data: "cell"},
                                                    "title": f"{t.id}: {field}", "x_label": field, "y_label": ""}})
        else:
            plots.append(str(layout.target_files(t.id, t.kind)[0]))  # the figure's PNG: an image plot

    # ours against the paper, Table VI's differences, the training curves per target: image plots too
    plots += [str(layout.figures / f"{name}.png") for name in summary_names(cfg)]
    plots.append(str(layout.claims_files().png))  # the claims ledger's forest plot (protoclip.report.ledger_table)
    return plots


__all__ = ["TRAIN_LOSS_PLOT", "dvc_plots", "write_plot_data"]
