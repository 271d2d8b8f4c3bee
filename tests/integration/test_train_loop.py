"""End-to-end tiny runs of the episodic trainer: CLIP, NaN stop, resume equivalence, optimizer groups."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from protoclip.files.layout import Layout
from protoclip.files.records import read_train_log
from protoclip.train.checkpoint import load_checkpoint
from protoclip.train.loop import NonFiniteLossError, build_optimizer, train
from protoclip.train.methods.clip import CLIPMethod
from testkit.training import RandomPairs, last_state, one_thread, tiny_config, tiny_model, training_records

_threads = pytest.fixture(autouse=True)(one_thread)


@pytest.fixture(scope="module")
def pairs():
    return RandomPairs(n=64)


def test_optimizer_weight_decay_groups():
    cfg = tiny_config(weight_decay=0.5)
    model = tiny_model(cfg)
    opt = build_optimizer(model, cfg)
    names = {id(p): n for n, p in model.named_parameters()}
    seen = set()
    for g in opt.param_groups:
        for p in g["params"]:
            n = names[id(p)]
            seen.add(n)
            no_decay = p.ndim < 2 or n.startswith(("image_head.", "text_head."))
            assert g["weight_decay"] == (0.0 if no_decay else 0.5), n
            assert g["name"].startswith("image") == n.startswith("clip.visual."), n
    assert seen == set(names.values())  # every trainable parameter is optimised exactly once
    for temp in ("clip.logit_scale", "proto_logit_scale"):
        group = next(g for g in opt.param_groups if any(names[id(p)] == temp for p in g["params"]))
        assert group["weight_decay"] == 0.0
    assert opt.defaults["betas"] == (0.9, 0.999) and opt.defaults["eps"] == 1e-8


def test_sgd_is_torch_sgd_with_coupled_weight_decay_on_the_decay_groups():
    """optimizer: sgd (PCL / MoCo): torch.optim.SGD, momentum 0.9, no Nesterov or dampening, the AdamW groups; the
    first update is p - lr * (g + wd * p) on a decayed weight and p - lr * g on a temperature (no decay)."""
    cfg = tiny_config(optimizer="sgd", lr=0.03, momentum=0.9, weight_decay=1e-4)
    model = tiny_model(cfg)
    opt = build_optimizer(model, cfg)
    assert isinstance(opt, torch.optim.SGD) and not isinstance(opt, torch.optim.AdamW)
    assert (opt.defaults["momentum"], opt.defaults["nesterov"], opt.defaults["dampening"]) == (0.9, False, 0)
    adamw = build_optimizer(model, tiny_config(weight_decay=1e-4))
    assert [(g["name"], g["weight_decay"], len(g["params"])) for g in opt.param_groups] == [
        (g["name"], g["weight_decay"], len(g["params"])) for g in adamw.param_groups]
    named = dict(model.named_parameters())
    w, t = named["clip.visual.conv1.weight"], named["clip.logit_scale"]
    before = {n: p.detach().clone() for n, p in named.items()}
    for p in named.values():
        p.grad = torch.full_like(p, 0.5)
    opt.step()
    w0 = before["clip.visual.conv1.weight"]
    assert torch.allclose(w, w0 - 0.03 * (0.5 + 1e-4 * w0))
    assert torch.allclose(t, before["clip.logit_scale"] - 0.03 * 0.5)


def test_sgd_with_step_decay_trains_and_logs_the_dropped_lr(tmp_path, pairs):
    """A tiny CLIP run with PCL's optimizer and schedule shape: lr x0.1 from epoch 1 (64 items in episodes of 32,
    batch 16: 4 steps per epoch), no warm-up."""
    cfg = tiny_config(method="clip", optimizer="sgd", lr=0.03, lr_schedule="step", lr_milestones=[1.0],
                      warmup_episodes=0, weight_decay=1e-4)
    layout = Layout(tmp_path / "data", tmp_path / "results")
    train(tiny_model(cfg), pairs, cfg, layout.train_files("sgd"))
    steps = read_train_log(layout.train_log("sgd"), "step")
    assert [s["lr"] for s in steps] == pytest.approx([0.03] * 4 + [0.003] * 4)
    assert all(math.isfinite(s["loss"]) for s in steps)
    assert isinstance(load_checkpoint(layout.checkpoint("sgd"))["optimizer"]["state"][0]["momentum_buffer"],
                      torch.Tensor)


def test_a_steps_budget_stops_inside_the_last_episode(tmp_path, pairs):
    """steps: 5 at 2 steps per episode: 3 episodes are drawn, the third cut after one step; the cosine runs over
    the 5 steps (train.schedule)."""
    cfg = tiny_config(method="clip", steps=5, warmup_steps=1)
    layout = Layout(tmp_path / "data", tmp_path / "results")
    train(tiny_model(cfg), pairs, cfg, layout.train_files("budget"))
    steps = read_train_log(layout.train_log("budget"), "step")
    episodes = read_train_log(layout.train_log("budget"), "episode")
    assert [s["step"] for s in steps] == list(range(5)) and [e["n_steps"] for e in episodes] == [2, 2, 1]
    start = read_train_log(layout.train_log("budget"), "start")[0]["schedule"]
    assert (start["n_episodes"], start["total_steps"], start["warmup_steps"]) == (3, 5, 1)
    expect = [cfg.lr] + [0.5 * (1 + math.cos(math.pi * k / 4)) * cfg.lr for k in range(4)]  # 1 warm-up step
    assert [s["lr"] for s in steps] == pytest.approx(expect)
    assert load_checkpoint(layout.checkpoint("budget"))["step"] == 5


def test_clip_run_logs_every_term(tmp_path, pairs):
    cfg = tiny_config(method="clip")
    model = tiny_model(cfg)
    layout = Layout(tmp_path / "data", tmp_path / "results")
    train(model, pairs, cfg, layout.train_files("clip"))
    steps = read_train_log(layout.train_log("clip"), "step")
    episodes = read_train_log(layout.train_log("clip"), "episode")
    assert len(episodes) == 4 and len(steps) == 8  # 2 epochs * 64 / 32 episodes, 32 / 16 steps each
    assert [s["step"] for s in steps] == list(range(8))
    for s in steps:
        assert {"clip", "loss", "lr", "image_lr", "tau_clip", "grad_norm"} <= set(s)
        assert "proto" not in s and math.isfinite(s["loss"])
        assert s["loss"] == pytest.approx(s["clip"])  # clip_weight 1, no other term
        assert 0.01 <= s["tau_clip"] <= 1.0
    # warm-up over one episode (2 steps): lr = base * (step + 1) / 2
    assert steps[0]["lr"] == pytest.approx(cfg.lr / 2) and steps[1]["lr"] == pytest.approx(cfg.lr)
    assert "time/kmeans" not in episodes[0] and episodes[0]["time/train"] > 0  # CLIP: no extraction/clustering
    assert (layout.run_dir("clip") / "config.yaml").exists()
    assert read_train_log(layout.train_log("clip"), "start")[0]["provenance"]["seed"] == "0"
    ck = load_checkpoint(layout.checkpoint("clip"))
    assert ck["episode"] == 4 and ck["step"] == 8


def test_clip_loss_decreases_on_fixed_batch(tmp_path, pairs):
    """Memorising 32 pairs: the mean CLIP loss of the last episode is below the first one's."""
    cfg = tiny_config(method="clip", epochs=6.0, episode_size=32, lr=2e-3)
    layout = Layout(tmp_path / "d", tmp_path / "r")
    small = torch.utils.data.Subset(pairs, range(32))
    train(tiny_model(cfg), small, cfg, layout.train_files("dec"))
    eps = read_train_log(layout.train_log("dec"), "episode")
    assert eps[-1]["mean/clip"] < eps[0]["mean/clip"]


