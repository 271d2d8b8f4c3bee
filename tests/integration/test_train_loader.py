"""The run's one DataLoader (protoclip.train.loader): the episode draw and rank split of its batches, the same
draws as a loader per pass without workers, workers started once per run, and batches that depend on neither the
prefetch, a resume nor the worker count."""
from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from protoclip.files.layout import Layout
from protoclip.files.records import PHASES, read_train_log
from protoclip.train.distributed import DistInfo
from protoclip.train.episode import rank_positions, sample_episode
from protoclip.train.loader import RunLoader
from protoclip.train.loop import train
from testkit.training import RandomPairs, last_state, one_thread, tiny_config, tiny_model, training_records

_threads = pytest.fixture(autouse=True)(one_thread)

CPU = torch.device("cpu")


class IdPairs(RandomPairs):
    """RandomPairs whose items carry their index (the third field), to check which items a batch holds."""

    def __getitem__(self, i: int):
        image, tokens, _ = super().__getitem__(i)
        return image, tokens, i


class PidPairs(RandomPairs):
    """RandomPairs that leave a file named after the reading process's pid in ``folder`` (worker starts)."""

    def __init__(self, folder: Path, **kw):
        super().__init__(**kw)
        self.folder = str(folder)

    def __getitem__(self, i: int):
        Path(self.folder, str(os.getpid())).touch()
        return super().__getitem__(i)


class EpisodeItems(Dataset):
    """One episode's items ``(image, tokens, position)`` in episode order, read when asked (the oracle of a
    DataLoader made per pass)."""

    def __init__(self, base, indices: np.ndarray):
        self.base, self.indices = base, indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, p: int):
        image, tokens, _ = self.base[int(self.indices[p])]
        return image, tokens, p


def make(dataset, *, workers: int, n_episodes: int = 3, info: DistInfo = DistInfo(), episode_size: int = 12,
         batch_size: int = 4, extract_batch_size: int = 8) -> RunLoader:
    return RunLoader(dataset, episode_size=episode_size, seed=7, batch_size=batch_size,
                     extract_batch_size=extract_batch_size, num_workers=workers, info=info, device=CPU,
                     n_episodes=n_episodes)


def read(loader: RunLoader, passes) -> list[tuple]:
    """Each pass's batches as the trainer reads them (through a tqdm.auto bar)."""
    return [list(tqdm(loader.pass_of(e, p), disable=True)) for e, p in passes]


def assert_same_batches(a: list, b: list) -> None:
    assert len(a) == len(b)
    for pa, pb in zip(a, b):
        assert len(pa) == len(pb) and len(pa) > 0
        for a_, b_ in zip(pa, pb):
            assert torch.equal(a_.positions, b_.positions) and torch.equal(a_.tokens, b_.tokens)
            assert len(a_.views) == len(b_.views) and all(torch.equal(x, y) for x, y in zip(a_.views, b_.views))


def test_an_image_cache_leaves_the_batches_of_worker_processes_unchanged(tiny_manifest):
    """``train.image_cache_mb``: each of two persistent workers keeps the images it decoded; three episodes' two
    passes give the batches of the same loader without the cache."""
    from protoclip.data.loading.pairs import ImageTextDataset, load_manifest
    from protoclip.data.loading.transforms import train_transform

    df = load_manifest(tiny_manifest)

    def batches(cache_bytes: int) -> list:
        data = ImageTextDataset(df, train_transform(16, "protoclip"), lambda texts: torch.zeros(len(texts), 8),
                                image_cache_bytes=cache_bytes)
        loader = make(data, workers=2)
        try:
            return read(loader, [(e, p) for e in range(3) for p in ("extract", "train")])
        finally:
            loader.close()

    assert_same_batches(batches(0), batches(2**20))


