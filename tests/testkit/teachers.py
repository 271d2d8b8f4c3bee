"""A stand-in text teacher for tests of the teacher stage (no model: deterministic and fast, any dimension)."""
from __future__ import annotations

import hashlib

import numpy as np


class HashTeacher:
    """A caption's feature is the L2-normalised sum of a fixed random vector per word (seeded by the word's
    hash) plus a little of the caption's own: deterministic, cheap, and with a few strong directions (the
    shared vocabulary) for PCA to find. ``calls`` counts encode calls; ``fail_on`` raises on the n-th one."""

    weights = None

    def __init__(self, dim: int = 48, name: str = "hash-teacher", fail_on: int | None = None):
        self.dim, self.name, self.fail_on, self.calls = dim, name, fail_on, 0

    def _vec(self, text: str, scale: float = 1.0) -> np.ndarray:
        seed = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
        return scale * np.random.default_rng(seed).standard_normal(self.dim)

    def encode(self, captions, batch_size=256, max_length=128, progress=True) -> np.ndarray:
        self.calls += 1
        if self.fail_on is not None and self.calls == self.fail_on:
            raise KeyboardInterrupt("simulated kill")
        out = np.stack([sum((self._vec(w) for w in c.split()), self._vec(c, 0.3)) for c in captions])
        return (out / np.linalg.norm(out, axis=1, keepdims=True)).astype(np.float32)
