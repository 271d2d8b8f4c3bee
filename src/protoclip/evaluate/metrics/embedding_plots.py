"""t-SNE plot of image representations coloured by class (ProtoCLIP Fig. 8: CLIP vs ProtoCLIP on STL-10).

    tsne_plot(features, labels, classnames, "results/figures/tsne_stl10.png")   # -> {"n_points": 5000, ...}
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from protoclip.files.atomic import atomic_path
from protoclip.evaluate.metrics._inputs import ArrayLike, features_np, l2_normalize_np, labels_np

log = logging.getLogger(__name__)


def tsne_embed(x: np.ndarray, seed: int = 0, perplexity: float = 30.0) -> tuple[np.ndarray, float]:
    """2-D t-SNE coordinates and final KL divergence; perplexity is capped below N/3 for tiny inputs."""
    from sklearn.manifold import TSNE  # heavy: sklearn, only when a t-SNE runs

    perp = float(min(perplexity, max(1.0, (x.shape[0] - 1) / 3.0)))
    tsne = TSNE(n_components=2, init="pca", random_state=seed, perplexity=perp)
    xy = tsne.fit_transform(x)
    return xy, float(tsne.kl_divergence_)


def tsne_plot(
    features: ArrayLike,
    labels: ArrayLike,
    classnames: Sequence[str] | None,
    out_png: str | Path,
    seed: int = 0,
    max_points: int = 5000,
    normalize: bool = True,
    perplexity: float = 30.0,
    title: str | None = None,
    legend_max: int = 20,
) -> dict[str, float]:
    """Write a t-SNE scatter plot to ``out_png``; returns {"n_points", "n_classes", "kl_divergence"}.

    scikit-learn ``TSNE`` (2-D, PCA initialisation, fixed ``random_state``: :func:`tsne_embed`) on the
    L2-normalised features (``normalize``: the representation the paper's other metrics use; the paper does not
    say), at most ``max_points`` points (a seeded random subset). Drawn with matplotlib's Agg backend and written
    atomically (``protoclip.files.atomic.atomic_path``). A legend is drawn for up to ``legend_max`` classes; beyond
    that it would cover the plot, so it is left out."""
    import matplotlib  # heavy: matplotlib, only when a figure is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy: matplotlib, only when a figure is drawn

    x = features_np(features, "features")
    y = labels_np(labels, "labels", x.shape[0])
    if x.shape[0] < 3:
        raise ValueError(f"t-SNE needs at least 3 points, got {x.shape[0]}")
    n_cls = int(y.max()) + 1
    if classnames is not None and len(classnames) < n_cls:
        raise ValueError(f"labels go up to {n_cls - 1} but only {len(classnames)} classnames were given")
    if x.shape[0] > max_points:
        idx = np.sort(np.random.default_rng(seed).choice(x.shape[0], max_points, replace=False))
        x, y = x[idx], y[idx]
    if normalize:
        x = l2_normalize_np(x)
    xy, kl = tsne_embed(x, seed=seed, perplexity=perplexity)

    present = np.unique(y)
    cmap = plt.get_cmap("tab10" if len(present) <= 10 else "tab20" if len(present) <= 20 else "turbo")
    fig, ax = plt.subplots(figsize=(7, 6), dpi=120)
    for i, c in enumerate(present):
        m = y == c
        colour = cmap(i % cmap.N) if len(present) <= 20 else cmap(i / max(1, len(present) - 1))
        name = classnames[c] if classnames is not None else str(c)
        ax.scatter(xy[m, 0], xy[m, 1], s=10 if len(y) <= 2000 else 3, color=colour, label=name, alpha=0.8, linewidths=0)
    if len(present) <= legend_max:
        ax.legend(markerscale=3, fontsize=7, loc="best", frameon=False)
    ax.set_xticks([])
    ax.set_yticks([])
    if title:
        ax.set_title(title)
    fig.tight_layout()
    with atomic_path(out_png) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    log.info("t-SNE of %d points (%d classes) -> %s", len(y), len(present), out_png)
    return {"n_points": int(len(y)), "n_classes": int(len(present)), "kl_divergence": kl}
