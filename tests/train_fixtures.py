"""Tiny in-memory fixtures shared by tests/test_train_*.py (no files, no network)."""
from __future__ import annotations

import dataclasses

import numpy as np
import torch
from torch.utils.data import Dataset

from protoclip.train.config import KMeansConfig, LossConfig, TrainConfig

WORDS = ["red", "green", "blue", "cat", "dog", "car", "tree", "house", "sun", "moon", "boat", "bird"]


class RandomPairs(Dataset):
    """n random 64 px images with captions; ``__getitem__`` adds noise from the *global* torch RNG (a stand-in
    for a random augmentation, so resume must restore RNG states to be exact)."""

    def __init__(self, n: int = 64, image_size: int = 64, seed: int = 0, tokenizer=None):
        g = torch.Generator().manual_seed(seed)
        self.images = torch.randn(n, 3, image_size, image_size, generator=g)
        rng = np.random.default_rng(seed)
        self.captions = [" ".join(rng.choice(WORDS, size=3)) for _ in range(n)]
        if tokenizer is None:
            from protoclip.models import get_tokenizer

            tokenizer = get_tokenizer("tiny-rn")
        self.tokens = tokenizer(self.captions)
        self.ids = [f"s{i:04d}" for i in range(n)]

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int):
        noise = 0.1 * torch.randn(self.images.shape[1:])
        return self.images[i] + noise, self.tokens[i], self.ids[i]


def tiny_config(**overrides) -> TrainConfig:
    """A CPU-sized run: tiny-rn, episode 32, batch 16, 2 epochs of 64 items = 4 episodes x 2 steps."""
    loss = overrides.pop("loss", {})
    km = overrides.pop("kmeans", {})
    base = TrainConfig(name="t", method="protoclip", model="tiny-rn", head_hidden=32, head_out=16, teacher=None,
                       epochs=2.0, episode_size=32, batch_size=16, warmup_episodes=1, lr=1e-3,
                       lock_image_epoch=None, num_workers=0, device="cpu", precision="fp32", seed=0,
                       kmeans=KMeansConfig(backend="torch", images_per_prototype=4, iters=5),
                       loss=LossConfig(external_weight=0.0))
    base = dataclasses.replace(base, loss=dataclasses.replace(base.loss, **loss),
                               kmeans=dataclasses.replace(base.kmeans, **km))
    return dataclasses.replace(base, **overrides)


def tiny_model(cfg: TrainConfig, seed: int = 0):
    from protoclip.models import build_model

    torch.manual_seed(seed)
    return build_model(cfg.model, head_hidden=cfg.head_hidden, head_out=cfg.head_out,
                       init_temperature=cfg.loss.init_temperature)


def one_thread():
    """Generator for an autouse fixture: 1 intra-op thread (2 shared CPU cores: OpenMP spin-waits otherwise)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
