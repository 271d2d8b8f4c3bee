"""A tiny evaluation project (digits-like .npz, held-out pairs, one untrained model) and a recording tracker."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from protoclip import models
from protoclip.project import PathsConfig, ProjectConfig
from protoclip.evaluate.config import EvalDatasetConfig, EvaluateConfig
from protoclip.evaluate.tasks.tsne import TsneConfig
from protoclip.files.layout import Layout
from testkit.training import write_pairs

RUN = "tiny"


def digits_npz(layout: Layout, n_per_class: int = 4) -> None:
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(10), n_per_class)
    # class-dependent brightness + noise, so features differ between classes
    images = np.clip(labels[:, None, None, None] * 20 + rng.integers(0, 30, (len(labels), 16, 16, 3)), 0, 255)
    split = np.where(np.arange(len(labels)) % 2 == 0, "test", "train")  # 2 test + 2 train images per class
    layout.eval_set("digits").parent.mkdir(parents=True, exist_ok=True)
    np.savez(layout.eval_set("digits"), images=images.astype(np.uint8), labels=labels, split=split,
             classnames=np.array([str(i) for i in range(10)]))


def eval_manifest(layout: Layout) -> None:
    """16 grey PNGs with captions and two coarse labels (animals / food), the last 6 held out (heldout_pairs)."""
    write_pairs(layout, n=16, heldout=6, size=16, images="gray", captions="numbered", labels=["animals", "food"])


def eval_project(tmp_path: Path, datasets: dict) -> ProjectConfig:
    cfg = ProjectConfig()
    cfg.paths = PathsConfig(data_dir=tmp_path / "data", results_dir=tmp_path / "results",
                            mlflow_uri=f"sqlite:///{tmp_path}/mlflow.db")
    cfg.evaluate = EvaluateConfig(datasets=datasets, batch_size=8, device="cpu",
                                  sections={"tsne": TsneConfig(max_points=200)})
    cfg._runs = {RUN: ({"method": "clip"}, "<test>")}  # the run evaluated (its model file decides how)
    return cfg


@pytest.fixture
def project(tmp_path):
    """An untrained tiny-rn model ``RUN`` and the sets digits (.npz), heldout_pairs, cifar10 (absent), coco (absent)."""
    datasets = {
        "digits": EvalDatasetConfig(kind="offline"),
        "heldout_pairs": EvalDatasetConfig(kind="offline"),
        "cifar10": EvalDatasetConfig(kind="torchvision", path=None),
        "coco": EvalDatasetConfig(kind="coco", path=str(tmp_path / "no_coco")),
    }
    cfg = eval_project(tmp_path, datasets)
    layout = Layout.from_config(cfg)
    digits_npz(layout)
    eval_manifest(layout)
    torch.manual_seed(0)
    model = models.build_model("tiny-rn", head_hidden=32, head_out=16)
    models.save_model(layout.model(RUN), model, {"model": "tiny-rn"})
    return cfg, layout


class RecordingTracker:
    def __init__(self):
        self.metrics: dict[str, float] = {}
        self.artifacts: list[str] = []

    def log_params(self, params): ...

    def log_metrics(self, metrics, step=None):
        self.metrics.update(metrics)

    def log_artifact(self, path, artifact_path=None):
        self.artifacts.append(str(path))

    def set_tags(self, tags):
        self.tags = dict(tags)
