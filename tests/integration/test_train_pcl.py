"""``method: pcl`` (and PAUC on it) in the episodic trainer: tiny end-to-end runs, the E-step, bit-identical resume."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from protoclip.files.layout import Layout
from protoclip.files.records import read_train_log
from protoclip.train.checkpoint import load_checkpoint
from protoclip.train.config import PAUCConfig
from protoclip.train.loop import train
from protoclip.train.methods.pcl import PCLConfig, PCLMethod, cluster_counts
from testkit import REPO
from testkit.training import RandomPairs, last_state, one_thread, tiny_config, tiny_model

_threads = pytest.fixture(autouse=True)(one_thread)


class ThreeViews(torch.utils.data.Dataset):
    """RandomPairs with PCL's three views: two noisy draws (global RNG, like an augmentation) + the clean image."""

    def __init__(self, n: int = 64):
        self.base = RandomPairs(n=n)

    def __len__(self):
        return len(self.base)

    def __getitem__(self, i):
        img = self.base.images[i]
        return (img + 0.1 * torch.randn(img.shape), img + 0.1 * torch.randn(img.shape), img), self.base.tokens[i], i


def pcl_config(**kw):
    pcl = dict(tau=0.2, momentum=0.9, queue_size=40, negatives=4, num_clusters=[4, 8], infonce_only_episodes=1,
               kmeans_iters=5, kmeans_redo=2)
    pcl.update(kw.pop("pcl", {}))
    pauc = kw.pop("pauc", {})
    cfg = tiny_config(**{"method": "pcl", "episode_size": 64, "epochs": 3.0, "augmentation": "mocov2", **kw})
    return dataclasses.replace(cfg, sections={**cfg.sections, "pcl": PCLConfig(**pcl)}, pauc=PAUCConfig(**pauc))


@pytest.fixture(scope="module")
def views():
    return ThreeViews(n=64)


def test_cluster_counts_scale_with_data():
    cfg = tiny_config(method="pcl")
    assert cluster_counts(cfg, 1_280_000) == [25_000, 50_000, 100_000]  # the paper's K list on ImageNet
    assert cluster_counts(dataclasses.replace(cfg, sections={**cfg.sections, "pcl": PCLConfig(num_clusters=[3, 500])}), 100) == [3, 100]


def test_config_rejects_locked_image_and_two_view_on_protoclip():
    from protoclip.errors import ConfigError
    from protoclip.config.strict import build
    from protoclip.train.config import TrainConfig

    with pytest.raises(ConfigError, match="lock_image_epoch"):
        build(TrainConfig, {"method": "pcl"})
    with pytest.raises(ConfigError, match="two_view"):
        build(TrainConfig, {"method": "protoclip", "pauc": {"enabled": True, "align_mode": "two_view"}})


@pytest.mark.parametrize("pauc", [False, True])
def test_pcl_run_warmup_then_protonce(tmp_path, views, pauc):
    cfg = pcl_config(pauc={"enabled": pauc})
    layout = Layout(tmp_path / "d", tmp_path / "r")
    model = tiny_model(cfg)
    text_before = {k: v.clone() for k, v in model.state_dict().items() if k.startswith("clip.transformer")}
    train(model, views, cfg, layout.train_files("pcl"))
    steps = read_train_log(layout.train_log("pcl"), "step")
    eps = read_train_log(layout.train_log("pcl"), "episode")
    assert len(eps) == 3 and eps[0]["pcl_warmup"] == 1.0 and eps[1]["pcl_warmup"] == 0.0
    assert eps[1]["pcl_k0"] == 4 and eps[1]["pcl_k1"] == 8
    first = [s for s in steps if s["episode"] == 0]
    later = [s for s in steps if s["episode"] >= 1]
    assert all("protonce" not in s and "infonce" in s for s in first)  # warm-up: InfoNCE only
    assert all("protonce" in s for s in later)
    assert all(("pauc_unif" in s) == pauc for s in later)
    for s in later:  # the logged total is the weighted sum of the terms
        want = s["infonce"] + s["protonce"] + (s["pauc_align"] + s["pauc_unif"] + 0.1 * s["pauc_corr"] if pauc else 0)
        assert s["loss"] == pytest.approx(want, rel=1e-5)
    # image-only: the text tower is never updated
    for k, v in text_before.items():
        assert torch.equal(model.state_dict()[k], v), k
    state = load_checkpoint(layout.checkpoint("pcl"))
    assert set(state["extra"]["method"]) == {"key_encoder", "queue"}
    assert len(state["prototypes"]) == 2


