"""DDP on gloo with 2 spawned processes: identical weights on both ranks, one set of prototypes."""
from __future__ import annotations

import math

import torch
import torch.multiprocessing as mp

from protoclip.files.records import read_train_log
from testkit.training import ddp_worker, free_port, tiny_config


def test_two_ranks_gloo_end_identical(tmp_path):
    # 1 episode of all 32 items; global batch 16: each rank takes 16 items in batches of 8 -> 2 optimizer steps
    cfg = tiny_config(epochs=1.0, episode_size=32, batch_size=16)
    mp.spawn(ddp_worker, args=(2, free_port(), str(tmp_path), cfg), nprocs=2, join=True)
    r0 = torch.load(tmp_path / "rank0.pt", weights_only=False)
    r1 = torch.load(tmp_path / "rank1.pt", weights_only=False)
    for k, v in r0["state"].items():  # parameters and BatchNorm buffers
        assert torch.equal(v, r1["state"][k]), k
    steps = read_train_log(tmp_path / "results" / "runs" / "ddp" / "train_log.jsonl", "step")
    assert len(steps) == 2 and all(math.isfinite(s["loss"]) and math.isfinite(s["proto"]) for s in steps)
    start = read_train_log(tmp_path / "results" / "runs" / "ddp" / "train_log.jsonl", "start")[0]
    assert start["schedule"]["world_size"] == 2 and start["schedule"]["steps_per_episode"] == 2
    assert start["schedule"]["per_rank_batch"] == 8 and start["schedule"]["global_batch"] == 16
    protos = r0["protos"]
    # k-means ran once on the gathered features of all 32 episode items (rank 0) and was broadcast
    assert protos.image.assignments.shape == (32,) and int(protos.image.sizes.sum()) == 32
    assert not r0["group_after"] and not r1["group_after"]  # the process group ended with the training
    # each rank drew its own augmentation noise (RandomPairs: the global torch RNG), from its own seed; the
    # checkpoint holds both ranks' streams, rank 0's being the run seed's (the 1-process stream)
    from protoclip.train.checkpoint import load_checkpoint
    from protoclip.train.distributed import rank_seed

    ckpt = load_checkpoint(tmp_path / "results" / "runs" / "ddp" / "checkpoints" / "last.pt")
    rng0, rng1 = ckpt["extra"]["rng_ranks"]
    assert torch.equal(rng0["torch"], ckpt["rng"]["torch"]) and not torch.equal(rng0["torch"], rng1["torch"])
    assert rank_seed(cfg.seed, 0) == cfg.seed and len({rank_seed(cfg.seed, r) for r in range(8)}) == 8


def test_rank_seeding_leaves_a_one_process_run_unchanged(tmp_path, monkeypatch):
    """One process: the same weights with the per-rank seeding and without it (the code before it)."""
    from protoclip.files.layout import Layout
    from protoclip.train import loop
    from testkit.training import RandomPairs, tiny_model

    cfg = tiny_config(epochs=1.0, episode_size=32, batch_size=16)

    def once(root):
        torch.manual_seed(cfg.seed)
        return loop.train(tiny_model(cfg, seed=cfg.seed), RandomPairs(n=32), cfg,
                          Layout(root / "d", root / "r").train_files("one")).state_dict()

    torch.set_num_threads(1)
    with_seeding = once(tmp_path / "a")
    monkeypatch.setattr(loop, "seed_rank", lambda *a: None)
    monkeypatch.setattr(loop, "restore_rank_rng", lambda *a: None)
    without = once(tmp_path / "b")
    assert all(torch.equal(with_seeding[k], without[k]) for k in with_seeding)
    # ... while a rank 1 seeded so draws another stream than rank 0's
    from protoclip.train.distributed import DistInfo, seed_rank

    torch.manual_seed(cfg.seed)
    seed_rank(cfg.seed, DistInfo(rank=1, world_size=2))
    other = torch.rand(4)
    torch.manual_seed(cfg.seed)
    seed_rank(cfg.seed, DistInfo(rank=0, world_size=2))
    assert not torch.equal(other, torch.rand(4))


def test_ddp_clip_term_is_the_global_batch_loss(tmp_path):
    """Each rank's L_CLIP equals the single-process loss of the concatenated batch; the gradient reaching the
    local features is world x the single-process one (DDP's averaging then divides by world)."""
    from protoclip.losses.clip import clip_loss
    from testkit.training import global_clip_worker

    mp.spawn(global_clip_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    g = torch.Generator().manual_seed(0)
    zi, zt = torch.randn(8, 5, generator=g).requires_grad_(True), torch.randn(8, 5, generator=g).requires_grad_(True)
    oracle = clip_loss(zi, zt, torch.tensor(10.0))["clip"]
    oracle.backward()
    for r in range(2):
        got = torch.load(tmp_path / f"clip{r}.pt")
        torch.testing.assert_close(got["loss"], oracle.detach())
        torch.testing.assert_close(got["gi"], 2 * zi.grad[r * 4:(r + 1) * 4])
        torch.testing.assert_close(got["gt"], 2 * zt.grad[r * 4:(r + 1) * 4])
