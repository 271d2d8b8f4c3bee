"""Linear probing on frozen image features (ProtoCLIP Sec. IV-C2, following CLIP and MoCo/SwAV/SLIP), on the
un-normalised image representations (the paper: "before normalization"): scikit-learn's L-BFGS with CLIP's C search
(:func:`linear_probe`) for small sets, an SGD-trained linear layer (:func:`sgd_linear_probe`) for ImageNet-size sets.

    linear_probe(train_x, train_y, test_x, test_y)   # -> {"top1": 83.1, "C": 0.316, "val_top1": 82.5}
    m, hits = linear_probe(..., per_example=True)   # hits["top1"]: bool per test image, the same numbers
"""
from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
from threadpoolctl import threadpool_limits
import torch
import torch.nn.functional as F
from tqdm import tqdm

from protoclip.evaluate.metrics._inputs import ArrayLike, features_np, labels_np, probe_tensors, same_dim

if TYPE_CHECKING:  # scikit-learn is imported where a probe runs: an evaluation without one never loads it
    from sklearn.linear_model import LogisticRegression

log = logging.getLogger(__name__)

CLIP_START_EXPONENTS = (-6, -4, -2, 0, 2, 4, 6)  # CLIP's initial lambda (here: C) grid, log10
SGD_ABOVE = 100_000  # linear_eval uses the SGD probe above this many training samples


Init = tuple[np.ndarray, np.ndarray]  # (coef_, intercept_) of an earlier fit


def _fit_logreg(x: np.ndarray, y: np.ndarray, C: float, max_iter: int, seed: int,
                init: Init | None = None) -> LogisticRegression:
    # lbfgs, multinomial; with ``init`` L-BFGS starts from that solution (sklearn's warm_start reads coef_)
    from sklearn.exceptions import ConvergenceWarning  # heavy: sklearn, only when a probe runs
    from sklearn.linear_model import LogisticRegression  # heavy: sklearn, only when a probe runs

    clf = LogisticRegression(C=C, max_iter=max_iter, random_state=seed, warm_start=init is not None)
    if init is not None:
        clf.coef_, clf.intercept_ = init[0].copy(), init[1].copy()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        clf.fit(x, y)
    if any(issubclass(w.category, ConvergenceWarning) for w in caught):
        log.debug("L-BFGS did not converge in %d iterations at C=%g", max_iter, C)
    return clf