def test_momentum_and_queue_follow_the_steps(views):
    """after_step: the key encoder moves toward the online one by (1 - m) and the batch keys are enqueued."""
    cfg = pcl_config()
    model = tiny_model(cfg)
    method = PCLMethod(cfg)
    method._setup(model, torch.device("cpu"))
    items = [views[i][0] for i in range(4)]
    images = [torch.stack([v[0] for v in items]), torch.stack([v[1] for v in items])]
    out = method.forward(model, images, None)
    assert not out["h_key"].requires_grad
    terms = method.terms(model, out, torch.arange(4), None)
    assert set(terms) == {"infonce"}
    terms["infonce"].backward()
    assert all(p.grad is None for p in method._key.parameters())  # no gradient through the key encoder
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5)
    before = [p.clone() for p in method._key.parameters()]
    method.after_step(model)
    for pk, p0, pq in zip(method._key.parameters(), before, method._online.parameters()):
        torch.testing.assert_close(pk, 0.9 * p0 + 0.1 * pq)
    torch.testing.assert_close(method._queue.queue[:4], out["h_key"])
    assert int(method._queue.ptr) == 4


def test_pcl_on_its_papers_sgd_recipe_drops_the_lr_and_resumes_exactly(tmp_path, views):
    """PCL's optimizer and schedule (pcl-protonce l.150: SGD, momentum 0.9, wd 1e-4, lr x0.1 at given epochs; here
    at epoch 2 of 3, 1 episode = 1 epoch of 64 items, 4 steps), killed after the first E-step and resumed: the same
    weights (SGD's momentum buffers are in the checkpoint) and the LR dropping at the first step of epoch 2."""
    cfg = pcl_config(optimizer="sgd", lr=0.03, momentum=0.9, weight_decay=1e-4, lr_schedule="step",
                     lr_milestones=[2.0], warmup_episodes=0)
    full = train(tiny_model(cfg), views, cfg, Layout(tmp_path / "d", tmp_path / "a").train_files("r"))
    layout = Layout(tmp_path / "d", tmp_path / "b")
    train(tiny_model(cfg), views, cfg, layout.train_files("r"), stop_after_episodes=2)
    resumed = train(tiny_model(cfg, seed=99), views, cfg, layout.train_files("r"), state=last_state(layout, "r", cfg))
    sa, sb = full.state_dict(), resumed.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    steps = read_train_log(layout.train_log("r"), "step")
    assert [s["lr"] for s in steps] == pytest.approx([0.03] * 8 + [0.003] * 4)


@pytest.mark.parametrize("pauc", [False, True])
def test_pcl_resume_is_exact(tmp_path, views, pauc):
    cfg = pcl_config(pauc={"enabled": pauc, "align_mode": "two_view" if pauc else "anchor"})
    full = train(tiny_model(cfg), views, cfg, Layout(tmp_path / "d", tmp_path / "a").train_files("r"))
    layout = Layout(tmp_path / "d", tmp_path / "b")
    train(tiny_model(cfg), views, cfg, layout.train_files("r"), stop_after_episodes=2)  # "killed" after 1st E-step
    torch.manual_seed(1234)
    resumed = train(tiny_model(cfg, seed=99), views, cfg, layout.train_files("r"), state=last_state(layout, "r", cfg))
    sa, sb = full.state_dict(), resumed.state_dict()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k
    log_a = read_train_log(tmp_path / "a" / "runs" / "r" / "train_log.jsonl", "step")
    log_b = read_train_log(layout.train_log("r"), "step")
    assert [s["loss"] for s in log_a] == [s["loss"] for s in log_b]
    qa = load_checkpoint(Layout(tmp_path / "d", tmp_path / "a").checkpoint("r"))["extra"]["method"]["queue"]
    qb = load_checkpoint(layout.checkpoint("r"))["extra"]["method"]["queue"]
    assert torch.equal(qa["queue"], qb["queue"]) and torch.equal(qa["ptr"], qb["ptr"])


