"""Episode sampling, DDP split and the feature-extraction pass of the episodic trainer."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

from protoclip.train.distributed import DistInfo
from protoclip.train.episode import (
    episode_size_for,
    extract_features,
    rank_positions,
    sample_episode,
    size_stats,
)
from protoclip.train.loader import RunLoader
from protoclip.train.methods.protoclip import n_clusters
from testkit.training import RandomPairs, one_thread, tiny_config, tiny_model

_threads = pytest.fixture(autouse=True)(one_thread)


def test_sample_episode_is_a_pure_function_of_seed_and_episode():
    a = sample_episode(1000, 200, seed=3, episode=7)
    np.random.seed(0)
    torch.manual_seed(0)  # global RNG state must not matter (resume)
    b = sample_episode(1000, 200, seed=3, episode=7)
    assert np.array_equal(a, b)
    assert len(set(a.tolist())) == 200 and a.min() >= 0 and a.max() < 1000  # without replacement
    assert not np.array_equal(a, sample_episode(1000, 200, seed=3, episode=8))
    assert not np.array_equal(a, sample_episode(1000, 200, seed=4, episode=7))


def test_sample_episode_bad_input():
    with pytest.raises(ValueError, match="episode_size"):
        sample_episode(10, 11, 0, 0)
    assert episode_size_for(500, 100) == 100  # capped at M
    with pytest.raises(ValueError, match="empty"):
        episode_size_for(5, 0)


@pytest.mark.parametrize("m,world", [(10, 1), (10, 3), (7, 2), (32, 2)])
def test_rank_positions_cover_the_episode_like_distributed_sampler(m, world):
    from torch.utils.data.distributed import DistributedSampler

    parts = [rank_positions(m, DistInfo(r, world)) for r in range(world)]
    assert len({len(p) for p in parts}) == 1  # equal share: no rank waits in a collective
    assert set(np.concatenate(parts).tolist()) == set(range(m))
    for r in range(world):  # same split as torch's DistributedSampler without shuffling
        oracle = list(DistributedSampler(range(m), num_replicas=world, rank=r, shuffle=False))
        assert parts[r].tolist() == oracle


def test_n_clusters():
    cfg = tiny_config()
    assert n_clusters(cfg, 200_000) == 200_000 // 4
    assert n_clusters(tiny_config(kmeans={"images_per_prototype": 10}), 200_000) == 20_000  # paper: K = 20k
    assert n_clusters(tiny_config(kmeans={"n_clusters": 5}), 32) == 5
    assert n_clusters(tiny_config(kmeans={"images_per_prototype": 100}), 32) == 1  # at least one


class _Fixed(RandomPairs):
    def __getitem__(self, i):  # no augmentation noise: features are a function of the weights only
        return self.images[i], self.tokens[i], self.ids[i]


def test_extract_features_equals_eval_forward_in_episode_order():
    cfg = tiny_config()
    model = tiny_model(cfg).train()
    data = _Fixed(n=20)
    idx = sample_episode(20, 12, seed=0, episode=0)
    loader = RunLoader(data, episode_size=12, seed=0, batch_size=4, extract_batch_size=5, num_workers=0,
                       info=DistInfo(), device=torch.device("cpu"), n_episodes=1)
    assert np.array_equal(loader.indices(0), idx)
    feats = extract_features(model, loader.pass_of(0, "extract"), 12, torch.device("cpu"), DistInfo(),
                             contextlib.nullcontext)
    loader.close()
    assert model.training  # train mode restored
    model.eval()
    with torch.no_grad():
        out = model(data.images[idx], data.tokens[idx])
    torch.testing.assert_close(feats.h_image, out["h_image"], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(feats.h_text, out["h_text"], rtol=1e-4, atol=1e-5)


def test_size_stats():
    s = size_stats(torch.tensor([0, 2, 4, 6]), "k_")
    assert s == {"k_size_min": 0.0, "k_size_mean": 3.0, "k_size_max": 6.0, "k_empty": 1.0}
