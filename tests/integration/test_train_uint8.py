"""Training batches travel as uint8 and are normalised on the device
(protoclip.data.loading.transforms.normalize_batch): a tiny run on real images through the methods' own training
transforms gives bit-identical weights to the float pipeline (the same transforms, normalised in the worker:
ToTensor + Normalize), for a one-view method (ProtoCLIP: its episode's feature extraction and its training steps)
and a three-view one (PCL: two uint8 augmented views and a float centre crop, the E-step reading the crop)."""
from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest
import torch

from protoclip.files.layout import Layout
from protoclip.train.config import PAUCConfig
from protoclip.train.loop import train
from protoclip.train.methods.base import method_class
from protoclip.train.methods.pcl import PCLConfig
from testkit.training import PilPairs, one_thread, tiny_config, tiny_model

_threads = pytest.fixture(autouse=True)(one_thread)


def weights(cfg, root: Path, worker_normalise: bool) -> dict[str, torch.Tensor]:
    tf = method_class(cfg.method).train_transform(cfg, 64)
    data = PilPairs(tf, worker_normalise=worker_normalise)
    kinds = {v.dtype for v in (data[0][0] if isinstance(data[0][0], tuple) else (data[0][0],))}
    assert (torch.uint8 in kinds) != worker_normalise  # the two paths really differ in what the batches hold
    random.seed(cfg.seed)  # open_clip's jitter / grayscale wrappers draw from Python's RNG (the stage seeds it)
    model = train(tiny_model(cfg), data, cfg, Layout(root / "data", root / "results").train_files("u8"))
    return model.state_dict()


def pcl_config():
    cfg = tiny_config(method="pcl", augmentation="mocov2")
    pcl = PCLConfig(tau=0.2, momentum=0.9, queue_size=32, negatives=4, num_clusters=[4, 8], infonce_only_episodes=1,
                    kmeans_iters=5, kmeans_redo=1)
    return dataclasses.replace(cfg, sections={**cfg.sections, "pcl": pcl}, pauc=PAUCConfig())


@pytest.mark.parametrize("make_cfg", [lambda: tiny_config(), lambda: tiny_config(num_workers=1), pcl_config],
                         ids=["protoclip", "protoclip-worker", "pcl"])
def test_uint8_batches_train_to_the_float_pipelines_weights(tmp_path, make_cfg):
    cfg = make_cfg()
    new = weights(cfg, tmp_path / "u8", worker_normalise=False)
    old = weights(cfg, tmp_path / "f32", worker_normalise=True)
    assert new.keys() == old.keys()
    for k in new:
        assert torch.equal(new[k], old[k]), k
    # the comparison can tell runs apart: another seed gives other weights
    other = weights(dataclasses.replace(cfg, seed=1), tmp_path / "s1", worker_normalise=False)
    assert any(not torch.equal(new[k], other[k]) for k in new if new[k].is_floating_point())
