"""Each paper's linear protocol (evaluate.protocols, metrics.linear_sgd): the optimizer and schedule it builds are
the ones its paper names, it learns separable features, the lr sweep picks on a split of train, the default
(ProtoCLIP's) protocol is the metrics.linear probe unchanged, and the config names a protocol per run."""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from protoclip.evaluate.adapters import SetInput
from protoclip.evaluate.config import EvaluateConfig
from protoclip.evaluate.tasks.linear import LinearConfig, task_linear
from protoclip.evaluate.metrics.linear import linear_probe
from protoclip.evaluate.metrics.linear_sgd import build_heads, pick_lr, sgd_protocol_probe
from protoclip.evaluate.protocols import NAMES, PROTOCOLS
from protoclip.evaluate.set_features import SetFeatures
from testkit.training import one_thread

REPO = Path(__file__).resolve().parents[2]


# tiny layers on 2 shared cores: one torch thread (several spin-wait: 20 s instead of 0.7 s per probe)
_threads = pytest.fixture(autouse=True)(one_thread)


def separable(rng, n: int, C: int = 4, d: int = 10):
    y = rng.integers(0, C, n)
    return 5.0 * np.eye(C, d)[y] + 0.3 * rng.normal(size=(n, d)), y


def lrs_at_epochs(name: str, epochs: list[float], steps_per_epoch: int = 4) -> list[float]:
    """The lr of the first head after stepping the built scheduler to each epoch (iterations, not the formula)."""
    p = PROTOCOLS[name]
    _, opt, sched = build_heads(3, 2, p, p.lrs[:1], steps_per_epoch, seed=0)
    out, done = [], 0
    for e in epochs:
        for _ in range(round(e * steps_per_epoch) - done):
            opt.step()
            sched.step()
        done = round(e * steps_per_epoch)
        out.append(opt.param_groups[0]["lr"])
    return out


def test_pcl_protocol_is_sgd_momentum_lr_10_no_weight_decay_with_step_decay():
    """pcl-protonce.txt l.388: SGD, momentum 0.9, 100 epochs, initial lr 10, weight decay 0; decay x0.1 at 60 / 80
    (not in the text: MoCo's and PCL's released code, a project choice)."""
    p = PROTOCOLS["pcl"]
    _, opt, _ = build_heads(3, 2, p, p.lrs, 1, seed=0)
    assert type(opt) is torch.optim.SGD and p.lrs == (10.0,) and p.epochs == 100
    assert opt.param_groups[0]["momentum"] == 0.9 and opt.param_groups[0]["weight_decay"] == 0.0
    assert lrs_at_epochs("pcl", [0, 59.75, 60, 79.75, 80, 99.75]) == pytest.approx([10, 10, 1, 1, 0.1, 0.1])


def test_mocov3_protocol_is_sgd_without_momentum_lr_1_cosine_with_5_warmup_epochs():
    """clip-temperature l.810-813: SGD without momentum, no weight decay, peak lr 1.0, cosine, 5 warm-up epochs,
    100 epochs. Warm-up is linear from 0; the cosine runs over the 95 epochs after it (midpoint 52.5: half)."""
    p = PROTOCOLS["mocov3"]
    _, opt, _ = build_heads(3, 2, p, p.lrs, 1, seed=0)
    assert opt.param_groups[0]["momentum"] == 0.0 and opt.param_groups[0]["weight_decay"] == 0.0
    assert p.epochs == 100 and p.lrs == (1.0,)
    got = lrs_at_epochs("mocov3", [0, 2.5, 5, 52.5, 100])
    assert got == pytest.approx([0.0, 0.5, 1.0, 0.5, 0.0], abs=1e-12)
    quarter = 5 + 95 / 4
    assert lrs_at_epochs("mocov3", [quarter])[0] == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))


