"""``train.augment_on: device``: the workers crop and flip, the loader applies the colour steps on the device
(protoclip.data.device_augment). A tiny ProtoCLIP run on real images trains the same weights with one worker, two
workers, and cut after an episode and resumed; it differs from the run augmented in the workers; a three-view
method (PCL: two augmented views, one float centre crop) trains with it."""
from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from protoclip.files.layout import Layout
from protoclip.train.loop import train
from protoclip.train.methods.base import method_class
from testkit.training import PilPairs, last_state, one_thread, tiny_config, tiny_model

_threads = pytest.fixture(autouse=True)(one_thread)


def run(tmp_path, name: str, cfg, cut: int | None = None) -> dict[str, torch.Tensor]:
    data = PilPairs(method_class(cfg.method).train_transform(cfg, 64), n=48)
    layout = Layout(tmp_path / "data", tmp_path / name)
    random.seed(cfg.seed)
    model = train(tiny_model(cfg), data, cfg, layout.train_files("r"), stop_after_episodes=cut)
    if cut is not None:
        torch.manual_seed(1234)  # a fresh process: the resume restores what it needs
        model = train(tiny_model(cfg, seed=99), data, cfg, layout.train_files("r"), state=last_state(layout, "r", cfg))
    return model.state_dict()


def test_device_augmentation_is_exact_across_workers_and_resume(tmp_path):
    cfg = tiny_config(episode_size=16, batch_size=8, epochs=1.0, augment_on="device", num_workers=1)  # 3 episodes
    one = run(tmp_path, "one", cfg)
    two = run(tmp_path, "two", dataclasses.replace(cfg, num_workers=2))
    cut = run(tmp_path, "cut", dataclasses.replace(cfg, num_workers=2), cut=1)
    for k in one:
        assert torch.equal(one[k], two[k]) and torch.equal(one[k], cut[k]), k
    workers = run(tmp_path, "workers", dataclasses.replace(cfg, augment_on="workers"))
    assert any(not torch.equal(one[k], workers[k]) for k in one if one[k].is_floating_point())


def test_a_three_view_method_trains_with_device_augmentation(tmp_path):
    from protoclip.train.config import PAUCConfig
    from protoclip.train.methods.pcl import PCLConfig

    cfg = tiny_config(method="pcl", augmentation="mocov2", augment_on="device", episode_size=16, batch_size=8,
                      epochs=1.0)
    pcl = PCLConfig(tau=0.2, momentum=0.9, queue_size=16, negatives=4, num_clusters=[2, 4], infonce_only_episodes=1,
                    kmeans_iters=5, kmeans_redo=1)
    cfg = dataclasses.replace(cfg, sections={**cfg.sections, "pcl": pcl}, pauc=PAUCConfig())
    state = run(tmp_path, "pcl", cfg)
    assert all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point())
