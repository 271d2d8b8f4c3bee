"""Tiny fixtures shared by the training tests: in-memory data and configs, and :func:`tiny_project`, the one
on-disk project (a prepared manifest of PNGs + config.yaml) the stage, tracking, kill and torchrun tests train.
No network."""
from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import numpy as np
import torch
import yaml
from PIL import Image
from torch.utils.data import Dataset

from protoclip.data.loading.manifest import Pair, to_frame, write_manifest
from protoclip.files.layout import Layout
from protoclip.config.strict import deep_merge
from protoclip.train.config import KMeansConfig, LossConfig, TrainConfig
from protoclip.train.methods.base import method_class

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


class PilPairs(Dataset):
    """n random RGB images of assorted sizes with captions, through ``transform``; ``worker_normalise`` turns each
    uint8 view into the float one in the worker (the float pipeline)."""

    def __init__(self, transform, n: int = 64, worker_normalise: bool = False, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.images = [Image.fromarray(rng.integers(0, 256, (int(rng.integers(40, 90)), int(rng.integers(40, 90)), 3),
                                                    dtype=np.uint8)) for _ in range(n)]
        self.tokens = _tokenizer()([" ".join(rng.choice(WORDS, size=3)) for _ in range(n)])
        self.transform, self.worker_normalise = transform, worker_normalise

    def __len__(self) -> int:
        return len(self.images)

    def _float(self, x: torch.Tensor) -> torch.Tensor:
        from protoclip.data.loading.transforms import normalize_batch

        return normalize_batch(x[None])[0] if self.worker_normalise else x

    def __getitem__(self, i: int):
        x = self.transform(self.images[i])
        x = tuple(self._float(v) for v in x) if isinstance(x, tuple) else self._float(x)
        return x, self.tokens[i], f"s{i:04d}"


def _tokenizer():
    from protoclip.models import get_tokenizer

    return get_tokenizer("tiny-rn")


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


def set_rank_env(rank: int, world: int, port: int) -> None:
    """The variables torchrun gives rank ``rank`` of ``world`` on this host."""
    import os

    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})


def ddp_worker(rank: int, world: int, port: int, out_dir: str, cfg: TrainConfig) -> None:
    """One torchrun-like rank: env vars, tiny ProtoCLIP training, then dump weights + prototypes."""

    from protoclip.files.layout import Layout
    from protoclip.train.loop import train

    set_rank_env(rank, world, port)
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

    import torch.distributed as dist

    from protoclip.train.distributed import init_from_env
    from protoclip.train.methods.base import build_method

    set_rank_env(rank, world, port)
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
        dist.barrier()  # as the trainer does: no rank tears gloo down while the other still talks to it
    finally:
        dist.destroy_process_group()


def global_nclip_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    """Rank ``rank`` computes L_nCLIP on its half of a fixed batch (pbar over both ranks); dumps terms and grads."""

    import torch.distributed as dist

    from protoclip.losses.nclip import NCLIPLoss
    from protoclip.train.distributed import init_from_env

    set_rank_env(rank, world, port)
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
        dist.barrier()  # as global_clip_worker
    finally:
        dist.destroy_process_group()


def last_state(layout, run: str, cfg: TrainConfig):
    """The train stage's resume decision, for tests that call the loop: the run's checkpoint state when it
    continues ``cfg``, else None (protoclip.train.stage.prepare_run_dir)."""
    from protoclip.config.strict import to_dict
    from protoclip.train.checkpoint import resume_key, resume_point

    return resume_point(layout.checkpoint(run), resume_key(to_dict(cfg)))


def training_records(records: list[dict]) -> list[dict]:
    """A train log's records without what differs between an uninterrupted and a resumed run of one config:
    wall-clock fields (``time/*``) and the ``resume`` records of restarts."""
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in records if r["kind"] != "resume"]


def write_pairs(layout: Layout, *, n: int, heldout: int = 0, size: int = 64, images: str = "noise",
                captions: str = "words", labels: list[str] | None = None, seed: int = 0) -> list[Pair]:
    """``n`` image-caption pairs as ``protoclip prepare`` leaves them: PNGs of ``size`` px under
    ``<prepared>/images/tuxpaint/`` and the manifest (source ``tuxpaint``, ids ``tux-<i>``, each image's real sha256,
    the last ``heldout`` rows held out), drawn from one seeded stream. ``images``: "noise" (uniform noise),
    "colour" (one random colour) or "gray" (grey level 15 i); ``captions``: "words" (three of :data:`WORDS`, drawn
    after each image) or "numbered" ("picture number <i>"); ``labels``: coarse labels, row i gets
    ``labels[i % len(labels)]`` (none: empty)."""
    rng = np.random.default_rng(seed)
    img_dir = layout.prepared / "images" / "tuxpaint"
    img_dir.mkdir(parents=True, exist_ok=True)
    pairs = []
    for i in range(n):
        if images == "noise":
            img = Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8))
        elif images == "colour":
            img = Image.new("RGB", (size, size), tuple(int(c) for c in rng.integers(0, 255, 3)))
        else:
            img = Image.fromarray(np.full((size, size, 3), 15 * i, dtype=np.uint8))
        img.save(img_dir / f"{i}.png")
        caption = " ".join(rng.choice(WORDS, 3)) if captions == "words" else f"picture number {i}"
        pairs.append(Pair(id=f"tux-{i}", path=f"images/tuxpaint/{i}.png", caption=caption, source="tuxpaint",
                          label=labels[i % len(labels)] if labels else "",
                          sha256=hashlib.sha256((img_dir / f"{i}.png").read_bytes()).hexdigest(),
                          split="heldout" if i >= n - heldout else "train"))
    write_manifest(to_frame(pairs), layout.manifest)
    return pairs