def test_nclip_protocol_is_plain_sgd_with_one_head_per_swept_lr():
    """nclip-xclip.txt l.162: SGD without momentum, no weight decay, 100 epochs, a sweep of lrs with one head and
    one optimizer group each (the same cosine for every head: at half the epochs each group is at half its lr)."""
    p = PROTOCOLS["nclip"]
    assert len(p.lrs) > 1 and p.momentum == 0.0 and p.weight_decay == 0.0 and p.epochs == 100
    heads, opt, sched = build_heads(3, 2, p, p.lrs, 1, seed=0)
    assert len(heads) == len(opt.param_groups) == len(p.lrs)
    assert [g["lr"] for g in opt.param_groups] == list(p.lrs)
    for _ in range(50):
        opt.step()
        sched.step()
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([lr / 2 for lr in p.lrs])


@pytest.mark.parametrize("name", sorted(PROTOCOLS))
def test_each_protocol_learns_separable_features(name):
    rng = np.random.default_rng(0)
    x, y = separable(rng, 120)
    xt, yt = separable(rng, 60)
    m, hits = sgd_protocol_probe(x, y, xt, yt, PROTOCOLS[name], per_example=True)
    assert m["top1"] == 100.0 and m["protocol"] == name and m["epochs"] == 100
    assert hits["top1"].shape == (60,) and hits["top1"].all()


def test_random_labels_give_chance():
    rng = np.random.default_rng(1)
    x, xt = rng.normal(size=(300, 8)), rng.normal(size=(400, 8))
    m = sgd_protocol_probe(x, rng.integers(0, 4, 300), xt, rng.integers(0, 4, 400), PROTOCOLS["mocov3"])
    assert 10.0 < m["top1"] < 40.0  # chance 25 %


def test_the_sweep_picks_its_lr_on_a_split_of_train_never_on_test():
    """lrs (1e-6, 1): in 100 epochs 1e-6 leaves the N(0, 0.01) head at chance, 1 separates the classes; the pick
    is 1 whatever the test labels say (here all wrong: the test split cannot have been read to pick)."""
    rng = np.random.default_rng(2)
    x, y = separable(rng, 200)
    xt, yt = separable(rng, 50)
    p = dataclasses.replace(PROTOCOLS["nclip"], lrs=(1e-6, 1.0))
    lr, val = pick_lr(torch.from_numpy(x).float(), torch.from_numpy(y), 4, p, seed=0)
    assert lr == 1.0 and val == 100.0
    m = sgd_protocol_probe(x, y, xt, (yt + 1) % 4, p)
    assert m["lr"] == 1.0 and m["val_top1"] == 100.0 and m["top1"] == 0.0


def _feats(seed: int = 0) -> SetFeatures:
    rng = np.random.default_rng(seed)
    y = np.arange(60) % 3
    z = rng.normal(size=(60, 5)) + 1.5 * np.eye(3, 5)[y]
    return SetFeatures(test_z=z[:20], test_y=y[:20], train_z=z[20:], train_y=y[20:])


class _Set:
    classnames = ["a", "b", "c"]


def test_default_protocol_is_the_lbfgs_probe_unchanged(tmp_path):
    """ProtoCLIP's protocol (the default) gives what metrics.linear.linear_probe gives with the config's settings,
    plus the names of solver and protocol."""
    f = _feats()
    got = task_linear(SetInput(f, _Set(), EvaluateConfig(), tmp_path / "f.png"))
    want = linear_probe(f.train_z, f.train_y, f.test_z, f.test_y, seed=0, max_iter=1000, steps_per_decade=4)
    assert got.metrics == {**want, "solver": "lbfgs", "centred": True, "protocol": "protoclip"}


def test_a_run_with_a_paper_protocol_is_scored_by_it(tmp_path):
    f = _feats()
    cfg = EvaluateConfig(device="cpu", sections={"linear": LinearConfig(protocol_runs={"pcl_*": "pcl"})})
    x = SetInput(f, _Set(), cfg, tmp_path / "f.png", run="pcl_in1k")  # the run's protocol: its pattern's
    m = task_linear(x).metrics
    want = sgd_protocol_probe(f.train_z, f.train_y, f.test_z, f.test_y, PROTOCOLS["pcl"], num_classes=3)
    assert m == {**want, "solver": "sgd", "protocol": "pcl"}
    assert "C" not in m and m["lr"] == 10.0


