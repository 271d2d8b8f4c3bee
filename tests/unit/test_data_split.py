"""Train / held-out split: deterministic, disjoint, stable when other ids are added, right proportion."""
from __future__ import annotations

import hashlib

import pytest

from protoclip.data.corpus.split import assign_splits, split_of, split_score


def test_split_matches_independent_hash_rule():
    sid = "tuxpaint/animals/cat"
    h = int(hashlib.sha256(b"7/tuxpaint/animals/cat").hexdigest()[:16], 16) / 2**64
    assert split_score(sid, 7) == pytest.approx(h)
    assert split_of(sid, 7, 0.5) == ("heldout" if h < 0.5 else "train")


def test_split_deterministic_disjoint_and_proportional():
    ids = [f"src/{i}" for i in range(4000)]
    a, b = assign_splits(ids, 0, 0.1), assign_splits(ids, 0, 0.1)
    assert a == b
    held = {i for i, s in zip(ids, a) if s == "heldout"}
    train = {i for i, s in zip(ids, a) if s == "train"}
    assert not held & train and len(held) + len(train) == len(ids)
    assert 0.08 < len(held) / len(ids) < 0.12
    assert assign_splits(ids, 1, 0.1) != a  # the seed matters


def test_split_stable_when_sources_are_added():
    base = [f"tuxpaint/{i}" for i in range(500)]
    before = dict(zip(base, assign_splits(base, 0, 0.2)))
    more = base + [f"user/{i}" for i in range(500)]
    after = dict(zip(more, assign_splits(more, 0, 0.2)))
    assert all(after[i] == before[i] for i in base)


def test_split_edges():
    assert set(assign_splits([f"x/{i}" for i in range(50)], 0, 0.0)) == {"train"}
    with pytest.raises(ValueError):
        split_of("x", 0, 1.0)
