"""Temperature-study figure (clip-temperature-multi-class-tokens.txt Sec. 4, Table 7; methods-spec 2.5).

From each run's ``train_log.jsonl`` step records (written by the trainer for every CLIP-term method:
``clip_scale`` = the logit scale s = 1/tau after the step's forward, ``equilibrium`` = mean(s_ii - E_p s_ij),
= -dL/ds, and ``grad_norm``) draws three panels against the step: the learned scale (log axis), the
equilibrium statistic and the gradient norm. Runs without ``clip_scale`` (e.g. nCLIP) are left out.

    from protoclip.report.temperature import plot_temperature
    plot_temperature({"temp_sphere_init14": layout.train_log("temp_sphere_init14"), ...},
                     layout.figures / "temperature.png")      # -> True if anything was drawn
"""
from __future__ import annotations

from pathlib import Path

from protoclip.atomic import atomic_path
from protoclip.records import read_train_log

PANELS = (("clip_scale", "logit scale s = 1/tau", "log"), ("equilibrium", "mean(s_ii - E_p s_ij)", "linear"),
          ("grad_norm", "gradient norm", "log"))


def temperature_curves(train_logs: dict[str, str | Path]) -> dict[str, dict[str, list[float]]]:
    """run -> {"step": [...], "clip_scale": [...], "equilibrium": [...], "grad_norm": [...]} (step lines only)."""
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


def plot_temperature(train_logs: dict[str, str | Path], out_png: str | Path) -> bool:
    """Scale / equilibrium / gradient-norm trajectories of ``train_logs`` (run -> path) to ``out_png``
    (matplotlib Agg, written atomically). False, and no file, when no run logged a CLIP scale."""
    curves = temperature_curves(train_logs)
    if not curves:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PANELS), figsize=(4.2 * len(PANELS), 3.6))
    for ax, (key, label, scale) in zip(axes, PANELS):
        for run, c in curves.items():
            ax.plot(c["step"], c[key], label=run)
        ax.set_xlabel("step")
        ax.set_ylabel(label)
        ax.set_yscale(scale)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    Path(out_png).parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out_png) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)
    return True
