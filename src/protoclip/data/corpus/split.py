"""Deterministic train / held-out split by hashing each sample id, so that adding a source never moves another's
samples between splits (:func:`split_of`).
"""
from __future__ import annotations

import hashlib
from typing import Iterable


def split_score(sample_id: str, seed: int) -> float:
    """Uniform-looking number in [0, 1) fixed by (seed, id)."""
    digest = hashlib.sha256(f"{seed}/{sample_id}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def split_of(sample_id: str, seed: int, heldout_fraction: float) -> str:
    """``"heldout"`` when :func:`split_score` (SHA-256 of ``"<seed>/<id>"`` read as a number in [0, 1)) is below
    ``heldout_fraction``, else ``"train"``.

    Each sample's split depends only on its own id and the seed: adding a source, or a user data set, never moves a
    sample of another source between splits (a seeded permutation of the whole corpus would), and any machine gets
    the same split.
    """
    if not 0.0 <= heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction must be in [0, 1), got {heldout_fraction}")
    return "heldout" if split_score(sample_id, seed) < heldout_fraction else "train"


def assign_splits(ids: Iterable[str], seed: int, heldout_fraction: float) -> list[str]:
    return [split_of(i, seed, heldout_fraction) for i in ids]


__all__ = ["split_score", "split_of", "assign_splits"]
