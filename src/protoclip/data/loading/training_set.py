"""A run's training pairs: the manifest's train split of its sources, subsampled, as the pairs dataset.

The train stage calls these with the values they need (the run's sources, subset and cache size), never the
project config: what a run trains on is decided here, in one place, for the stage, the benches and the tests.
"""
from __future__ import annotations

import hashlib
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from protoclip.data.loading.pairs import ImageTextDataset, load_manifest, release_unused_memory
from protoclip.errors import ConfigError
from protoclip.files.layout import Layout

# what the dataset reads of the manifest; what the MLflow dataset input shows of it
DATASET_COLUMNS = ["id", "path", "caption", "sha256", "offset", "size"]
ROW_COLUMNS = ["id", "source", "caption", "sha256"]


def resolve_sources(data: Sequence[str], offline_sources: Sequence[str]) -> list[str]:
    """Manifest sources of a run's ``data``: ``offline`` stands for every configured offline source
    (``prepare.offline_sources``); each source once, in order."""
    out: list[str] = []
    for name in data:
        for src in (offline_sources if name == "offline" else [name]):
            if src not in out:
                out.append(src)
    return out


def subsample_pairs(df: pd.DataFrame, fraction: float, seed: int) -> pd.DataFrame:
    """The first ceil(fraction * n) rows of a seeded permutation (nested across fractions), in manifest order."""
    if fraction >= 1.0:
        return df
    keep = np.random.default_rng(seed).permutation(len(df))[: max(1, int(np.ceil(fraction * len(df))))]
    return df.iloc[np.sort(keep)].reset_index(drop=True)


def training_pairs(layout: Layout, sources: Sequence[str], transform: Callable, tokenizer: Callable, *, run: str,
                   data: Sequence[str], fraction: float = 1.0, seed: int = 0,
                   image_cache_bytes: int = 0) -> ImageTextDataset:
    """Run ``run``'s training pairs: the train split of ``sources`` (its ``data`` resolved), the first ``fraction``
    of a ``seed``-ed permutation, read through ``transform`` and ``tokenizer``. A missing manifest, or one without
    pairs of these sources, is a :class:`ConfigError` naming the run and the command that builds it.

        sources = resolve_sources(tcfg.data, cfg.prepare.offline_sources)
        dataset = training_pairs(layout, sources, transform, tokenizer, run="clip_tiny", data=tcfg.data,
                                 fraction=1.0, seed=0)
        digest = rows_digest(training_rows(layout, sources))   # the rows an MLflow dataset input names
    """
    if not layout.manifest.exists():
        raise ConfigError(f"run '{run}': manifest not found at {layout.manifest}; build it with "
                          "`protoclip prepare --config <config>`")
    df = load_manifest(layout, sources=sources, split="train", columns=DATASET_COLUMNS)
    if len(df) == 0:
        raise ConfigError(f"run '{run}': no training pairs for sources {list(data)} in {layout.manifest}")
    df = subsample_pairs(df, fraction, seed)
    dataset = ImageTextDataset(df, transform, tokenizer, image_cache_bytes=image_cache_bytes)
    del df
    release_unused_memory()  # the manifest read's pages, before the training (and its forked workers) start
    return dataset


def training_rows(layout: Layout, sources: Sequence[str]) -> pd.DataFrame:
    """The train split's rows of ``sources`` as an MLflow dataset input shows them (:data:`ROW_COLUMNS`)."""
    return load_manifest(layout, sources=sources, split="train", columns=ROW_COLUMNS)


def rows_digest(df: pd.DataFrame) -> str:
    """sha256 of ``"\\n".join(f"{id} {sha256}")`` over the rows, hashed row by row (no string of the whole corpus):
    the training data's identity, one tag of the model's MLflow run."""
    h = hashlib.sha256()
    for k, (i, s) in enumerate(zip(df["id"], df["sha256"])):
        h.update(f"{chr(10) if k else ''}{i} {s}".encode())
    return h.hexdigest()