def test_locked_image_tuning_freezes_image_encoder(tmp_path, pairs):
    cfg = tiny_config(method="clip", lock_image_epoch=1.0, weight_decay=0.0)
    model = tiny_model(cfg)
    layout = Layout(tmp_path / "d", tmp_path / "r")
    # stop after 2 episodes = 1 epoch, then snapshot, then the remaining episodes must not move f^I
    train(model, pairs, cfg, layout.train_files("lit"), stop_after_episodes=2)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    train(model, pairs, cfg, layout.train_files("lit"), state=last_state(layout, "lit", cfg))
    steps = read_train_log(layout.train_log("lit"), "step")
    assert all(s["image_lr"] == 0.0 for s in steps if s["epoch"] >= 1.0)
    assert all(s["lr"] > 0 for s in steps)
    for n, p in model.named_parameters():
        if n.startswith("clip.visual.") and not n.endswith(("running_mean", "running_var")):
            assert torch.equal(p, before[n]), n
    assert not torch.equal(model.clip.token_embedding.weight, before["clip.token_embedding.weight"])


def test_nan_stops_with_step_and_term_and_keeps_checkpoint(tmp_path, pairs, monkeypatch):
    cfg = tiny_config(method="clip")
    layout = Layout(tmp_path / "d", tmp_path / "r")
    real = CLIPMethod.terms
    calls = {"n": 0}

    def poisoned(self, model, out, positions, prototypes):
        terms = real(self, model, out, positions, prototypes)
        calls["n"] += 1
        if calls["n"] == 4:  # step 3 = second step of episode 1 (episode 0 checkpointed)
            terms["clip"] = terms["clip"] * float("nan")
        return terms

    monkeypatch.setattr(CLIPMethod, "terms", poisoned)
    with pytest.raises(NonFiniteLossError, match=r"step 3 \(episode 1\).*'clip'"):
        train(tiny_model(cfg), pairs, cfg, layout.train_files("nan"))
    ck = load_checkpoint(layout.checkpoint("nan"))
    assert ck["episode"] == 1 and ck["step"] == 2
    assert all(torch.isfinite(v).all() for v in ck["model"].values() if v.is_floating_point())


