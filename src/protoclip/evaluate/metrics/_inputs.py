"""Input checking shared by the metric functions: numpy / torch in, validated arrays out.

Every public metric accepts features as a numpy array or a torch tensor and labels as any integer
array-like. These helpers turn them into one canonical form and fail early with a message that names
the argument (``"train_x must be 2-D [N, d], got shape (5,)"``) instead of an obscure broadcasting
error deep inside sklearn or torch.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

ArrayLike = Any  # np.ndarray | torch.Tensor | list


# A row whose L2 norm is at most this cannot be normalised (F.normalize's and l2_normalize_np's eps):
# it would silently become the zero vector, cosine 0 to everything, and still be counted in the metric.
ZERO_NORM = 1e-12


def _check_features(shape: tuple[int, ...], finite: bool, name: str) -> None:
    """The checks every feature input gets, numpy or torch: 2-D, non-empty, finite."""
    if len(shape) != 2:
        raise ValueError(f"{name} must be 2-D [N, d], got shape {shape}")
    if shape[0] == 0 or shape[1] == 0:
        raise ValueError(f"{name} is empty (shape {shape})")
    if not finite:
        raise ValueError(f"{name} contains NaN or inf")


def _check_nonzero(norms: np.ndarray, name: str) -> None:
    zero = np.flatnonzero(norms <= ZERO_NORM)
    if zero.size:
        raise ValueError(f"{name} has {zero.size} all-zero rows (first: {zero[:5].tolist()}); cosine-similarity "
                         "metrics cannot normalise them (a dead encoder or a broken checkpoint?)")


def features_np(x: ArrayLike, name: str, dtype: type = np.float32, nonzero: bool = False) -> np.ndarray:
    """A finite 2-D float array [N, d] with N >= 1; with ``nonzero``, no row of (near-)zero norm."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    arr = np.asarray(x, dtype=dtype)
    _check_features(tuple(arr.shape), bool(np.isfinite(arr).all()), name)
    if nonzero:
        _check_nonzero(np.linalg.norm(arr.astype(np.float64), axis=1), name)
    return arr


def features_torch(x: ArrayLike, name: str, dtype: torch.dtype = torch.float32,
                   device: str | torch.device = "cpu", nonzero: bool = False) -> torch.Tensor:
    """Same checks as :func:`features_np`, returned as a torch tensor on ``device``."""
    if isinstance(x, torch.Tensor):
        t = x.detach().to(device=device, dtype=dtype)
        _check_features(tuple(t.shape), bool(torch.isfinite(t).all()), name)
        if nonzero:
            _check_nonzero(t.double().norm(dim=1).cpu().numpy(), name)
        return t
    np_dtype = np.float64 if dtype == torch.float64 else np.float32
    return torch.from_numpy(features_np(x, name, np_dtype, nonzero)).to(device=device, dtype=dtype)


def labels_np(y: ArrayLike, name: str, n: int | None = None) -> np.ndarray:
    """A 1-D int64 array of non-negative labels, of length ``n`` when given."""
    if isinstance(y, torch.Tensor):
        y = y.detach().cpu().numpy()
    arr = np.asarray(y)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D [N], got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        if not np.all(np.equal(np.mod(arr, 1), 0)):
            raise ValueError(f"{name} must hold integer class ids, got dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    if n is not None and arr.shape[0] != n:
        raise ValueError(f"{name} has {arr.shape[0]} entries but the features have {n} rows")
    if arr.size and arr.min() < 0:
        raise ValueError(f"{name} must be non-negative class ids, got min {arr.min()}")
    return arr


def same_dim(a: np.ndarray | torch.Tensor, b: np.ndarray | torch.Tensor, name_a: str, name_b: str) -> None:
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"{name_a} has dimension {a.shape[1]} but {name_b} has {b.shape[1]}")


def l2_normalize_np(x: np.ndarray) -> np.ndarray:
    """Row-wise L2 normalisation; an all-zero row stays zero instead of becoming NaN."""
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


def probe_tensors(
    train_x: ArrayLike, train_y: ArrayLike, test_x: ArrayLike, test_y: ArrayLike,
    device: str | torch.device = "cpu", num_classes: int | None = None, nonzero: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Validated train/test features and labels of a probe, on ``device``, and the number of classes
    (``num_classes``, or 1 + the largest label seen in train or test); ``nonzero`` as in features_np."""
    xtr = features_torch(train_x, "train_x", device=device, nonzero=nonzero)
    xte = features_torch(test_x, "test_x", device=device, nonzero=nonzero)
    same_dim(xtr, xte, "train_x", "test_x")
    ytr = torch.from_numpy(labels_np(train_y, "train_y", xtr.shape[0])).to(device)
    yte = torch.from_numpy(labels_np(test_y, "test_y", xte.shape[0])).to(device)
    seen = int(max(ytr.max(), yte.max())) + 1
    num_classes = seen if num_classes is None else num_classes
    if num_classes < seen:
        raise ValueError(f"num_classes={num_classes} but labels go up to {seen - 1}")
    return xtr, ytr, xte, yte, num_classes
