"""A fixed, documented subsample of a labelled set's splits (``EvalDatasetConfig.max_train`` / ``max_test``).

Our choice for the offline budget, not a paper protocol: the paper probes whole sets. The indices depend only on
(evaluate.seed, the set's name, the split, the split's labels / size, the max), never on the run or the model,
so every run is probed on the same images and runs stay comparable.
"""
from __future__ import annotations

import logging
import zlib
from dataclasses import replace
from typing import Any

import numpy as np

from protoclip.evaluate.datasets.sets import (ArraySplit, FileSplit, ImageSplit, LabelledSet, SubsetSplit,
                                              TorchvisionSplit, WdsSplit)

log = logging.getLogger(__name__)


def cheap_labels(split: Any) -> np.ndarray | None:
    """The labels of a split when known without decoding an image (arrays, file lists, torchvision sets that
    keep ``targets`` / ``_labels`` / ``labels``), else None."""
    if isinstance(split, (ArraySplit, FileSplit)):
        return np.asarray(split.labels, dtype=np.int64)
    if isinstance(split, TorchvisionSplit):
        for attr in ("targets", "_labels", "labels"):
            labels = getattr(split.dataset, attr, None)
            if labels is not None and len(labels) == len(split.dataset):
                try:
                    return np.asarray(labels, dtype=np.int64).reshape(len(split.dataset))
                except (TypeError, ValueError):  # e.g. non-integer targets: fall back to uniform
                    return None
    return None


def stratified_indices(labels: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` indices into ``labels``, per class in proportion to its count, sorted (original order).

    Per-class quotas by the largest-remainder method (floor of ``n * n_c / N``, the images left over go to the
    classes with the largest fractional parts, ties to the lower class id), so each class's count is within 1
    of proportional; the images of each class are a seeded draw without replacement.
    """
    labels = np.asarray(labels)
    classes, counts = np.unique(labels, return_counts=True)
    exact = n * counts / counts.sum()
    quota = np.floor(exact).astype(np.int64)
    left = n - int(quota.sum())
    order = np.lexsort((np.arange(len(classes)), -(exact - quota)))  # largest remainder first, stable
    quota[order[:left]] += 1
    picked = [rng.choice(np.flatnonzero(labels == c), size=int(q), replace=False)
              for c, q in zip(classes, quota) if q > 0]
    return np.sort(np.concatenate(picked)) if picked else np.zeros(0, dtype=np.int64)


def subsample_indices(name: str, which: str, n_total: int, n: int, seed: int,
                      labels: np.ndarray | None = None) -> np.ndarray:
    """The fixed subsample of split ``which`` ("train" / "test") of set ``name``: class-stratified when
    ``labels`` are given, else uniform; sorted; seeded by ``[seed, crc32(name), crc32(which)]`` only."""
    rng = np.random.default_rng([int(seed), zlib.crc32(name.encode()), zlib.crc32(which.encode())])
    if labels is not None:
        return stratified_indices(labels, n, rng)
    return np.sort(rng.choice(n_total, size=n, replace=False))


def _subsample_split(name: str, which: str, split: ImageSplit, n: int | None,
                     seed: int) -> tuple[ImageSplit, dict[str, Any]]:
    total = len(split)
    if n is None or total <= n:
        return split, {"n": total, "of": total, "how": "whole"}
    if isinstance(split, WdsSplit):  # iterable shards: no random access, and the first N may be class-sorted
        log.warning("%s: max_%s = %d is not supported for webdataset shards; the whole %s split (%d images) "
                    "is used", name, which, n, which, total)
        return split, {"n": total, "of": total, "how": "whole (webdataset: subsample unsupported)"}
    labels = cheap_labels(split)
    idx = subsample_indices(name, which, total, n, seed, labels)
    how = "class-stratified" if labels is not None else "uniform"
    if isinstance(split, ArraySplit):
        out: ImageSplit = ArraySplit(split.images[idx], split.labels[idx])
    elif isinstance(split, FileSplit):
        out = FileSplit([split.paths[i] for i in idx], [split.labels[i] for i in idx])
    else:
        out = SubsetSplit(split, idx)
    return out, {"n": len(idx), "of": total, "how": how}


def subsample_set(ds: LabelledSet, max_train: int | None, max_test: int | None, seed: int) -> LabelledSet:
    """``ds`` with its train / test splits cut to the fixed subsample (captions untouched); ``ds.subsample``
    records what was used. Without a max it is returned as is (``subsample`` None)."""
    if max_train is None and max_test is None:
        return ds
    info: dict[str, Any] = {"max_train": max_train, "max_test": max_test, "seed": int(seed)}
    test, info["test"] = _subsample_split(ds.name, "test", ds.test, max_test, seed)
    train = None
    if ds.train is not None:
        train, info["train"] = _subsample_split(ds.name, "train", ds.train, max_train, seed)
    return replace(ds, train=train, test=test, subsample=info)
