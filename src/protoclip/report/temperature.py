"""Temperature-study figure (clip-temperature-multi-class-tokens.txt Sec. 2, 4, App. D, H; methods-spec 2.5).

The learned CLIP scale and its equilibrium statistic over training, from the runs' train logs, beside what the
``temperature`` evaluation measured of the trained models (the paper's Fig. 1, Fig. 8 and Table 11).
"""
from __future__ import annotations

import math
from pathlib import Path

from protoclip.files.atomic import atomic_path
from protoclip.evaluate.tasks.temperature import TASK as TEMPERATURE
from protoclip.files.records import read_train_log
from protoclip.report.paper_targets import ReportProject

PANELS = (("clip_scale", "logit scale s = 1/tau", "log"), ("equilibrium", "mean(s_ii - E_p s_ij)", "linear"),
          ("grad_norm", "gradient norm", "log"))
HISTOGRAMS = (("pos_image_text", "positive image-text", "tab:green"), ("neg_image_text", "negative image-text", "tab:red"),
              ("neg_image_image", "negative image-image", "tab:gray"), ("neg_text_text", "negative text-text", "gold"))


def temperature_curves(train_logs: dict[str, str | Path]) -> dict[str, dict[str, list[float]]]:
    """run -> {"step": [...], "clip_scale": [...], "equilibrium": [...], "grad_norm": [...]} (step lines only).

    The trainer writes them in the step records of every CLIP-term method: ``clip_scale`` = the logit scale
    s = 1/tau after the step's forward, ``equilibrium`` = mean(s_ii - E_p s_ij), = -dL/ds, and ``grad_norm``.
    Runs without ``clip_scale`` (e.g. nCLIP) are left out."""
    out: dict[str, dict[str, list[float]]] = {}
    for run, path in train_logs.items():
        cols: dict[str, list[float]] = {"step": [], **{k: [] for k, _, _ in PANELS}}
        for rec in read_train_log(path, kind="step"):
            if "clip_scale" not in rec:
                continue
            cols["step"].append(rec["step"])
            for k, _, _ in PANELS:
                cols[k].append(float(rec.get(k, float("nan"))))
        if cols["step"]:
            out[run] = cols
    return out


def temperature_diagnostics(cfg: ReportProject, results, target) -> dict[str, dict]:
    """label -> the merged ``temperature`` metrics of the row's first run over the target's temperature columns
    (each column's set: the paper's where present, else the stand-in; Results.column_sets). Labels match
    the figure's curve labels ``"<row label> (<run>)"``; rows without results are left out."""
    out: dict[str, dict] = {}
    columns = [c for c in target.columns if c.task == TEMPERATURE.name]
    for row in target.rows:
        group = cfg.run_group(row.run) if row.run else []
        if not group:
            continue
        merged: dict = {}
        for col in columns:
            sets, _ = results.column_sets(target, col)
            for d in sets:
                m = results.metrics(group[0], TEMPERATURE.name, d)
                if m and "skipped" not in m:
                    merged.update({k: v for k, v in m.items() if k not in merged})
        if merged:
            out[f"{row.label} ({group[0]})"] = merged
    return out