def test_protoclip_with_pauc_and_phi_protonce_resumes_exactly(tmp_path):
    """The ProtoCLIP switches: PAUC on h-space and the phi-scaled cross-modal ProtoNCE; bit-identical resume."""
    pairs = RandomPairs(n=64)
    cfg = dataclasses.replace(tiny_config(method="protoclip", epochs=1.5), pauc=PAUCConfig(enabled=True))
    cfg = dataclasses.replace(cfg, loss=dataclasses.replace(cfg.loss, phi_protonce=True))
    full = train(tiny_model(cfg), pairs, cfg, Layout(tmp_path / "d", tmp_path / "a").train_files("r"))
    steps = read_train_log(tmp_path / "a" / "runs" / "r" / "train_log.jsonl", "step")
    for s in steps:
        assert {"proto", "pauc_align", "pauc_unif", "pauc_corr"} <= set(s)
        want = s["clip"] + s["proto"] + s["pauc_align"] + s["pauc_unif"] + 0.1 * s["pauc_corr"]
        assert s["loss"] == pytest.approx(want, rel=1e-5)
    eps = read_train_log(tmp_path / "a" / "runs" / "r" / "train_log.jsonl", "episode")
    assert all("phi_image_max" in e for e in eps)
    layout = Layout(tmp_path / "d", tmp_path / "b")
    train(tiny_model(cfg), pairs, cfg, layout.train_files("r"), stop_after_episodes=1)
    torch.manual_seed(1234)
    resumed = train(tiny_model(cfg, seed=99), pairs, cfg, layout.train_files("r"), state=last_state(layout, "r", cfg))
    sa, sb = full.state_dict(), resumed.state_dict()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


def test_phi_protonce_changes_the_proto_term():
    """With the switch the logged ``proto`` is PCL's phi-scaled CE, not the soft-target CE."""
    from protoclip.prototypes.episode import EpisodePrototypes
    from protoclip.train.methods.protoclip import ProtoCLIPMethod

    g = torch.Generator().manual_seed(0)
    h_i, h_t = torch.randn(32, 16, generator=g), torch.randn(32, 16, generator=g)
    ep = EpisodePrototypes.build(h_i, h_t, None, k=4, iters=3, backend="torch")
    out = {"h_image": h_i[:8], "h_text": h_t[:8], "proto_logit_scale": torch.tensor(10.0)}
    base = tiny_config(method="protoclip", loss={"clip_weight": 0.0})
    soft = ProtoCLIPMethod(base).terms(None, out, torch.arange(8), ep)["proto"]
    m = ProtoCLIPMethod(dataclasses.replace(base, loss=dataclasses.replace(base.loss, phi_protonce=True)))
    from protoclip.losses.pcl import relative_concentration

    m._phi = (relative_concentration(torch.nn.functional.normalize(h_i, dim=1), ep.cls_image, ep.text.assignments),
              relative_concentration(torch.nn.functional.normalize(h_t, dim=1), ep.cls_text, ep.image.assignments))
    hard = m.terms(None, out, torch.arange(8), ep)["proto"]
    assert float(hard) != pytest.approx(float(soft))