def tiny_project(root: Path, config: dict, *, teacher: str | None = None, relative: bool = False,
                 config_name: str = "config.yaml", **pairs) -> Path:
    """A project under ``root`` as ``protoclip prepare`` leaves it (:func:`write_pairs` with ``pairs``, once: an
    existing manifest is kept) and its config file ``root/config_name`` (returned): ``config`` over the paths
    (absolute, or relative to ``root`` with ``relative``), an MLflow store under ``root`` and
    ``prepare.offline_sources: [tuxpaint]``. ``teacher``: a cache of that name with 8-d random features (its
    ids in reverse manifest order)."""
    layout = Layout(root / "data", root / "results")
    if not layout.manifest.exists():
        made = write_pairs(layout, **pairs)
        if teacher:
            ids = np.array([p.id for p in made][::-1])  # the cache's order differs from the manifest's
            feats = np.random.default_rng(1).standard_normal((len(made), 8)).astype(np.float32)
            layout.teacher_features(teacher).parent.mkdir(parents=True, exist_ok=True)
            np.savez(layout.teacher_features(teacher), ids=ids, features=feats)
    base = Path("data") if relative else root / "data"
    store = "sqlite:///results/mlflow.db" if relative else f"sqlite:///{root}/mlflow.db"
    defaults = {"paths": {"data_dir": str(base), "results_dir": str(base.parent / "results"), "mlflow_uri": store,
                          "mlflow_experiment": "test"},
                "prepare": {"offline_sources": ["tuxpaint"]}}
    path = root / config_name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(deep_merge(defaults, config)))
    return path


# a CLIP run of tiny-rn at 32 px on the offline pairs, one epoch in episodes of 16: what a `protoclip train` subprocess
# of the end-to-end tests trains in seconds
TINY_CLIP_RUN = {"method": "clip", "teacher": None, "model": "tiny-rn", "head_hidden": 32, "head_out": 16,
                 "epochs": 1.0, "episode_size": 16, "batch_size": 8, "warmup_episodes": 1, "lock_image_epoch": None,
                 "num_workers": 0, "device": "cpu", "data": ["offline"], "image_size": 32}


STAGE_RUN = {"model": "tiny-rn", "head_hidden": 32, "head_out": 16, "epochs": 1.0, "episode_size": 32,
       "batch_size": 16, "warmup_episodes": 1, "lock_image_epoch": None, "num_workers": 0, "device": "cpu",
       "kmeans": {"backend": "torch", "images_per_prototype": 4, "iters": 3}}


def stage_project(tmp_path: Path, n: int = 40, teacher: bool = True) -> Path:
    """``n`` random PNGs (4 held out), the 8-d cache of 'toy-teacher' (unless ``teacher`` is false), runs 'proto'
    (ProtoCLIP with the teacher) and 'clip'."""
    return tiny_project(tmp_path, {"teacher": {"name": "toy-teacher", "pca_dim": 8}, "train": STAGE_RUN,
                                   "runs": {"proto": {"method": "protoclip", "teacher": "toy-teacher"},
                                            "clip": {"method": "clip", "teacher": None}}},
                        n=n, heldout=4, teacher="toy-teacher" if teacher else None)


NEW_METHODS = {  # the tiny settings of each new method
    "nclip": dict(method="nclip", model="tiny-vit", head_hidden=16, head_out=32),
    "xclip": dict(method="xclip", model="tiny-vit", head_hidden=16, head_out=32),
    "multitoken": dict(method="clip", model="tiny-vit-mt", class_tokens=4, loss={"distance": "ps_negtrace"}),
}


def method_config(name: str, **kw):
    spec = dict(NEW_METHODS[name])
    loss = {**spec.pop("loss", {}), **kw.pop("loss", {})}
    return tiny_config(**spec, **kw, loss=loss)


def method_model(cfg, seed: int = 0):
    torch.manual_seed(seed)
    return method_class(cfg.method).build_model(cfg)
