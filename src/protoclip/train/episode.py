"""One episode's data (ProtoCLIP Sec. III-D): which m items it holds (:func:`sample_episode`), this rank's share
of them (:func:`rank_positions`) and their features h^I, h^T under the current model (:func:`extract_features`),
from which a method builds the episode's prototypes (ProtoCLIP: k-means per modality and on the cached teacher
features on rank 0, broadcast: ``protoclip.train.methods.protoclip.build_episode_prototypes``).
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Callable, ContextManager, Iterable

import numpy as np
import torch
from tqdm.auto import tqdm

from protoclip.data.loading.batch import Batch
from protoclip.train.distributed import DistInfo, all_gather_cat

log = logging.getLogger(__name__)


def episode_size_for(requested: int, dataset_size: int) -> int:
    """m capped at M (an episode cannot hold more distinct items than the data set)."""
    if dataset_size < 1:
        raise ValueError("the training data set is empty")
    if requested > dataset_size:
        log.warning("episode_size %d > data set size %d: using m = %d", requested, dataset_size, dataset_size)
    return min(requested, dataset_size)


def sample_episode(dataset_size: int, episode_size: int, seed: int, episode: int) -> np.ndarray:
    """Indices of episode ``episode``: ``episode_size`` distinct items in random (training) order.

    The generator is seeded by ``(seed, episode)`` (numpy SeedSequence), independent of any global RNG
    state, so that a resumed run draws exactly the episodes an uninterrupted run draws.
    """
    if episode_size > dataset_size:
        raise ValueError(f"episode_size {episode_size} > data set size {dataset_size}")
    if episode < 0:
        raise ValueError(f"episode must be >= 0, got {episode}")
    rng = np.random.default_rng([seed, episode])
    return rng.choice(dataset_size, size=episode_size, replace=False)


def rank_positions(episode_size: int, info: DistInfo) -> np.ndarray:
    """Episode positions this rank handles: ``DistributedSampler`` split (pad by wrapping, take rank::world)."""
    per_rank = math.ceil(episode_size / info.world_size)
    padded = np.arange(per_rank * info.world_size) % episode_size
    return padded[info.rank:: info.world_size]


@dataclass
class EpisodeFeatures:
    h_image: torch.Tensor  # [m, d_h] float32 on the model's device, episode order
    h_text: torch.Tensor  # [m, d_h]
    teacher: torch.Tensor | None  # [m, d_teacher] cached external-teacher features, or None


@torch.no_grad()
def extract_features(model: torch.nn.Module, loader: Iterable[Batch], episode_size: int, device: torch.device,
                     info: DistInfo, autocast: Callable[[], ContextManager], desc: str = "extract") -> EpisodeFeatures:
    """h^I, h^T of every episode item with the current model in eval mode (train mode restored after);
    ``loader``: this rank's batches of the episode's ``extract`` pass (the run's loader, ``pass_of``, in batches
    of ``train.extract_batch_size``).

    No gradients, under the run's autocast, with the *train* transform: its own augmentation draw, the "implicit
    contrast" of Sec. IV-B3 (the training step sees a different view of the same image). Under DDP each rank
    extracts the items of its :func:`rank_positions` and the features are all-gathered, in episode order,
    before clustering.
    """
    was_training = model.training
    model.eval()
    feats_i, feats_t, poss = [], [], []
    try:
        for batch in tqdm(loader, desc=desc, leave=False, disable=not info.is_main):
            on = batch.on_device(device)
            with autocast():
                out = model(on.images, on.tokens)
            feats_i.append(out["h_image"].float())
            feats_t.append(out["h_text"].float())
            poss.append(batch.positions.to(device, non_blocking=True))
    finally:
        model.train(was_training)
    h_i, h_t, pos = torch.cat(feats_i), torch.cat(feats_t), torch.cat(poss)
    h_i, h_t, pos = all_gather_cat(h_i, info), all_gather_cat(h_t, info), all_gather_cat(pos, info)
    # kept on the model's device so that k-means runs there (torch backend or faiss-gpu on CUDA)
    out_i = torch.empty((episode_size, h_i.shape[1]), dtype=torch.float32, device=h_i.device)
    out_t = torch.empty((episode_size, h_t.shape[1]), dtype=torch.float32, device=h_t.device)
    out_i[pos] = h_i  # padded duplicates write the same row twice
    out_t[pos] = h_t
    return EpisodeFeatures(out_i, out_t, None)


def size_stats(sizes: torch.Tensor | np.ndarray, prefix: str) -> dict[str, float]:
    """min / mean / max cluster size and the number of empty clusters, keys ``<prefix>size_min`` ..."""
    s = sizes.detach().cpu().numpy() if isinstance(sizes, torch.Tensor) else np.asarray(sizes)
    return {f"{prefix}size_min": float(s.min()), f"{prefix}size_mean": float(s.mean()),
            f"{prefix}size_max": float(s.max()), f"{prefix}empty": float((s == 0).sum())}