@pytest.mark.parametrize("run", ["pcl", "pcl_pauc", "pcl_tv"])
def test_pcl_trains_from_the_cli(tmp_path, run):
    """`protoclip train --run <pcl run>` on the fixture project of test_train_stage (PNG files, MoCo v2 views);
    ``pcl_tv`` on torchvision's ResNet-50 (placeholder tokens for the captions, model.pt without open_clip export)."""
    import yaml

    from protoclip.cli import main
    from protoclip.models import load_model
    from testkit.training import stage_project as _project

    path = _project(tmp_path, teacher=False)
    cfg = yaml.safe_load(path.read_text())
    pcl = {"method": "pcl", "teacher": None, "episode_size": 1000, "epochs": 2.0, "augmentation": "mocov2",
           "pcl": {"queue_size": 32, "negatives": 2, "num_clusters": [3, 6], "infonce_only_episodes": 1,
                   "kmeans_iters": 3, "kmeans_redo": 1}}
    cfg["runs"] = {"pcl": pcl, "pcl_pauc": {**pcl, "pauc": {"enabled": True}},
                   "pcl_tv": {**pcl, "model": "tv-resnet50", "head_hidden": 0}}
    path.write_text(yaml.safe_dump(cfg))
    assert main(["train", "--config", str(path), "--run", run]) == 0
    layout = Layout(tmp_path / "data", tmp_path / "results")
    model, saved = load_model(layout.model(run))
    assert saved["method"] == "pcl" and saved["pauc"]["enabled"] == (run == "pcl_pauc")
    assert (model.name, model.text_head is None) == (("tv-resnet50", True) if run == "pcl_tv" else ("tiny-rn", False))
    eps = read_train_log(layout.train_log(run), "episode")
    assert len(eps) == 2 and eps[1]["pcl_k1"] == 6  # 36 train pairs: one episode per epoch
    n_steps = len(read_train_log(layout.train_log(run), "step"))
    assert main(["train", "--config", str(path), "--run", run, "--resume"]) == 0  # finished: nothing to redo
    assert len(read_train_log(layout.train_log(run), "step")) == n_steps


def test_experiment_rows_share_the_offline_budget():
    from protoclip.project import load_config

    repo = REPO
    cfg = load_config(repo / "config" / "config.yaml", overrides={
        "experiments": ["experiments/methods.yaml", "experiments/methods_pcl.yaml"]})
    ref = cfg.run("methods_protoclip")  # the methods table's budget (its other rows use the tiny ViT)
    for name in ("pcl_tiny", "pcl_pauc_tiny", "protoclip_pauc_tiny"):
        run = cfg.run(name)
        assert (run.epochs, run.batch_size, run.head_hidden, run.seed, run.image_size) == (
            ref.epochs, ref.batch_size, ref.head_hidden, ref.seed, ref.image_size), name
        assert run.model == "tiny-rn", name
    assert cfg.run("pcl_pauc_tiny").pauc.enabled and cfg.run("protoclip_pauc_tiny").pauc.enabled
    paper = load_config(repo / "config" / "paper_pcl.yaml")
    run = paper.run("pcl_in1k")
    assert (run.model, run.epochs, run.batch_size, run.pcl.num_clusters, run.pcl.infonce_only_episodes) == (
        "tv-resnet50", 200.0, 256, [25000, 50000, 100000], 20)


def pcl_ddp_worker(rank: int, world: int, port: int, out_dir: str, cfg) -> None:
    """One torchrun-like rank of a tiny PCL run; dumps weights and the method state (key encoder, queue)."""
    import os

    import torch.distributed as dist

    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    torch.set_num_threads(1)
    torch.manual_seed(cfg.seed)
    model = tiny_model(cfg, seed=cfg.seed)
    layout = Layout(f"{out_dir}/data", f"{out_dir}/results")
    try:
        train(model, ThreeViews(n=32), cfg, layout.train_files("ddp"))
        state = load_checkpoint(layout.checkpoint("ddp")) if rank == 0 else None
        torch.save({"state": model.state_dict(), "ck": state}, f"{out_dir}/rank{rank}.pt")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_pcl_under_ddp_two_ranks_end_identical(tmp_path):
    import torch.multiprocessing as mp

    from testkit.training import free_port

    cfg = pcl_config(episode_size=32, batch_size=16, epochs=2.0, pauc={"enabled": True})  # global: 8 a rank
    mp.spawn(pcl_ddp_worker, args=(2, free_port(), str(tmp_path), cfg), nprocs=2, join=True)
    r0 = torch.load(tmp_path / "rank0.pt", weights_only=False)
    r1 = torch.load(tmp_path / "rank1.pt", weights_only=False)
    for k, v in r0["state"].items():
        assert torch.equal(v, r1["state"][k]), k
    ck = r0["ck"]
    assert ck["prototypes"].assignments[0].shape == (32,)  # E-step over all 32 items, gathered from both ranks
    queue = ck["extra"]["method"]["queue"]
    assert int(queue["ptr"]) == (2 * 2 * 16) % 40  # 2 episodes x 2 steps x 16 keys (8 per rank, all-gathered)
    steps = read_train_log(tmp_path / "results" / "runs" / "ddp" / "train_log.jsonl", "step")
    assert len(steps) == 4 and "protonce" in steps[-1] and "pauc_unif" in steps[-1]