def _assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


@pytest.mark.parametrize("method", ["clip", "protoclip"])
def test_resume_is_exact(tmp_path, pairs, method):
    cfg = tiny_config(method=method, epochs=1.5)  # 3 episodes; killed after the first
    full = train(tiny_model(cfg), pairs, cfg, Layout(tmp_path / "d", tmp_path / "a").train_files("r"))
    layout = Layout(tmp_path / "d", tmp_path / "b")
    train(tiny_model(cfg), pairs, cfg, layout.train_files("r"), stop_after_episodes=1)  # "killed" after ep 0
    torch.manual_seed(1234)  # a fresh process would have a different RNG state: resume must restore it
    state = last_state(layout, "r", cfg)
    before = {"keys": set(state), "episode": state["episode"], "step": state["step"],
              "model": {k: v.clone() for k, v in state["model"].items()}}
    resumed = train(tiny_model(cfg, seed=99), pairs, cfg, layout.train_files("r"), state=state)
    _assert_same_weights(full, resumed)
    # the caller's state is read, not emptied or changed
    assert set(state) == before["keys"] and (state["episode"], state["step"]) == (before["episode"], before["step"])
    assert all(torch.equal(v, before["model"][k]) for k, v in state["model"].items())
    # the log: every step and episode once, as the uninterrupted run's but for wall-clock fields and the restart
    log_a = read_train_log(tmp_path / "a" / "runs" / "r" / "train_log.jsonl")
    log_b = read_train_log(layout.train_log("r"))
    assert [r["episode"] for r in log_b if r["kind"] == "resume"] == [1]
    assert training_records(log_a) == training_records(log_b) and len(training_records(log_b)) == 1 + 6 + 3
    assert layout.train_log("r").read_bytes() == layout.train_log_work("r").read_bytes()


def _teacher(pairs, dim: int = 8):
    g = torch.Generator().manual_seed(5)
    return torch.randn(len(pairs), dim, generator=g).numpy()  # rows aligned with the data set


def test_protoclip_run_with_teacher_logs_all_terms(tmp_path, pairs):
    cfg = tiny_config(loss={"external_weight": 1.0, "proto_weight": 0.5}, teacher="random")
    layout = Layout(tmp_path / "d", tmp_path / "r")
    train(tiny_model(cfg), pairs, cfg, layout.train_files("p"), teacher=_teacher(pairs))
    steps = read_train_log(layout.train_log("p"), "step")
    assert len(steps) == 8
    for s in steps:
        for key in ("clip", "proto", "proto_external", "tau_clip", "tau_proto", "acc_i2t", "acc_i2ext"):
            assert math.isfinite(s[key]), key
        assert s["loss"] == pytest.approx(s["clip"] + 0.5 * s["proto"] + s["proto_external"], rel=1e-5)
    eps = read_train_log(layout.train_log("p"), "episode")
    for e in eps:
        assert e["k"] == 8  # m // images_per_prototype = 32 // 4
        assert e["kmeans_image_size_min"] >= 0 and e["kmeans_text_size_max"] <= 32
        assert e["kmeans_image_size_mean"] == pytest.approx(32 / 8)
        assert e["kmeans_external_objective"] >= 0 and e["time/extract"] > 0 and e["time/kmeans"] > 0
    ck = load_checkpoint(layout.checkpoint("p"))
    assert ck["prototypes"].external is not None  # last prototypes kept for inspection / resume


