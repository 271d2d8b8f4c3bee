"""One DataLoader for a whole training run: both passes of every episode (``extract``, a method's work before the
steps, e.g. ProtoCLIP's features for k-means; ``train``, the optimizer steps) through the same worker processes,
started once per run instead of twice per episode, the next pass prefetched across pass boundaries, and each
item's augmentation a pure function of (seed, episode, pass, position). Design: docs/methods.md,
"protoclip.train.loader".
"""
from __future__ import annotations

import collections
import functools
import math
import random
import time
from typing import Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from protoclip.data.loading.batch import Batch, collate
from protoclip.data.loading.device_augment import DeviceAugment, key_seed
from protoclip.data.loading.transforms import ImageForm
from protoclip.train.distributed import DistInfo
from protoclip.train.episode import rank_positions, sample_episode

PASSES = ("extract", "train")  # an episode's passes over its items; the index is part of an item's seed


def seed_item(key: tuple[int, int, int, int]) -> None:
    """Seed this process's python, numpy and torch (CPU) RNGs from ``(seed, episode, pass index, position)``.

    The seed is a 64-bit BLAKE2b hash of the key (:func:`~protoclip.data.loading.device_augment.key_seed`; a few
    microseconds; ``torch.manual_seed`` would also visit every accelerator's generator, ~0.5 ms an item, and a
    worker's transforms draw from the CPU generator only)."""
    s = key_seed(key)
    random.seed(s)
    np.random.seed(s % 2**32)
    torch.default_generator.manual_seed(s)


class RunItems(Dataset):
    """The run's items, keyed ``(dataset index, episode position, seed key or None)`` -> ``(image, tokens,
    position)``; a seed key (see :func:`seed_item`) reseeds the RNGs before the item is read."""

    def __init__(self, base: Dataset):
        self.base = base

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, key: tuple[int, int, tuple[int, int, int, int] | None]):
        index, pos, seed_key = key
        if seed_key is not None:
            seed_item(seed_key)
        image, tokens, _sample_id = self.base[index]
        return image, tokens, pos


class EpisodeBatches(Sampler):
    """Batch sampler over :class:`RunItems`: the batches of a sequence of passes on this rank.

    :meth:`set_passes` selects the (episode, pass) sequence; an iterator taken after it yields, pass after pass,
    lists of item keys: this rank's episode positions in order (a DistributedSampler split without shuffling: the
    episode draw is random already) in batches of the pass's size. ``seed_items``: whether the keys carry a per-item
    seed key."""

    def __init__(self, dataset_size: int, episode_size: int, seed: int, info: DistInfo,
                 batch_sizes: dict[str, int], seed_items: bool):
        if set(batch_sizes) != set(PASSES) or min(batch_sizes.values()) < 1:
            raise ValueError(f"batch sizes >= 1 needed for the passes {PASSES}, got {batch_sizes}")
        self.dataset_size, self.episode_size, self.seed = dataset_size, episode_size, seed
        self.batch_sizes, self.seed_items = dict(batch_sizes), seed_items
        self.positions = rank_positions(episode_size, info)
        self.passes: list[tuple[int, str]] = [(0, "train")]
        self._drawn: dict[int, np.ndarray] = {}  # episode -> its indices: the last two draws (a stream spans two)

    def indices(self, episode: int) -> np.ndarray:
        """The episode's dataset indices (:func:`~protoclip.train.episode.sample_episode`), training order."""
        if episode not in self._drawn:
            if len(self._drawn) >= 2:
                del self._drawn[min(self._drawn)]
            self._drawn[episode] = sample_episode(self.dataset_size, self.episode_size, self.seed, episode)
        return self._drawn[episode]

    def set_passes(self, passes: list[tuple[int, str]]) -> None:
        bad = [p for _, p in passes if p not in PASSES]
        if bad or not passes:
            raise ValueError(f"passes must be a non-empty list of (episode, one of {PASSES}), got {passes!r}")
        self.passes = list(passes)

    def n_batches(self, pass_: str) -> int:
        return math.ceil(len(self.positions) / self.batch_sizes[pass_])

    def __len__(self) -> int:
        return sum(self.n_batches(p) for _, p in self.passes)

    def __iter__(self) -> Iterator[list]:
        passes = list(self.passes)  # bound now: a later set_passes cannot change this iterator
        return (batch for episode, pass_ in passes for batch in self._batches(episode, pass_))

    def _batches(self, episode: int, pass_: str) -> Iterator[list]:
        indices, size = self.indices(episode), self.batch_sizes[pass_]
        seed_key = (self.seed, episode, PASSES.index(pass_)) if self.seed_items else None
        for start in range(0, len(self.positions), size):
            yield [(int(indices[p]), int(p), None if seed_key is None else (*seed_key, int(p)))
                   for p in self.positions[start:start + size]]