@pytest.mark.parametrize("stated, drawn, other", [
    (30, 30, 20),  # r < K_min: drawn as stated (spec 4.7.5's floor(K_min / 2) = 20 would cap it)
    (16000, 39, 20),  # K_min <= r: all K_min - 1 = 39 others
])
def test_method_draws_the_stated_negative_prototypes_where_k_allows(stated, drawn, other):
    """The method's ProtoNCE equals protonce with r = ``drawn`` under the same random state, not with ``other``."""
    from protoclip.losses.pcl import Clusterings, protonce
    from protoclip.models.momentum import FeatureQueue

    ks = (40, 60)
    cfg = pcl_config(pcl={"negatives": stated, "num_clusters": list(ks)})
    method = PCLMethod(cfg)
    method._queue = FeatureQueue(8, 4, seed=0)
    g = torch.Generator().manual_seed(0)
    cl = Clusterings([torch.nn.functional.normalize(torch.randn(k, 4, generator=g), dim=1) for k in ks],
                     [torch.randint(0, k, (20,), generator=g) for k in ks], [torch.full((k,), 0.2) for k in ks])
    q, k = torch.randn(5, 4, generator=g), torch.randn(5, 4, generator=g)
    positions = torch.tensor([0, 3, 5, 11, 19])
    losses = {}
    for r in ("method", drawn, other):
        torch.manual_seed(1)
        losses[r] = float(method.terms(None, {"h_image": q, "h_key": k}, positions, cl)["protonce"] if r == "method"
                          else protonce(q, positions, cl, r)["protonce"])
    assert losses["method"] == pytest.approx(losses[drawn], rel=1e-6)
    assert losses["method"] != pytest.approx(losses[other], rel=1e-3)
    assert method.resolved(1000)["pcl"] == {"num_clusters": list(ks), "negatives_stated": stated,
                                            "negatives_drawn": drawn}


def test_a_capped_draw_is_logged_once_and_recorded(tmp_path, views, caplog):
    """K = {4, 8} on 64 items with r = 16000: a warning at the start, MLflow params ``resolved.pcl.*``, and the
    episode statistic ``pcl_negatives`` = 3 after the warm-up."""
    import logging

    from protoclip.tracking import Tracker

    class Params(Tracker):
        def __init__(self):
            self.params = []

        def log_params(self, params):
            self.params.append(params)

    cfg = pcl_config(epochs=2.0, pcl={"negatives": 16000})
    layout = Layout(tmp_path / "d", tmp_path / "r")
    tracker = Params()
    with caplog.at_level(logging.WARNING, logger="protoclip.train.methods.pcl"):
        train(tiny_model(cfg), views, cfg, layout.train_files("pcl"), tracker=tracker)
    capped = [r for r in caplog.records if "capped at 3" in r.getMessage()]
    assert len(capped) == 1
    assert [p["resolved"] for p in tracker.params] == [
        {"pcl": {"num_clusters": [4, 8], "negatives_stated": 16000, "negatives_drawn": 3}}]
    eps = read_train_log(layout.train_log("pcl"), "episode")
    assert eps[1]["pcl_negatives"] == 3.0 and "pcl_negatives" not in eps[0]