def test_config_names_the_protocol_per_run_and_rejects_bad_names():
    cfg = LinearConfig(protocol_runs={"pcl_*": "pcl", "pauc_*": "pcl", "pt_*": "mocov3"})
    cfg.validate()
    assert [cfg.protocol_of(r) for r in ("pcl_in1k_s0", "pauc_in100", "pt_sphere_init1", "t3_clip")] == [
        "pcl", "pcl", "mocov3", "protoclip"]
    assert NAMES == ("protoclip", "pcl", "nclip", "mocov3") == ("protoclip", *PROTOCOLS)
    with pytest.raises(ValueError, match="unknown linear protocol 'moco'"):
        LinearConfig(protocol="moco").validate()
    with pytest.raises(ValueError, match=r"linear.protocol_runs\['pcl_\*'\]: unknown linear protocol 'PCL'"):
        LinearConfig(protocol_runs={"pcl_*": "PCL"}).validate()
    two = LinearConfig(protocol_runs={"pcl_*": "pcl", "*_in1k": "nclip"})
    with pytest.raises(ValueError, match="several"):
        two.protocol_of("pcl_in1k")
    with pytest.raises(ValueError, match="several"):
        EvaluateConfig(sections={"linear": two}).check_runs(["pcl_in100", "pcl_in1k"])
    # unmatched patterns: a warning naming them, not an error
    assert cfg.check_runs(["pcl_in1k", "pauc_in1k"]) == ["evaluate.linear.protocol_runs: pt_* match no run"]
    assert cfg.check_runs(["pcl_in1k", "pauc_in1k", "pt_x"]) == []


def test_the_paper_configuration_scores_each_papers_runs_under_its_own_protocol():
    from protoclip.project import load_config

    cfg = load_config(REPO / "config" / "paper.yaml")
    ev = cfg.evaluate
    assert ev.check_runs(cfg.run_names()) == []  # every pattern names runs of paper.yaml
    want = {"pcl": "pcl", "pauc": "pcl", "pm_nclip": "nclip", "pm_xclip": "nclip", "pm_clip_vitb16_s": "nclip",
            "pt_": "mocov3", "pm_clip_multi32x16": "mocov3", "pm_clip_vitb16_t5": "mocov3",
            "pm_protoclip": "protoclip", "t3_": "protoclip"}
    for run in cfg.run_names():
        prefix = max((p for p in want if run.startswith(p)), key=len, default=None)
        if prefix is not None:
            assert ev.linear.protocol_of(run) == want[prefix], run
    assert ev.linear.protocol == "protoclip"
    assert load_config(REPO / "config" / "config.yaml").evaluate.linear.protocol_runs == {}
    pcl_only = load_config(REPO / "config" / "paper_pcl.yaml")  # PCL / PAUC alone: its protocol for every run
    assert {pcl_only.evaluate.linear.protocol_of(r) for r in pcl_only.run_names()} == {"pcl"}


def test_a_diverged_head_is_never_picked_and_a_diverged_probe_stops():
    """lr 1e38 overflows float32 (loss nan): the sweep takes the other head however poor; a probe at that lr alone,
    or a sweep with no finite head, stops with one clear error instead of scoring nan weights."""
    rng = np.random.default_rng(2)
    x, y = separable(rng, 200)
    xt, yt = torch.from_numpy(x).float(), torch.from_numpy(y)
    p = dataclasses.replace(PROTOCOLS["nclip"], lrs=(1e-6, 1e38))
    assert pick_lr(xt, yt, 4, p, seed=0)[0] == 1e-6
    with pytest.raises(FloatingPointError, match="diverged at lr 1e"):
        sgd_protocol_probe(x, y, x, y, dataclasses.replace(p, lrs=(1e38,)))
    with pytest.raises(FloatingPointError, match="every head of the lr sweep diverged"):
        pick_lr(xt, yt, 4, dataclasses.replace(p, lrs=(1e38, 2e38)), seed=0)
