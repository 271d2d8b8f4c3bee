"""Weighted k-NN classification on frozen features (DINO protocol; ProtoCLIP Sec. IV-C3, k = 20): a port of
``knn_classifier`` from facebookresearch/dino ``eval_knn.py``, in torch because scikit-learn's
``KNeighborsClassifier`` has no exp(sim/T) weighting (DINO's is the protocol).

    knn_classifier(train_x, train_y, test_x, test_y, k=20, T=0.07)   # -> {"top1": .., "top5": ..} (percent)
"""
from __future__ import annotations

import logging

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from protoclip.evaluate.metrics._inputs import ArrayLike, probe_tensors

log = logging.getLogger(__name__)

MAX_SIM_ELEMENTS = 1 << 27  # cap on one [chunk, N_train] similarity block (512 MB in float32)


def knn_votes(
    train_x: torch.Tensor, train_y: torch.Tensor, test_x: torch.Tensor, k: int, T: float, num_classes: int
) -> torch.Tensor:
    """Class scores ``[n_test, num_classes]``: sum of exp(cos/T) over the k nearest training rows.

    Inputs must already be L2-normalised; this is DINO's inner loop body for one chunk, with one change
    for numerical stability: each row's weights are ``exp((cos - max_cos) / T)``, i.e. DINO's weights
    divided by the row constant ``exp(max_cos / T)``. The class ranking of a row is unchanged, but
    nothing overflows: DINO's ``exp(cos / T)`` is inf in float32 once T < 1/88.7 (e.g. T = 0.01), and
    all-inf votes rank classes arbitrarily.
    """
    sim = test_x @ train_x.T  # [b, N_train] cosine similarities
    dist, idx = sim.topk(k, dim=1, largest=True, sorted=True)
    neighbour_labels = train_y[idx]  # [b, k]
    weights = ((dist - dist[:, :1]) / T).exp()  # dist is sorted: column 0 is the row max; weights in (0, 1]
    votes = torch.zeros(test_x.shape[0], num_classes, dtype=weights.dtype, device=weights.device)
    return votes.scatter_add_(1, neighbour_labels, weights)


@torch.no_grad()
def knn_classifier(
    train_x: ArrayLike,
    train_y: ArrayLike,
    test_x: ArrayLike,
    test_y: ArrayLike,
    k: int = 20,
    T: float = 0.07,
    num_classes: int | None = None,
    chunk_size: int = 1024,
    device: str | torch.device = "cpu",
    per_example: bool = False,
) -> dict[str, float] | tuple[dict[str, float], dict[str, np.ndarray]]:
    """DINO weighted k-NN top-1 / top-5 accuracy in percent (top5 only when num_classes >= 5).

    Features are L2-normalised; each test sample takes its k most cosine-similar training samples, every
    neighbour votes for its label with weight ``exp(cos / T)`` (relative to the row's best neighbour:
    :func:`knn_votes`), and classes are ranked by total vote. Test rows are processed in chunks so the
    [chunk, N_train] similarity matrix stays small.

    ``k`` is capped at the number of training samples. ``num_classes`` defaults to 1 + the largest
    label seen in train or test. ``per_example``: return ``(metrics, {"top1": bool[n], "top5": bool[n]})``,
    each test image's hit (the percentages are ``100 * hits.sum() / n`` of these).
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if T <= 0:
        raise ValueError(f"T must be > 0, got {T}")
    xtr, ytr, xte, yte, num_classes = probe_tensors(train_x, train_y, test_x, test_y, device, num_classes,
                                                     nonzero=True)
    xtr, xte = F.normalize(xtr, dim=1), F.normalize(xte, dim=1)
    k_eff = min(k, xtr.shape[0])
    if k_eff < k:
        log.warning("k=%d is larger than the %d training samples; using k=%d", k, xtr.shape[0], k_eff)
    # ImageNet: 1.28M train rows, so 1024 test rows at once would already be a 5 GB block
    chunk_size = max(1, min(chunk_size, MAX_SIM_ELEMENTS // xtr.shape[0]))
    top1, top5 = [], []
    for start in tqdm(range(0, xte.shape[0], chunk_size), desc="kNN", leave=False,
                      disable=xte.shape[0] <= chunk_size):
        votes = knn_votes(xtr, ytr, xte[start:start + chunk_size], k_eff, T, num_classes)
        # DINO ranks classes by votes (sort descending); top-5 looks at min(5, k) ranked classes
        pred = votes.topk(min(5, num_classes), dim=1).indices
        hit = pred == yte[start:start + chunk_size, None]
        top1.append(hit[:, 0])
        top5.append(hit[:, : min(5, k_eff)].any(dim=1))
    n = xte.shape[0]
    examples = {"top1": torch.cat(top1).cpu().numpy()}
    if num_classes >= 5:
        examples["top5"] = torch.cat(top5).cpu().numpy()
    out = {key: 100.0 * int(h.sum()) / n for key, h in examples.items()}
    log.info("kNN (k=%d, T=%g) on %d test / %d train: %s", k_eff, T, n, xtr.shape[0], out)
    return (out, examples) if per_example else out