@pytest.mark.parametrize("head_hidden, pauc", [(2048, False), (0, True)])  # PCL v2's MLP head; PAUC on v1's fc
def test_pcl_on_torchvisions_resnet50(tmp_path, head_hidden, pauc):
    """``model: tv-resnet50`` (pcl-protonce.txt l.150, pauc-nemd.txt l.156) at 32 px: the run trains (ProtoNCE
    after the warm-up), its key encoder copies ResNet + head, and the saved model's evaluation features are the
    2048-d pooled features (PCL's linear protocol, l.388) with h its 128-d head output."""
    import numpy as np
    import torchvision

    from protoclip.data.loading.transforms import eval_transform
    from protoclip.evaluate.datasets.sets import ArraySplit
    from protoclip.evaluate.features import encode_images
    from protoclip.models import load_model, save_model
    from protoclip.models.model import MoCoHead

    class Views32(ThreeViews):
        def __init__(self, n: int):
            self.base = RandomPairs(n=n, image_size=32)

    cfg = pcl_config(model="tv-resnet50", image_size=32, head_hidden=head_hidden, head_out=128, episode_size=16,
                     batch_size=8, epochs=2.0, checkpoint_interval_s=1e9, pauc={"enabled": pauc})
    model = PCLMethod.build_model(cfg)
    assert type(model.clip.visual) is torchvision.models.ResNet and isinstance(model.image_head, MoCoHead)
    layout = Layout(tmp_path / "d", tmp_path / "r")
    train(model, Views32(16), cfg, layout.train_files("tv"))
    steps = read_train_log(layout.train_log("tv"), "step")
    assert len(steps) == 4 and all("protonce" in s and ("pauc_unif" in s) == pauc for s in steps[2:])
    key = load_checkpoint(layout.checkpoint("tv"))["extra"]["method"]["key_encoder"]
    assert key["encoder.visual.conv1.weight"].shape == (64, 3, 7, 7)  # torchvision ResNet stem
    assert {k for k in key if k.startswith("encoder.head.")} == {
        f"encoder.head.{k}" for k in model.image_head.state_dict()}
    path = save_model(tmp_path / "model.pt", model, {"name": "tv", "method": "pcl"},
                      eval_spec=PCLMethod.eval_spec(cfg))
    loaded, _ = load_model(path)
    split = ArraySplit(np.random.default_rng(0).integers(0, 255, (5, 40, 40, 3), dtype=np.uint8), np.arange(5) % 2)
    transform = eval_transform(loaded.image_size)
    z, h, _ = encode_images(loaded, split, transform, torch.device("cpu"), 2)
    assert z.shape == (5, 2048) and h.shape == (5, 128)
    x = torch.stack([transform(img) for img, _ in split])
    with torch.no_grad():
        pooled = torch.flatten(loaded.clip.visual.avgpool(torch.nn.Sequential(
            *list(loaded.clip.visual.children())[:-2])(x)), 1)
    np.testing.assert_allclose(z, pooled.numpy(), rtol=1e-4, atol=1e-5)
    # the evaluation's extractor (model file, eval spec): image features of a labelled set with prompt templates
    # and held-out captions; no caption text features (no text tower: retrieval / zero-shot are not applicable)
    from protoclip.evaluate.datasets.sets import CaptionSet, LabelledSet
    from protoclip.evaluate.features import FeatureExtractor

    ds = LabelledSet("toy", ["a", "b"], ["a photo of {}."], split, split,
                     captions=CaptionSet("toy pairs", split, [["x"], ["y"], ["z"], ["u"], ["v"]]))
    feats = FeatureExtractor(path, device="cpu", batch_size=2).extract(ds)
    np.testing.assert_allclose(feats.test_z, z, rtol=1e-4, atol=1e-5)
    assert feats.train_z.shape == (5, 2048) and feats.caption_image_z.shape == (5, 2048)
    assert feats.caption_text_z is None and feats.caption_text_s is None