def test_ablation_switches_reach_the_prototypes(tmp_path, pairs):
    """No PBT, hard targets, random prototypes, tau_y, images per prototype: one episode, then inspect."""
    cfg = tiny_config(epochs=0.5, kmeans={"init": "random", "images_per_prototype": 8},
                      loss={"pbt": False, "soft_targets": False, "tau_y": 0.05, "clip_weight": 0.0})
    layout = Layout(tmp_path / "d", tmp_path / "r")
    train(tiny_model(cfg), pairs, cfg, layout.train_files("abl"))
    p = load_checkpoint(layout.checkpoint("abl"))["prototypes"]
    assert (p.pbt, p.soft_targets, p.tau_y) == (False, False, 0.05)
    assert p.image.centroids.shape[0] == 32 // 8 and p.external is None
    assert torch.equal(p.cls_image, p.text.centroids)  # without PBT the raw text prototypes classify h^I
    steps = read_train_log(layout.train_log("abl"), "step")
    assert all(s["loss"] == pytest.approx(s["proto"]) for s in steps)  # Proto only: clip_weight 0


def test_log_every_thins_step_lines_but_not_episode_means(tmp_path, pairs):
    cfg = tiny_config(method="clip", epochs=1.0, log_every=3)
    layout = Layout(tmp_path / "d", tmp_path / "r")
    train(tiny_model(cfg), pairs, cfg, layout.train_files("le"))
    assert [s["step"] for s in read_train_log(layout.train_log("le"), "step")] == [0, 3]
    assert [e["n_steps"] for e in read_train_log(layout.train_log("le"), "episode")] == [2, 2]


@pytest.mark.parametrize("bad", [{"lr": 0.0}, {"log_every": 0}, {"loss": {"tau_y": 0.0}},
                                 {"kmeans": {"images_per_prototype": 0}}, {"loss": {"clip_weight": -1.0}}])
def test_config_validation_rejects(bad):
    from protoclip.errors import ConfigError
    from protoclip.config.strict import build, to_dict
    from protoclip.train.config import TrainConfig

    data = to_dict(tiny_config())
    for k, v in bad.items():
        data[k] = {**data[k], **v} if isinstance(v, dict) else v
    with pytest.raises(ConfigError):
        build(TrainConfig, data, "test.yaml")


def test_resume_with_changed_config_retrains_from_scratch(tmp_path, pairs):
    cfg = tiny_config(method="clip", epochs=1.0)
    layout = Layout(tmp_path / "d", tmp_path / "r")
    train(tiny_model(cfg), pairs, cfg, layout.train_files("chg"))
    assert load_checkpoint(layout.checkpoint("chg"))["episode"] == 2  # finished
    # a settings-only change (workers, logging) still resumes: nothing left to do, no new step lines
    settings = tiny_config(method="clip", epochs=1.0, log_every=2)
    train(tiny_model(cfg), pairs, settings, layout.train_files("chg"), state=last_state(layout, "chg", settings))
    assert len(read_train_log(layout.train_log("chg"), "step")) == 4
    changed = tiny_config(method="clip", epochs=1.0, lr=5e-4)
    train(tiny_model(changed), pairs, changed, layout.train_files("chg"), state=last_state(layout, "chg", changed))
    steps = read_train_log(layout.train_log("chg"), "step")
    assert [s["step"] for s in steps] == [0, 1, 2, 3]  # retrained, log restarted
    assert steps[1]["lr"] == pytest.approx(5e-4)


