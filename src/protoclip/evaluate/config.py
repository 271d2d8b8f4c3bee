"""Config of the `evaluate` stage (owned by protoclip.evaluate)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

TASKS = ("zeroshot", "linear", "knn", "retrieval", "clustering", "nemd", "tsne")


@dataclass
class EvalDatasetConfig:
    """One evaluation data set. Offline sets need no path; paper sets are found by `path`."""
    # offline: built by `prepare`; torchvision: torchvision's on-disk layout (download=False);
    # folder: class-per-folder image tree; wds: clip_benchmark webdataset shards; coco: COCO captions
    kind: Literal["offline", "torchvision", "folder", "wds", "coco"]
    path: str | None = None  # root folder / shard folder / COCO root; null = not configured (reported skipped)
    tasks: list[str] = field(default_factory=lambda: list(TASKS))  # tasks run on this set


@dataclass
class EvaluateConfig:
    datasets: dict[str, EvalDatasetConfig] = field(default_factory=dict)  # name -> data set
    batch_size: int = 256  # feature extraction batch
    device: str = "auto"
    knn_k: int = 20  # DINO / paper: k = 20
    knn_temperature: float = 0.07  # DINO's temperature-weighted vote
    linear_max_iter: int = 1000  # L-BFGS iterations (CLIP protocol)
    seed: int = 0