@pytest.mark.parametrize("world", [1, 2])
def test_batches_are_the_episode_draw_split_by_rank_in_each_pass_size(world):
    data = IdPairs(n=30)
    m = 11
    for rank in range(world):
        info = DistInfo(rank, world)
        loader = make(data, workers=0, info=info, episode_size=m, batch_size=3, extract_batch_size=5)
        for episode in (0, 2):
            drawn = sample_episode(30, m, seed=7, episode=episode)
            mine = rank_positions(m, info)
            for pass_, size in (("extract", 5), ("train", 3)):
                p = loader.pass_of(episode, pass_)
                batches = list(p)
                assert len(p) == len(batches) == -(-len(mine) // size)
                assert [len(b) for b in batches[:-1]] == [size] * (len(batches) - 1)
                assert torch.cat([b.positions for b in batches]).tolist() == mine.tolist()  # positions, in order
                # the images are those of the drawn items: the base data set's image plus its 0.1-sd noise
                for b in batches:
                    diff = b.images - data.images[drawn[b.positions.numpy()]]
                    assert diff.abs().max() < 1.0 and 0.05 < diff.std() < 0.15
        assert np.array_equal(loader.indices(2), sample_episode(30, m, seed=7, episode=2))
        loader.close()


def test_without_workers_the_draws_are_those_of_a_loader_per_pass():
    """num_workers 0: the items read in the main process from its global RNG, as a DataLoader made per pass and
    read through a tqdm.auto bar did (the trainer before one loader served the run); the RNG ends in the same state."""
    data = RandomPairs(n=30)
    passes = [(0, "extract"), (0, "train"), (1, "train"), (2, "extract"), (2, "train")]
    torch.manual_seed(3)
    loader = make(data, workers=0)
    ours = [torch.cat([b.images for b in p]) for p in read(loader, passes)]
    after = torch.rand(3)
    torch.manual_seed(3)
    oracle = []
    for episode, pass_ in passes:
        items = EpisodeItems(data, sample_episode(30, 12, seed=7, episode=episode))
        per_pass = DataLoader(items, batch_size=8 if pass_ == "extract" else 4, shuffle=False, num_workers=0)
        oracle.append(torch.cat([b[0] for b in tqdm(per_pass, disable=True)]))
    assert all(torch.equal(a, b) for a, b in zip(ours, oracle))
    assert torch.equal(after, torch.rand(3))


def test_with_workers_batches_depend_on_neither_prefetch_resume_nor_worker_count():
    """Each pass read by a fresh single-worker loader of its own (nothing prefetched, nothing carried over) is
    the oracle; one two-worker loader reading the whole sequence, including a wrong prefetch guess (episode 1
    begins with the extraction pass, episode 0 did not), and a run cut after episode 1 and resumed must match it."""
    data = RandomPairs(n=30)
    passes = [(0, "train"), (1, "extract"), (1, "train"), (2, "extract"), (2, "train")]
    oracle = []
    for episode, pass_ in passes:
        fresh = make(data, workers=1)
        oracle += read(fresh, [(episode, pass_)])
        fresh.close()
    whole = make(data, workers=2)
    assert_same_batches(read(whole, passes), oracle)
    whole.close()
    first, second = make(data, workers=2), make(data, workers=2)
    cut = read(first, passes[:3])
    first.close()
    assert_same_batches(cut + read(second, passes[3:]), oracle)
    second.close()
    # the augmentation draws differ between passes and episodes (the seed key holds both)
    assert not torch.equal(oracle[1][0].images, oracle[2][0].images)


def test_the_workers_read_on_into_the_next_pass_and_restart_only_when_the_pattern_changes(tmp_path, monkeypatch):
    """With workers the passes are one stream: with one batch of episode 0's training pass taken (of three), the
    workers already read items of episode 1 (the prefetch, 2 batches x 2 workers, reaches past the pass); a run
    whose episodes keep their pattern starts one iterator, a pattern change (an episode that begins extracting, as
    PCL's after its InfoNCE-only episodes) one more; the batches are those of a loader per pass all the same."""
    import protoclip.train.loader as loader_module
    from torch.utils.data import DataLoader

    seen = tmp_path / "seen"
    seen.mkdir()
    real_seed = loader_module.seed_item

    def spy(key):  # runs in the (forked) workers: leaves "<episode>-<pass index>"
        Path(seen, f"{key[1]}-{key[2]}").touch()
        real_seed(key)
    monkeypatch.setattr(loader_module, "seed_item", spy)
    starts = []
    real_iter = DataLoader.__iter__
    monkeypatch.setattr(DataLoader, "__iter__", lambda self: starts.append(1) or real_iter(self))

    data = RandomPairs(n=30)
    loader = make(data, workers=2)
    it = iter(loader.pass_of(0, "train"))
    first = next(it)
    deadline = time.monotonic() + 60
    while not (seen / "1-1").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (seen / "1-1").exists(), sorted(p.name for p in seen.iterdir())
    passes = [(1, "train"), (2, "extract"), (2, "train")]
    got = [[first, *it]] + read(loader, passes)
    loader.close()
    assert len(starts) == 2  # (0, train) began a stream of train passes; episode 2 began extracting: a restart
    oracle = []
    for episode, pass_ in [(0, "train"), *passes]:
        fresh = make(data, workers=1)
        oracle += read(fresh, [(episode, pass_)])
        fresh.close()
    assert_same_batches(got, oracle)


def test_a_run_starts_its_workers_once_and_a_resumed_run_trains_the_same_weights(tmp_path):
    """ProtoCLIP (two passes an episode), 3 episodes, two workers: the items are read by two processes in all
    (a loader per pass would start 12); cut after episode 1 and resumed, two more start and the run ends with the
    uninterrupted run's weights and log; one worker gives the same weights too (the items seed themselves)."""
    runs = {}
    for name, workers, cut in (("full", 2, None), ("cut", 2, 2), ("one", 1, None)):
        c = tiny_config(episode_size=16, batch_size=8, epochs=1.0, num_workers=workers)  # 48 pairs: 3 episodes
        layout = Layout(tmp_path / "d", tmp_path / name)
        pids = tmp_path / f"pids-{name}"
        pids.mkdir()
        model = train(tiny_model(c), PidPairs(pids, n=48), c, layout.train_files("r"), stop_after_episodes=cut)
        segments = [sorted(pids.iterdir())]
        if cut is not None:
            torch.manual_seed(1234)  # a fresh process: the resume restores what it needs
            resumed = tmp_path / f"pids-{name}-resumed"
            resumed.mkdir()
            model = train(tiny_model(c, seed=99), PidPairs(resumed, n=48), c, layout.train_files("r"),
                          state=last_state(layout, "r", c))
            segments.append(sorted(resumed.iterdir()))
        runs[name] = (model.state_dict(), segments, read_train_log(layout.train_log("r")))
    main = str(os.getpid())
    assert [len(s) for s in runs["full"][1]] == [2] and [len(s) for s in runs["one"][1]] == [1]
    assert [len(s) for s in runs["cut"][1]] == [2, 2]
    assert all(p.name != main for _, segs, _ in runs.values() for s in segs for p in s)  # read by workers only
    full, _, log_full = runs["full"]
    for name in ("cut", "one"):
        state = runs[name][0]
        assert all(torch.equal(full[k], state[k]) for k in full), name
    assert training_records(log_full) == training_records(runs["cut"][2])
    episodes = [r for r in log_full if r["kind"] == "episode"]
    assert len(episodes) == 3 and all(r["time/data_wait"] >= 0.0 for r in episodes)
    assert "data_wait" not in PHASES  # it overlaps the phases: never summed with them