def _ratio_panel(ax, diag: dict, by: str) -> None:
    """Fig. 1: mean ratio against the scale, log-log, for one run: per share (largest batch) or per batch size
    (no shuffling); the dashed line is the equilibrium (ratio 1)."""
    sweep = diag.get("sweep", [])
    b_max = max((r["batch_size"] for r in sweep), default=None)
    for r in sweep:
        if by == "shuffle" and r["batch_size"] == b_max:
            label = f"shuffle {100 * r['shuffle']:g}%"
        elif by == "batch_size" and r["shuffle"] == 0.0:
            label = f"B = {r['batch_size']}"
        else:
            continue
        ax.plot(diag["scales"], [math.exp(min(v, 700.0)) for v in r["log_mean_ratio"]], label=label)
    ax.axhline(1.0, ls="--", color="k", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("scale tau (Eq. 1's multiplier)")
    ax.set_ylabel("mean exp(tau s_ii) / N_i")
    ax.legend(fontsize=6)


def _equilibrium_panel(ax, diagnostics: dict[str, dict], curves: dict[str, dict[str, list[float]]]) -> None:
    """tau* (ratio 1, largest batch, no shuffling) per run beside the scale it learned (last logged step)."""
    labels = list(diagnostics)
    for i, label in enumerate(labels):
        tau = diagnostics[label].get("equilibrium_scale")
        if tau is not None:
            ax.plot(tau, i, "o", color="tab:blue", label="tau* (ratio 1)" if i == 0 else None)
        learned = curves.get(label, {}).get("clip_scale", [])
        if learned:
            ax.plot(learned[-1], i, "x", color="tab:orange", label="learned s (last step)" if i == 0 else None)
    ax.set_yticks(range(len(labels)), [lb.split(" (")[0] for lb in labels], fontsize=6)
    ax.set_xscale("log")
    ax.set_xlabel("scale")
    ax.legend(fontsize=6)


def _token_panel(ax, diagnostics: dict[str, dict]) -> bool:
    """Table 11: zero-shot top-1 against the number of tokens kept (mean +- std over subsets), per run."""
    drawn = False
    for label, diag in diagnostics.items():
        t = diag.get("token_subsets")
        if not t:
            continue
        ks = sorted(int(k) for k in t["sizes"]) + [t["tokens"]]
        means = [t["sizes"][str(k)]["mean"] for k in ks[:-1]] + [t["all"]]
        stds = [t["sizes"][str(k)]["std"] for k in ks[:-1]] + [0.0]
        ax.errorbar(ks, means, yerr=stds, marker="o", capsize=3, label=label.split(" (")[0])
        drawn = True
    ax.set_xscale("log", base=2)
    ax.set_xlabel("class tokens kept (of m)")
    ax.set_ylabel("zero-shot top-1 (%)")
    if drawn:
        ax.legend(fontsize=6)
    return drawn


def _histogram_panel(ax, label: str, h: dict) -> None:
    """Fig. 8: one run's positive / negative image-text, negative image-image and text-text similarities."""
    edges = h["edges"]
    centres = [(a + b) / 2 for a, b in zip(edges, edges[1:])]
    width = edges[1] - edges[0]
    for key, name, colour in HISTOGRAMS:
        counts = h[key]
        total = sum(counts) or 1
        ax.bar(centres, [c / total / width for c in counts], width=width, alpha=0.45, color=colour, label=name)
    ax.set_title(label, fontsize=7)
    ax.set_xlabel("similarity s = -d (no scale)")
    ax.set_ylabel("density")
    ax.legend(fontsize=5)


def plot_temperature(train_logs: dict[str, str | Path], out_png: str | Path,
                     diagnostics: dict[str, dict] | None = None) -> bool:
    """Trajectories of ``train_logs`` (label -> path) and the panels of ``diagnostics`` (label -> temperature
    metrics) to ``out_png`` (matplotlib Agg, written atomically). False, and no file, when no run logged a CLIP
    scale.

    First row: the learned scale (log axis), the equilibrium statistic and the gradient norm against the step.
    Further panels, from each run's ``temperature`` evaluation (protoclip.evaluate.metrics.temperature, on the
    target's ``task: temperature`` columns' sets): the Fig. 1 equilibrium ratio against the scale for the first run
    with results, one curve per shuffled share (largest batch) and per batch size (no shuffling); the equilibrium
    scale tau* (ratio 1) of every run beside its learned final scale; Table 11's token-subset zero-shot of the
    multi-token runs; and one Fig. 8 histogram panel per run.

        plot_temperature({"temp_sphere_init14": layout.train_log("temp_sphere_init14"), ...},
                         layout.figures / "temperature.png", diagnostics={"temp_sphere_init14": metrics, ...})
    """
    curves = temperature_curves(train_logs)
    if not curves:
        return False
    import matplotlib  # heavy: matplotlib, only when a figure is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy: matplotlib, only when a figure is drawn

    diagnostics = {k: v for k, v in (diagnostics or {}).items() if v}
    ref = next((d for d in diagnostics.values() if d.get("sweep")), None)
    extra: list = []  # panel drawers after the first row
    if ref is not None:
        extra += [lambda ax: _ratio_panel(ax, ref, "shuffle"), lambda ax: _ratio_panel(ax, ref, "batch_size"),
                  lambda ax: _equilibrium_panel(ax, diagnostics, curves)]
    if any(d.get("token_subsets") for d in diagnostics.values()):
        extra.append(lambda ax: _token_panel(ax, diagnostics))
    for label, d in diagnostics.items():
        if d.get("histograms"):
            extra.append(lambda ax, label=label, h=d["histograms"]: _histogram_panel(ax, label, h))
    ncols = len(PANELS)
    nrows = 1 + -(-len(extra) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.6 * nrows), squeeze=False)
    for ax, (key, label, scale) in zip(axes[0], PANELS):
        for run, c in curves.items():
            ax.plot(c["step"], c[key], label=run)
        ax.set_xlabel("step")
        ax.set_ylabel(label)
        ax.set_yscale(scale)
    axes[0][0].legend(fontsize=7)
    if ref is not None:
        axes[1][0].set_title(f"Fig. 1: {next(k for k, d in diagnostics.items() if d is ref)}", fontsize=7)
    flat = [ax for row in axes[1:] for ax in row]
    for ax, draw in zip(flat, extra):
        draw(ax)
    for ax in flat[len(extra):]:
        ax.axis("off")
    fig.tight_layout()
    Path(out_png).parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out_png) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)
    return True
