"""PAUC's toy experiment [pauc-nemd.txt Sec. 3, Fig. 2]: PCL vs PAUC on 3-D Gaussian blobs embedded on the unit
circle, and the NEMD of each, per number of classes (the design: :func:`toy_nemd`).

    protoclip toy-nemd --config config/config.yaml    # -> results/toy/fig_pauc_toy.png, pauc_toy.csv, pauc_toy.md
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.datasets import make_blobs
import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from protoclip.files.atomic import atomic_path, clean_stale_temps_of, write_text
from protoclip.files.layout import Layout
from protoclip.evaluate.metrics import knn as knn_metric
from protoclip.evaluate.metrics import nemd as nemd_metric
from protoclip.losses.pauc import pauc_loss
from protoclip.losses.pcl import PCL_NEGATIVES, build_clusterings, capped_negatives, infonce, protonce
from protoclip.models.momentum import FeatureQueue, MomentumEncoder
from protoclip.prototypes.kmeans import load_faiss
from protoclip.toy.config import ToyConfig

log = logging.getLogger(__name__)

METHODS = ("pcl", "pauc")


def make_blobs3d(n_classes: int, cfg: ToyConfig) -> tuple[np.ndarray, np.ndarray]:
    """Isotropic 3-D Gaussian blobs (sklearn), divided by ``center_box`` (inputs of order 1 for the MLP; a fixed
    scale, so the jitter keeps its meaning) -> (x float32 [N, 3], y int64 [N])."""
    x, y = make_blobs(n_samples=n_classes * cfg.samples_per_class, centers=n_classes, n_features=3,
                      cluster_std=cfg.cluster_std, center_box=(-cfg.center_box, cfg.center_box),
                      random_state=cfg.seed)
    return (x / cfg.center_box).astype(np.float32), y.astype(np.int64)


class ToyEncoder(nn.Module):
    """MLP 3 -> hidden -> hidden -> 2, l2-normalised output (the unit circle)."""

    def __init__(self, hidden: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(3, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.net(x), dim=1)


def train_toy(x: np.ndarray, n_classes: int, method: str, cfg: ToyConfig) -> tuple[np.ndarray, list[dict]]:
    """Train one encoder with ``method`` ('pcl' | 'pauc') -> (embeddings [N, 2] of the clean points, epoch log).

    * PCL: momentum encoder + queue, InfoNCE for ``warmup_epochs``, then per epoch the E-step (k-means at
      K = {C, 2C} of the momentum features of the clean points, phi) and ProtoNCE with r = K_min / 2 negative
      prototypes [PCL Eq. 11, spec 4.7.5];
    * PAUC: the same plus alpha * align + beta * unif + gamma * corr on batch prototypes (spec 3.3).

    Views are ``x + N(0, (jitter * cluster_std)^2)`` (spec [rec]); the E-step uses the clean points (PCL's centre
    crop).
    """
    if method not in METHODS:
        raise ValueError(f"unknown toy method {method!r} (known: {', '.join(METHODS)})")
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    enc = ToyEncoder(cfg.hidden)
    key = MomentumEncoder(enc, cfg.momentum)
    queue = FeatureQueue(min(cfg.queue_size, len(x)), 2, seed=cfg.seed)
    opt = torch.optim.Adam(enc.parameters(), lr=cfg.lr)
    xt = torch.from_numpy(x)
    ks = [min(m * n_classes, len(x)) for m in cfg.kmeans_multipliers]
    r = capped_negatives(PCL_NEGATIVES, ks)  # spec 4.7.5: r = min(16000, K_min / 2)
    sigma = cfg.jitter * cfg.cluster_std / cfg.center_box  # jitter of the views, in the scaled input units
    history = []
    for epoch in range(cfg.epochs):
        clusterings = None
        if epoch >= cfg.warmup_epochs:  # E-step on the clean points through the momentum encoder
            feats = key(xt)
            clusterings = build_clusterings(feats, ks, cfg.tau, iters=cfg.kmeans_iters, nredo=cfg.kmeans_redo,
                                            seed=cfg.seed + 1000 * epoch, backend="auto")
        order = torch.randperm(len(x), generator=gen)
        sums: dict[str, float] = {}
        for s in range(0, len(x) - 1, cfg.batch_size):
            idx = order[s:s + cfg.batch_size]
            if len(idx) < 2:
                continue
            xb = xt[idx]
            x1 = xb + sigma * torch.randn(xb.shape, generator=gen)
            x2 = xb + sigma * torch.randn(xb.shape, generator=gen)
            q = enc(x1)
            key.update(enc)
            k = key(x2)
            terms = infonce(q, k, queue.keys(), cfg.tau)
            loss = terms["infonce"]
            if clusterings is not None:
                pn = protonce(q, idx, clusterings, r, gen)
                terms["protonce"] = pn["protonce"]
                loss = loss + pn["protonce"]
                if method == "pauc":
                    reg = pauc_loss(q, idx, clusterings, s=cfg.pauc_s, t=cfg.pauc_t, tau_c=cfg.pauc_tau_c)
                    terms.update(reg)
                    loss = (loss + cfg.pauc_alpha * reg["pauc_align"] + cfg.pauc_beta * reg["pauc_unif"]
                            + cfg.pauc_gamma * reg["pauc_corr"])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            queue.enqueue(k)
            for name, v in {**terms, "loss": loss}.items():
                sums[name] = sums.get(name, 0.0) + float(v.detach())
            sums["_n"] = sums.get("_n", 0.0) + 1
        n = sums.pop("_n", 1.0)
        history.append({"epoch": epoch, **{k: v / n for k, v in sums.items()}})
    with torch.no_grad():
        return enc(xt).numpy(), history


def evaluate_toy(z: np.ndarray, y: np.ndarray, cfg: ToyConfig) -> dict[str, float]:
    """NEMD over GT blobs with the evaluation suite's function, plus uniformity, spread and kNN accuracy.

    NEMD v1 of the online embeddings over the GT blobs (:func:`protoclip.evaluate.metrics.nemd.nemd`), with
    Wang-Isola uniformity and mean intra-class spread (spec 3.4.10: NEMD alone cannot tell collapse from coverage)
    and kNN accuracy on a held-out half of every blob.
    """
    out = nemd_metric.nemd(z, y, n_max=cfg.nemd_n_max, seed=cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    test = rng.random(len(y)) < 0.5
    acc = knn_metric.knn_classifier(z[~test], y[~test], z[test], y[test], k=20, T=0.07)
    return {"nemd": out["nemd"], "nemd_half": out["nemd_half"], "n_pairs": out["n_pairs"],
            "uniformity": nemd_metric.uniformity(z, seed=cfg.seed),
            "intra_class_spread": nemd_metric.intra_class_spread(z, y), "knn_top1": acc["top1"]}


def plot(embeddings: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]], table: pd.DataFrame, cfg: ToyConfig,
         out_png: Path) -> None:
    """Rows PCL / PAUC: embeddings on the unit circle per class count (colour = blob); last row: NEMD vs C."""
    import matplotlib  # heavy: matplotlib, only when a figure is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy: matplotlib, only when a figure is drawn

    cs = list(cfg.n_classes)
    fig = plt.figure(figsize=(2.4 * len(cs), 2.4 * 2 + 2.6))
    grid = fig.add_gridspec(3, len(cs), height_ratios=[1, 1, 1.1])
    rng = np.random.default_rng(cfg.seed)
    for row, method in enumerate(METHODS):
        for col, c in enumerate(cs):
            ax = fig.add_subplot(grid[row, col])
            z, y = embeddings[(method, c)]
            keep = np.concatenate([rng.permutation(np.flatnonzero(y == k))[:cfg.plot_points_per_class]
                                   for k in np.unique(y)])
            # classes at radius 1 +- small per-class offsets so that overlapping blobs stay visible
            rad = 1.0 + 0.25 * (y[keep] / max(1, c - 1) - 0.5)
            ax.scatter(z[keep, 0] * rad, z[keep, 1] * rad, c=y[keep], cmap="hsv", s=3, linewidths=0)
            ax.add_patch(plt.Circle((0, 0), 1.0, fill=False, lw=0.5, color="grey"))
            nemd_v = float(table[(table.method == method) & (table.n_classes == c)].nemd.iloc[0])
            ax.set_title(f"{method.upper()}, C={c}\nNEMD {nemd_v:.3f}", fontsize=8)
            ax.set_xlim(-1.3, 1.3)
            ax.set_ylim(-1.3, 1.3)
            ax.set_aspect("equal")
            ax.set_xticks([])
            ax.set_yticks([])
    ax = fig.add_subplot(grid[2, :])
    for method in METHODS:
        sub = table[table.method == method].sort_values("n_classes")
        ax.plot(sub.n_classes, sub.nemd, marker="o", label=method.upper())
    ax.set_xlabel("number of classes (blobs)")
    ax.set_ylabel("NEMD (GT blobs, chord, unit circle)")
    ax.set_xticks(cs)
    ax.legend()
    fig.suptitle("PAUC toy (pauc-nemd Fig. 2): embeddings on the unit circle (radius offset per class) and NEMD",
                 fontsize=9)
    fig.tight_layout()
    with atomic_path(out_png) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)


def markdown_table(table: pd.DataFrame) -> str:
    cols = ["n_classes", "method", "nemd", "uniformity", "intra_class_spread", "knn_top1", "seconds"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, row in table[cols].iterrows():
        cells = [f"{row[c]:.4f}" if isinstance(row[c], float) else str(row[c]) for c in cols]
        lines.append("| " + " | ".join(cells) + " |")
    return ("PAUC toy experiment (pauc-nemd Sec. 3, Fig. 2; our run, not the paper's numbers): NEMD v1 over the GT\n"
            "blobs of the 2-D unit-circle embeddings (lower = less prototype collapse), Wang-Isola uniformity (lower =\n"
            "more uniform), mean intra-class spread (0 = every blob collapsed), kNN top-1 (%).\n\n"
            + "\n".join(lines) + "\n")


def toy_nemd(tcfg: ToyConfig, layout: Layout) -> Path:
    """The ``toy-nemd`` experiment of section ``tcfg``: every class count x {PCL, PAUC}; writes the figure and the
    tables where ``layout`` names them (:func:`protoclip.toy.stage.run_toy_nemd` is the stage's entry).

    For every class count C in ``toy.n_classes`` (paper: 10..50): ``make_blobs`` in 3-D (spec 3.4 [rec]) scaled by
    1/center_box (:func:`make_blobs3d`); an MLP 3 -> 2 with l2-normalised output trained twice with the trainer's
    own loss modules (:func:`train_toy`); then :func:`evaluate_toy`. The outputs go to ``results/toy/``: the
    report's ``results/tables`` / ``figures`` are DVC outputs, which may not nest.
    """
    threads = torch.get_num_threads()
    # tensors of a few thousand x 64 floats: extra threads only add synchronisation; faiss's OpenMP likewise.
    # Restored afterwards (the stage may run inside a test process).
    torch.set_num_threads(1)
    try:
        return _run(tcfg, layout)
    finally:
        torch.set_num_threads(threads)


def _run(tcfg: ToyConfig, layout) -> Path:
    clean_stale_temps_of(list(layout.toy_files().values()))  # temp files of a killed run's writes
    try:
        load_faiss().omp_set_num_threads(1)
    except ImportError:
        pass
    rows, embeddings = [], {}
    for c in tqdm(tcfg.n_classes, desc="toy-nemd"):
        x, y = make_blobs3d(c, tcfg)
        for method in METHODS:
            t0 = time.perf_counter()
            z, hist = train_toy(x, c, method, tcfg)
            seconds = time.perf_counter() - t0
            metrics = evaluate_toy(z, y, tcfg)
            rows.append({"n_classes": c, "method": method, **metrics, "final_loss": hist[-1].get("loss", float("nan")),
                         "seconds": seconds})
            embeddings[(method, c)] = (z, y)
            log.info("toy C=%d %s: %s", c, method, metrics)
    table = pd.DataFrame(rows)
    paths = layout.toy_files()
    plot(embeddings, table, tcfg, paths["figure"])
    with atomic_path(paths["csv"]) as tmp:
        table.to_csv(tmp, index=False)
    write_text(paths["md"], markdown_table(table))
    return paths["figure"]


__all__ = ["make_blobs3d", "ToyEncoder", "train_toy", "evaluate_toy", "toy_nemd", "METHODS"]