def split_validation(y: np.ndarray, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices (fit, val) of a held-out split; stratified when every class has >= 2 samples."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    idx = np.arange(len(y))
    _, counts = np.unique(y, return_counts=True)
    n_val = max(1, int(round(val_fraction * len(y))))
    stratify = y if counts.min() >= 2 and n_val >= len(counts) and len(y) - n_val >= len(counts) else None
    from sklearn.model_selection import train_test_split  # heavy: sklearn, only when a probe runs

    fit_idx, val_idx = train_test_split(idx, test_size=n_val, random_state=seed, stratify=stratify)
    return np.sort(fit_idx), np.sort(val_idx)


def search_C(
    score: Callable[[float], float],
    C_grid: Sequence[float] | None = None,
    steps_per_decade: int = 4,
) -> tuple[float, dict[float, float]]:
    """Maximise ``score(C)`` over log-spaced C: CLIP's coarse grid then interval halving around the best.

    CLIP sweeps lambda over 1e-6..1e6 with a "parametric binary search" that starts from [1e-6, 1e-4, ..., 1e6]
    and halves the interval around the best value until it reaches 8 steps per decade (~15 fits). We keep that
    algorithm but stop at ``steps_per_decade=4`` by default (one round fewer: 2 fewer fits, ~13 in total);
    ``evaluate.linear_steps_per_decade`` sets it (the paper config: CLIP's 8).

    Returns (best C, {C: score} for every evaluated C). Ties go to the smaller C (stronger regularisation). With
    ``C_grid`` only that grid is evaluated (no refinement).
    """
    if C_grid is not None:
        if len(C_grid) == 0 or min(C_grid) <= 0:
            raise ValueError(f"C_grid must be non-empty and positive, got {list(C_grid)}")
        exps = [math.log10(c) for c in C_grid]
    else:
        if steps_per_decade < 1:
            raise ValueError(f"steps_per_decade must be >= 1, got {steps_per_decade}")
        exps = [float(e) for e in CLIP_START_EXPONENTS]
    by_exp = {e: score(10.0 ** e) for e in exps}

    def best_exp() -> float:
        top = max(by_exp.values())
        return min(e for e, v in by_exp.items() if v == top)

    if C_grid is None:
        lo, hi = min(CLIP_START_EXPONENTS), max(CLIP_START_EXPONENTS)
        step = float(CLIP_START_EXPONENTS[1] - CLIP_START_EXPONENTS[0])  # 2 decades
        while step > 1.0 / steps_per_decade + 1e-9:
            step /= 2.0
            centre = best_exp()
            for e in (round(centre - step, 9), round(centre + step, 9)):
                if lo <= e <= hi and e not in by_exp:
                    by_exp[e] = score(10.0 ** e)
    return 10.0 ** best_exp(), {10.0 ** e: v for e, v in sorted(by_exp.items())}


def linear_probe(
    train_x: ArrayLike,
    train_y: ArrayLike,
    test_x: ArrayLike,
    test_y: ArrayLike,
    seed: int = 0,
    max_iter: int = 1000,
    C_grid: Sequence[float] | None = None,
    val_fraction: float = 0.2,
    steps_per_decade: int = 4,
    warm_start: bool = True,
    threads: int | None = 1,
    center: bool = True,
    per_example: bool = False,
) -> dict[str, float] | tuple[dict[str, float], dict[str, np.ndarray]]:
    """scikit-learn's L-BFGS logistic regression (``max_iter=1000``, CLIP's); C picked on a validation split of
    train (:func:`search_C`), then refit on all of train and scored once on test: top-1 in percent.

    ``center``: fit on features minus the training mean. The intercept is not penalised (sklearn's L-BFGS), so
    ``W x + b = W (x - m) + (b + W m)`` is an exact reparametrisation: the objective, its optimum and the
    predictions at every C are CLIP's. What changes is the conditioning: the un-normalised z^I of the offline
    models share a large common component (mean norm ~25 against a per-dimension std ~0.8 on Fashion-MNIST);
    raw, L-BFGS stopped at ``max_iter`` unconverged at every C >= 0.01 (1 s per fit), centred the same fits
    converge in 15-900 iterations. ``warm_start``: each fit starts from the solution at the nearest C already
    fitted (the refit from the search's fit at the chosen C); the objective is strictly convex, so a converged fit
    is the same from any start, only the iteration count changes (fits that hit ``max_iter`` at large C end nearer
    the optimum). ``threads``: BLAS/OpenMP threads of the fits (None: the libraries' default, all cores); 1 by
    default, as on a shared 2-core machine sklearn's OpenMP loss and OpenBLAS spin-wait for descheduled threads
    (one fit on 8k x 128: 50 s with 2 threads, 2 s with 1).
    ``bench/bench_linear_probe.py`` compares these defaults with the cold-start, raw, default-threads reference.
    Returns ``{"top1": test accuracy of the model refit on all of train, "C": chosen C,
    "val_top1": validation accuracy at that C}``; with ``per_example`` also ``{"top1": bool[n]}``, each test
    image's hit (``top1`` is ``100 * hits.sum() / n`` of it).
    """
    xtr, xte = features_np(train_x, "train_x"), features_np(test_x, "test_x")
    same_dim(xtr, xte, "train_x", "test_x")
    ytr = labels_np(train_y, "train_y", xtr.shape[0])
    yte = labels_np(test_y, "test_y", xte.shape[0])
    if len(np.unique(ytr)) < 2:
        raise ValueError("train_y has a single class; a linear probe needs at least two")
    if center:  # exact reparametrisation (docstring): same optimum, better conditioned
        shift = xtr.mean(axis=0, dtype=np.float64).astype(xtr.dtype)
        xtr, xte = xtr - shift, xte - shift
    fit_idx, val_idx = split_validation(ytr, val_fraction, seed)
    pbar = tqdm(desc="linear probe C search", leave=False, disable=xtr.shape[0] < 5000)

    fits: dict[float, Init] = {}  # log10 C -> solution on the fit split
    xfit, yfit = xtr[fit_idx], ytr[fit_idx]
    fit_classes = np.unique(yfit)
    if len(fit_classes) < 2:  # sklearn would stop deep inside LogisticRegression.fit
        raise ValueError(f"linear probe: the fit split ({len(fit_idx)} of {len(ytr)} training samples after holding "
                         f"out val_fraction={val_fraction}) holds a single class ({int(fit_classes[0])}); "
                         "give the probe more training samples per class or a smaller val_fraction")

    def nearest(e: float, classes: np.ndarray) -> Init | None:
        """The solution at the fitted C closest in log space (ties: the smaller C), if its classes match
        (a rare class can be missing from the fit split: the refit on all of train then starts cold)."""
        if not warm_start or not fits or not np.array_equal(classes, fit_classes):
            return None
        return fits[min(fits, key=lambda k: (abs(k - e), k))]

    def val_accuracy(C: float) -> float:
        e = math.log10(C)
        clf = _fit_logreg(xfit, yfit, C, max_iter, seed, init=nearest(e, fit_classes))
        fits[e] = (clf.coef_, clf.intercept_)
        pbar.update(1)
        return float((clf.predict(xtr[val_idx]) == ytr[val_idx]).mean())


    with threadpool_limits(threads):
        best_C, tried = search_C(val_accuracy, C_grid, steps_per_decade)
        pbar.close()
        log.info("linear probe: best C=%.3g (val acc %.4f) after %d fits", best_C, tried[best_C], len(tried))
        clf = _fit_logreg(xtr, ytr, best_C, max_iter, seed, init=nearest(math.log10(best_C), np.unique(ytr)))
    hits = clf.predict(xte) == yte
    out = {"top1": 100.0 * float(hits.mean()), "C": float(best_C), "val_top1": 100.0 * tried[best_C]}
    return (out, {"top1": hits}) if per_example else out


def sgd_linear_probe(
    train_x: ArrayLike,
    train_y: ArrayLike,
    test_x: ArrayLike,
    test_y: ArrayLike,
    seed: int = 0,
    epochs: int = 100,
    batch_size: int = 256,
    lr: float = 0.3,
    weight_decay: float = 1e-6,
    momentum: float = 0.9,
    num_classes: int | None = None,
    device: str | torch.device = "cpu",
    show_progress: bool = True,
    per_example: bool = False,
) -> dict[str, float] | tuple[dict[str, float], dict[str, np.ndarray]]:
    """Torch linear classifier with SGD + cosine lr (per epoch, as SwAV's eval_linear); test top-1/top-5 in %.

    The defaults are the paper's numbers (100 epochs, batch 256, lr 0.3, weight decay 1e-6, momentum 0.9, cosine).
    The layer is initialised as in SwAV / MoCo linear evaluation (weights N(0, 0.01), bias 0).
    ``per_example``: also each test image's hits ``{"top1": bool[n], "top5": bool[n]}``.
    """
    xtr, ytr, xte, yte, num_classes = probe_tensors(train_x, train_y, test_x, test_y, device, num_classes)
    gen = torch.Generator().manual_seed(seed)
    layer = torch.nn.Linear(xtr.shape[1], num_classes).to(device)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(layer.weight.shape, generator=gen) * 0.01)
        layer.bias.zero_()
    opt = torch.optim.SGD(layer.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs, eta_min=0.0)
    loss = torch.tensor(float("nan"))
    for _ in tqdm(range(epochs), desc="SGD linear probe", leave=False, disable=not show_progress):
        perm = torch.randperm(xtr.shape[0], generator=gen).to(device)
        for s in range(0, xtr.shape[0], batch_size):
            b = perm[s:s + batch_size]
            loss = F.cross_entropy(layer(xtr[b]), ytr[b])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        sched.step()
    if not torch.isfinite(loss):
        raise FloatingPointError("SGD linear probe diverged (loss is not finite); check the feature scale")
    with torch.no_grad():
        pred = layer(xte).topk(min(5, num_classes), dim=1).indices
    hit = pred == yte[:, None]
    # accuracies as float64 means of the hits (exact to the last bit, and what the per-example arrays give)
    examples = {"top1": hit[:, 0].cpu().numpy()}
    if num_classes >= 5:
        examples["top5"] = hit.any(dim=1).cpu().numpy()
    out = {"top1": 100.0 * float(examples["top1"].mean()), "final_train_loss": float(loss.detach())}
    if "top5" in examples:
        out["top5"] = 100.0 * float(examples["top5"].mean())
    log.info("SGD linear probe (%d epochs): %s", epochs, out)
    return (out, examples) if per_example else out


def linear_eval(
    train_x: ArrayLike,
    train_y: ArrayLike,
    test_x: ArrayLike,
    test_y: ArrayLike,
    seed: int = 0,
    sgd_above: int = SGD_ABOVE,
    **kwargs,
) -> dict[str, float]:
    """:func:`linear_probe` for up to ``sgd_above`` training samples, else :func:`sgd_linear_probe` (the paper uses
    L-BFGS for CIFAR / STL and SGD for ImageNet; our threshold is 100k training samples).

    ``kwargs`` go to the chosen function. The result has ``C`` for L-BFGS and ``final_train_loss``
    for SGD, so the caller can tell which protocol ran.
    """
    n = len(train_x)
    if n > sgd_above:
        return sgd_linear_probe(train_x, train_y, test_x, test_y, seed=seed, **kwargs)
    return linear_probe(train_x, train_y, test_x, test_y, seed=seed, **kwargs)