def test_non_finite_gradient_stops_before_the_update(tmp_path, pairs, monkeypatch):
    cfg = tiny_config(method="clip", epochs=0.5)
    layout = Layout(tmp_path / "d", tmp_path / "r")
    real = CLIPMethod.terms

    def inf_grad(self, model, out, positions, prototypes):
        terms = real(self, model, out, positions, prototypes)
        terms["clip"].register_hook(lambda g: g * float("inf"))  # finite value, infinite gradient
        return terms

    model = tiny_model(cfg)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    monkeypatch.setattr(CLIPMethod, "terms", inf_grad)
    with pytest.raises(NonFiniteLossError, match=r"gradient norm at step 0 \(episode 0\)"):
        train(model, pairs, cfg, layout.train_files("g"))
    for k, v in model.state_dict().items():
        if v.is_floating_point() and "running_" not in k:
            assert torch.equal(v, before[k]), k  # the optimizer never stepped


def _poison_after_update(monkeypatch, at_call: int):
    """Make the ``at_call``-th optimizer update (0-based) write a NaN into a weight, after the loss and
    gradient checks have passed: what a broken update does that no loss check sees."""
    real = CLIPMethod.after_step  # runs right after each optimizer.step()
    calls = {"n": 0}

    def after_step(self, model):
        real(self, model)
        if calls["n"] == at_call:
            with torch.no_grad():
                next(p for n, p in model.named_parameters() if n.startswith("text_head"))[0].fill_(float("nan"))
        calls["n"] += 1
    monkeypatch.setattr(CLIPMethod, "after_step", after_step)


def test_non_finite_weights_are_never_saved_as_a_good_checkpoint(tmp_path, pairs, monkeypatch):
    from protoclip.train.checkpoint import NonFiniteStateError

    # episodes of a single step (episode 16 = batch 16): the loss check of a step runs before its update,
    # so only a check of the weights themselves can stop a broken update from being checkpointed
    cfg = tiny_config(method="clip", episode_size=16, epochs=1.0)
    layout = Layout(tmp_path / "d", tmp_path / "r")
    _poison_after_update(monkeypatch, at_call=2)  # the update of step 2 = episode 2
    with pytest.raises(NonFiniteStateError, match=r"parameter 'text_head\..*' after step 2 \(episode 2\); "
                                                  r"checkpoint not saved; stopped, last good checkpoint kept at "):
        train(tiny_model(cfg), pairs, cfg, layout.train_files("w"))
    ck = load_checkpoint(layout.checkpoint("w"))
    assert ck["episode"] == 2 and ck["step"] == 2
    assert all(torch.isfinite(v).all() for v in ck["model"].values() if v.is_floating_point())


def test_non_finite_weights_in_the_first_episode_say_no_checkpoint_exists(tmp_path, pairs, monkeypatch):
    from protoclip.train.checkpoint import NonFiniteStateError

    cfg = tiny_config(method="clip", episode_size=16, epochs=1.0)
    layout = Layout(tmp_path / "d", tmp_path / "r")
    _poison_after_update(monkeypatch, at_call=0)
    with pytest.raises(NonFiniteStateError) as err:
        train(tiny_model(cfg), pairs, cfg, layout.train_files("w0"))
    msg = str(err.value)
    assert "after step 0 (episode 0)" in msg and "no checkpoint was written yet" in msg and "kept" not in msg
    assert not layout.checkpoint("w0").exists()


def test_check_state_finite_names_optimizer_state(tmp_path):
    from protoclip.train.checkpoint import NonFiniteStateError, check_state_finite

    cfg = tiny_config(method="clip")
    model = tiny_model(cfg)
    opt = build_optimizer(model, cfg)
    check_state_finite(model, opt, step=0, episode=0, checkpoint=tmp_path / "none.pt")  # fresh: fine
    p = next(model.parameters())
    p.grad = torch.ones_like(p)
    opt.step()
    opt.state[p]["exp_avg_sq"][...] = float("inf")
    with pytest.raises(NonFiniteStateError, match=r"optimizer state 'exp_avg_sq' of '[a-z_.]+' after step 5 "
                                                  r"\(episode 1\).*no checkpoint was written yet"):
        check_state_finite(model, opt, step=5, episode=1, checkpoint=tmp_path / "none.pt")
    (tmp_path / "last.pt").write_bytes(b"x")
    with pytest.raises(NonFiniteStateError, match="at the end of training; m.pt not saved.*kept at .*last.pt"):
        check_state_finite(model, opt, step=None, episode=None, checkpoint=tmp_path / "last.pt", what="m.pt")


