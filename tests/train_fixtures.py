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
                       checkpoint_interval_s=0.0,  # every episode: the resume / NaN tests stop at episode ends
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


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ddp_worker(rank: int, world: int, port: int, out_dir: str, cfg: TrainConfig) -> None:
    """One torchrun-like rank: env vars, tiny ProtoCLIP training, then dump weights + prototypes."""
    import os

    from protoclip.layout import Layout
    from protoclip.train.loop import train

    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    torch.set_num_threads(1)
    pairs = RandomPairs(n=32)
    torch.manual_seed(cfg.seed)  # same initial weights on every rank, as the stage does
    model = tiny_model(cfg, seed=cfg.seed)
    layout = Layout(f"{out_dir}/data", f"{out_dir}/results")
    import torch.distributed as dist

    try:
        train(model, pairs, cfg, layout.train_files("ddp"))
        group_after = dist.is_initialized()  # train() ends the process group
        from protoclip.train.checkpoint import load_checkpoint

        protos = load_checkpoint(layout.checkpoint("ddp"))["prototypes"] if rank == 0 else None
        torch.save({"state": model.state_dict(), "protos": protos, "group_after": group_after},
                   f"{out_dir}/rank{rank}.pt")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def global_clip_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    """Rank ``rank`` computes the trainer's DDP CLIP term on its half of a fixed batch; dumps loss and grads."""
    import os

    import torch.distributed as dist

    from protoclip.train.distributed import init_from_env
    from protoclip.train.methods.base import build_method

    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    info = init_from_env(torch.device("cpu"))
    try:
        g = torch.Generator().manual_seed(0)
        zi, zt = torch.randn(8, 5, generator=g), torch.randn(8, 5, generator=g)
        part = slice(rank * 4, (rank + 1) * 4)
        zi_r, zt_r = zi[part].clone().requires_grad_(True), zt[part].clone().requires_grad_(True)
        obj = build_method(tiny_config(method="clip"), info)
        terms = obj.terms(None, {"z_image": zi_r, "z_text": zt_r, "logit_scale": torch.tensor(10.0)}, None, None)
        terms["clip"].backward()
        torch.save({"loss": terms["clip"].detach(), "gi": zi_r.grad, "gt": zt_r.grad}, f"{out_dir}/clip{rank}.pt")
    finally:
        dist.destroy_process_group()


def global_nclip_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    """Rank ``rank`` computes L_nCLIP on its half of a fixed batch (pbar over both ranks); dumps terms and grads."""
    import os

    import torch.distributed as dist

    from protoclip.losses.nclip import NCLIPLoss
    from protoclip.train.distributed import init_from_env

    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    info = init_from_env(torch.device("cpu"))
    try:
        g = torch.Generator().manual_seed(0)
        hi, ht = torch.randn(8, 6, generator=g), torch.randn(8, 6, generator=g)
        part = slice(rank * 4, (rank + 1) * 4)
        hi_r, ht_r = hi[part].clone().requires_grad_(True), ht[part].clone().requires_grad_(True)
        loss = NCLIPLoss(0.5, 1.5, world_size=info.world_size)
        terms = loss(hi_r, ht_r)
        terms["nclip"].backward()
        torch.save({"terms": {k: v.detach() for k, v in terms.items()}, "gi": hi_r.grad, "gt": ht_r.grad,
                    "stats": loss.last_stats},
                   f"{out_dir}/nclip{rank}.pt")
    finally:
        dist.destroy_process_group()


def last_state(layout, run: str, cfg: TrainConfig):
    """The train stage's resume decision, for tests that call the loop: the run's checkpoint state when it
    continues ``cfg``, else None (protoclip.train.stage.prepare_run_dir)."""
    from protoclip.schema import to_dict
    from protoclip.train.checkpoint import resume_key, resume_point

    return resume_point(layout.checkpoint(run), resume_key(to_dict(cfg)))


def training_records(records: list[dict]) -> list[dict]:
    """A train log's records without what differs between an uninterrupted and a resumed run of one config:
    wall-clock fields (``time/*``) and the ``resume`` records of restarts."""
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in records if r["kind"] != "resume"]