class Pass:
    """One pass of one episode: each iteration reads it from the run's loader; ``len``: its number of batches."""

    def __init__(self, owner: "RunLoader", episode: int, pass_: str):
        self.owner, self.episode, self.pass_ = owner, episode, pass_

    def __len__(self) -> int:
        return self.owner.batches.n_batches(self.pass_)

    def __iter__(self):
        return self.owner._read(self.episode, self.pass_)


class RunLoader:
    """The run's one DataLoader over ``dataset`` (items ``(image, tokens, id)``, images of ``form``), serving
    :class:`Pass` es (docs/methods.md, "protoclip.train.loader"). ``batch_size`` / ``extract_batch_size``: this
    rank's batch of each pass; ``n_episodes``: the schedule's episodes (nothing is read past the last).
    :meth:`close` stops the workers. With ``num_workers > 0`` the DataLoader has ``persistent_workers`` (started
    once per run, or once per resumed segment). Each pass is an iterable of
    :class:`~protoclip.data.loading.batch.Batch` es (images stacked by the run's
    :class:`~protoclip.data.loading.transforms.ImageForm`, tokens, positions)::

        loader = RunLoader(dataset, episode_size=m, seed=0, batch_size=512, extract_batch_size=1024,
                           num_workers=8, info=info, device=device, n_episodes=n, form=image_form(transform))
        for batch in loader.pass_of(episode, "extract"): ...  # batch.views, batch.tokens, batch.positions
        for batch in loader.pass_of(episode, "train"): ...
        wait = loader.take_wait()  # seconds waited for the first batch of each pass since the last call
        loader.close()
    """

    def __init__(self, dataset: Dataset, *, episode_size: int, seed: int, batch_size: int, extract_batch_size: int,
                 num_workers: int, info: DistInfo, device: torch.device, n_episodes: int,
                 augment: DeviceAugment | None = None, form: ImageForm = ImageForm()):
        self.workers, self.n_episodes = num_workers > 0, n_episodes
        self.augment, self.device, self.seed = augment, device, seed
        self.batches = EpisodeBatches(len(dataset), episode_size, seed, info,
                                      {"extract": extract_batch_size, "train": batch_size}, seed_items=self.workers)
        # with workers, the iterator's base seed comes from a generator of its own: the worker seeds do not matter
        # (items reseed) and the main process's RNG stream must not depend on when the workers started (resume)
        self.loader: DataLoader | None = DataLoader(
            RunItems(dataset), batch_sampler=self.batches, num_workers=num_workers,
            collate_fn=functools.partial(collate, form=form), pin_memory=device.type == "cuda",
            persistent_workers=self.workers,
            generator=torch.Generator().manual_seed(seed) if self.workers else None)
        self._it: Iterator | None = None
        self._queue: collections.deque[tuple[int, str]] = collections.deque()  # the passes self._it yields next
        self._pattern: tuple[str, ...] = ("train",)  # the passes of an episode, as the latest episode began
        self._episode = -1  # the episode read last
        self._wait = 0.0

    def indices(self, episode: int) -> np.ndarray:
        return self.batches.indices(episode)

    def pass_of(self, episode: int, pass_: str) -> Pass:
        """Episode ``episode``'s ``extract`` or ``train`` pass (started when iterated)."""
        if pass_ not in PASSES:
            raise ValueError(f"pass must be one of {PASSES}, got {pass_!r}")
        return Pass(self, episode, pass_)

    def take_wait(self) -> float:
        """Seconds waited for the first batch of each pass read since the last call."""
        wait, self._wait = self._wait, 0.0
        return wait

    def plan(self, episode: int, pass_: str) -> list[tuple[int, str]]:
        """The passes expected from (episode, pass_) to the run's end: the rest of this episode, then every later
        episode as the latest one began (extract + train, or train only)."""
        rest = [(episode, p) for p in self._pattern[self._pattern.index(pass_):]] if pass_ in self._pattern \
            else [(episode, pass_)]
        return rest + [(e, p) for e in range(episode + 1, self.n_episodes) for p in self._pattern]

    def _start(self, episode: int, pass_: str) -> Iterator:
        """The iterator whose next batches are (episode, pass_)'s: the running stream when it is at that pass,
        else a new one (persistent workers: the same processes, a new epoch; what was read ahead is dropped)."""
        if self.loader is None:
            raise RuntimeError("the run's loader is closed")
        if not self.workers:  # one pass per iterator, read in this process as a loader per pass reads it
            self.batches.set_passes([(episode, pass_)])
            # each DataLoader iterator draws a base seed from the global RNG; a pass read through a tqdm.auto bar
            # takes two (one in the bar's constructor, one when iterated): the same two draws here keep the main
            # process's stream, so runs without workers draw the augmentations a loader per pass drew
            iter(self.loader)
            self._queue = collections.deque([(episode, pass_)])
            self._it = iter(self.loader)
        elif not self._queue or self._queue[0] != (episode, pass_) or self._it is None:
            self._queue = collections.deque(self.plan(episode, pass_))
            self.batches.set_passes(list(self._queue))
            self._it = iter(self.loader)
        return self._it

    def _read(self, episode: int, pass_: str):
        if episode != self._episode:  # a new episode: its first pass says how the next ones will begin
            self._episode, self._pattern = episode, PASSES if pass_ == "extract" else ("train",)
        t0 = time.perf_counter()
        it, n, taken = self._start(episode, pass_), self.batches.n_batches(pass_), 0
        try:
            for _ in range(n):
                batch = next(it)
                if not taken:
                    self._wait += time.perf_counter() - t0
                taken += 1
                yield batch if self.augment is None else self._on_device(batch, episode, pass_)
        finally:
            if taken == n:  # the stream is at the next pass
                self._queue.popleft()
            else:  # left part-way (an error, a break): start afresh at the next pass asked
                self._queue.clear()

    def _on_device(self, batch: Batch, episode: int, pass_: str) -> Batch:
        """The batch with its images (each view) on the device, augmented and normalised (``augment``:
        ``train.augment_on: device``, :class:`~protoclip.data.loading.device_augment.DeviceAugment`).

        Each uint8 view is augmented with the key (episode, pass index, the batch's first position, view), so the
        draws, like the workers' per-item seeds, do not depend on the worker count, the prefetch or a resume; a
        batch of stored files (``train.decode_on: device``) is decoded, cropped and flipped here first.
        """
        key = (self.seed, episode, PASSES.index(pass_), int(batch.positions[0]))  # on the host: no device read
        if batch.stored:  # stored files (decode_on: device): decoded, cropped and flipped here first
            image = self.augment.decode_crop(list(batch.stored), (*key, 0), self.device)
            return batch.with_views([self.augment(image, (*key, 0))])
        return batch.with_views([self.augment(view.to(self.device, non_blocking=True), (*key, v))
                                 for v, view in enumerate(batch.views)])

    def close(self) -> None:
        """Stop the worker processes (the loader serves no more passes)."""
        it, self._it = self._it, None
        if self.loader is not None and self.workers and it is not None:
            it._shutdown_workers()  # at once, rather than whenever the iterator is collected
        self.loader = None