def test_early_stop_ends_the_run_and_a_resume_does_not_continue_it(tmp_path, pairs):
    from protoclip.train.config import EarlyStopConfig

    # min_delta larger than any loss change: episode 0 sets the best, episode 1 cannot beat it -> stop
    cfg = tiny_config(method="clip", early_stop=EarlyStopConfig(enabled=True, patience=1, min_delta=1e9))
    layout = Layout(tmp_path / "d", tmp_path / "r")
    train(tiny_model(cfg), pairs, cfg, layout.train_files("es"))
    assert [e["episode"] for e in read_train_log(layout.train_log("es"), "episode")] == [0, 1]  # of 4 scheduled
    stop = read_train_log(layout.train_log("es"), "early_stop")
    assert len(stop) == 1 and stop[0]["episode"] == 1 and stop[0]["bad"] == 1
    ck = load_checkpoint(layout.checkpoint("es"))
    assert ck["episode"] == 2 and ck["extra"]["early_stop"]["stopped"]
    # the workflow always resumes
    model = train(tiny_model(cfg), pairs, cfg, layout.train_files("es"), state=last_state(layout, "es", cfg))
    assert [e["episode"] for e in read_train_log(layout.train_log("es"), "episode")] == [0, 1]
    assert all(torch.equal(v, ck["model"][k]) for k, v in model.state_dict().items())
    # switched off, the same run trains every scheduled episode
    off = tiny_config(method="clip", early_stop=EarlyStopConfig(enabled=False, patience=1, min_delta=1e9))
    train(tiny_model(off), pairs, off, layout.train_files("off"))
    assert len(read_train_log(layout.train_log("off"), "episode")) == 4


def test_checkpoint_interval_skips_episode_saves_and_a_crash_resumes_from_the_last_one(tmp_path, pairs, monkeypatch):
    """checkpoint_interval_s: episodes ending sooner than that after the last save write no checkpoint; the final
    episode always does. A run that crashes in episode 2 with only episode 0's checkpoint resumes from it and
    reaches the uninterrupted weights and log."""
    import protoclip.train.loop as loop_mod
    from protoclip.train import checkpoint as ck_mod

    cfg = tiny_config(method="clip", epochs=2.0, checkpoint_interval_s=3600.0)  # 4 episodes
    saved: list[int] = []
    real_save = ck_mod.save_checkpoint

    def recording_save(path, **kw):
        saved.append(kw["episode"])
        return real_save(path, **kw)

    monkeypatch.setattr(loop_mod, "save_checkpoint", recording_save)
    full = train(tiny_model(cfg), pairs, cfg, Layout(tmp_path / "d", tmp_path / "a").train_files("r"))
    assert saved == [4]  # only after the final episode
    saved.clear()
    # interval 0: every episode (what the crash below needs as its last good state: episode 0's)
    layout = Layout(tmp_path / "d", tmp_path / "b")
    every = dataclasses.replace(cfg, checkpoint_interval_s=0.0)
    train(tiny_model(cfg), pairs, every, layout.train_files("r"), stop_after_episodes=1)
    assert saved == [1]
    saved.clear()
    real = CLIPMethod.terms
    calls = {"n": 0}

    def crash(self, *a):
        calls["n"] += 1
        if calls["n"] == 5:  # second step of episode 2 (episodes 1 and 2 are not checkpointed at 3600 s)
            raise KeyboardInterrupt
        return real(self, *a)

    monkeypatch.setattr(CLIPMethod, "terms", crash)
    with pytest.raises(KeyboardInterrupt):
        train(tiny_model(cfg), pairs, cfg, layout.train_files("r"), state=last_state(layout, "r", cfg))
    assert saved == [] and load_checkpoint(layout.checkpoint("r"))["episode"] == 1
    monkeypatch.setattr(CLIPMethod, "terms", real)
    resumed = train(tiny_model(cfg, seed=99), pairs, cfg, layout.train_files("r"), state=last_state(layout, "r", cfg))
    assert saved == [4]
    _assert_same_weights(full, resumed)
    log_a = read_train_log(tmp_path / "a" / "runs" / "r" / "train_log.jsonl", "step")
    log_b = read_train_log(layout.train_log("r"), "step")
    assert [s["loss"] for s in log_a] == [s["loss"] for s in log_b]
