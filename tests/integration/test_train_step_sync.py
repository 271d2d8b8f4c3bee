"""A training step without host synchronisation: step records stay on the device and are read back once per
``train.log_every_steps``; the interval changes no number; a non-finite step is still named exactly and its
update (and the window's later ones) skipped; ``precision: fp16`` is CUDA only."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import protoclip.train.loop as loop
from protoclip.errors import ConfigError
from protoclip.files.layout import Layout
from protoclip.files.records import read_train_log
from protoclip.train.distributed import DistInfo
from protoclip.train.loop import NonFiniteLossError, autocast_factory, build_optimizer, masked_step, train
from protoclip.train.methods.clip import CLIPMethod
from protoclip.train.step_log import StepWindow
from testkit.training import RandomPairs, method_config, method_model, one_thread, tiny_config, tiny_model

_threads = pytest.fixture(autouse=True)(one_thread)

HOST_READS = ("item", "__float__", "__bool__", "__int__", "__index__", "tolist", "cpu", "numpy")


@pytest.fixture(scope="module")
def pairs():
    return RandomPairs(n=64)


def eight_steps(method: str = "clip", **kw):
    """Episodes of 64 items in batches of 8: 8 optimizer steps each (one episode unless ``epochs`` says more)."""
    kw = {"episode_size": 64, "batch_size": 8, "epochs": 1.0, **kw}
    return method_config(method, **kw) if method in ("nclip", "xclip") else tiny_config(method=method, **kw)


def build(cfg):
    return method_model(cfg) if cfg.method in ("nclip", "xclip") else tiny_model(cfg)


def _records(path) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("time/") and k != "provenance"}
            for r in read_train_log(path)]


@pytest.mark.parametrize("method", ["clip", "protoclip"])
def test_log_interval_changes_no_weight_and_no_logged_value(tmp_path, pairs, method):
    """Read back every step, every 3 steps (a window across no episode end) or once per episode: the same
    weights bit for bit and the same train log (2 episodes x 8 steps)."""
    runs = {}
    for every in (1, 3, 100):
        cfg = eight_steps(method, epochs=2.0, log_every_steps=every)
        layout = Layout(tmp_path / "d", tmp_path / f"r{every}")
        model = train(build(cfg), pairs, cfg, layout.train_files("r"))
        runs[every] = (model.state_dict(), _records(layout.train_log("r")))
    state, log = runs[1]
    assert [r["step"] for r in log if r["kind"] == "step"] == list(range(16))
    for every in (3, 100):
        other_state, other_log = runs[every]
        assert all(torch.equal(state[k], other_state[k]) for k in state), every
        assert other_log == log, every


# not pcl: it draws its negative prototypes from the CPU generator (the ref code's draw, exact on resume), one
# copy of the batch's positive ids to the host per step
@pytest.mark.parametrize("method", ["clip", "protoclip", "nclip", "xclip"])
def test_steps_between_log_intervals_read_nothing_back(tmp_path, pairs, monkeypatch, method):
    """Count every host read of a tensor (item, float, bool, int, index, tolist, cpu, numpy) during the training
    steps and during the read-backs: none in any step, at least one in each read-back, and a read-back after steps
    3, 6 and at the episode's end (8).

    Not counted: the text tower's trim to the batch's longest caption, which ``encode_text`` takes for CPU
    tokens only (a free read there; on a GPU the full context runs, protoclip.models.model)."""
    import protoclip.models.model as model_module

    events: list[str] = []
    cpu_only = {"depth": 0}
    for name in HOST_READS:
        real = getattr(torch.Tensor, name)

        def counted(self, *a, _real=real, **k):
            if not cpu_only["depth"]:
                events.append("read")
            return _real(self, *a, **k)
        monkeypatch.setattr(torch.Tensor, name, counted)
    real_trim = model_module.encode_text_trimmed

    def trim(clip, tokens):
        assert tokens.device.type == "cpu"
        cpu_only["depth"] += 1
        try:
            return real_trim(clip, tokens)
        finally:
            cpu_only["depth"] -= 1
    monkeypatch.setattr(model_module, "encode_text_trimmed", trim)
    real_step, real_flush = loop.train_step, StepWindow.flush

    def step(*a, **k):
        events.append("step(")
        real_step(*a, **k)
        events.append(")")

    def flush(self, sums):
        events.append("flush(")
        real_flush(self, sums)
        events.append(")")
    monkeypatch.setattr(loop, "train_step", step)
    monkeypatch.setattr(StepWindow, "flush", flush)

    cfg = eight_steps(method, log_every_steps=3)
    train(build(cfg), pairs, cfg, Layout(tmp_path / "d", tmp_path / "r").train_files("r"))

    spans, current = [], None  # (kind, reads) per step / read-back call
    for e in events:
        if e in ("step(", "flush("):
            current = [e, 0]
        elif e == ")":
            spans.append(tuple(current))
            current = None
        elif current is not None:
            current[1] += 1
    steps_between, n = [], 0
    for kind, reads in spans:
        if kind == "step(":
            assert reads == 0, f"{method}: a training step read {reads} value(s) back to the host"
            n += 1
        elif n:  # a read-back of held steps
            assert reads > 0
            steps_between.append(n)
            n = 0
    assert steps_between == [3, 3, 2]


def test_non_finite_step_is_named_at_the_interval_and_its_update_skipped(tmp_path, pairs, monkeypatch):
    """A NaN loss at step 4 (read back after step 5): the stop names step 4 and the term, the run went no further
    than the interval, and the weights are those after step 3 (the updates of steps 4 and 5 skipped)."""
    cfg = eight_steps(log_every_steps=3)
    real_terms, real_after = CLIPMethod.terms, CLIPMethod.after_step
    calls = {"terms": 0, "after": 0}
    snapshot = {}

    def poisoned(self, model, out, positions, prototypes):
        terms = real_terms(self, model, out, positions, prototypes)
        if calls["terms"] == 4:
            terms["clip"] = terms["clip"] * float("nan")
        calls["terms"] += 1
        return terms

    def after_step(self, model):
        real_after(self, model)
        if calls["after"] == 3:
            snapshot.update({k: v.clone() for k, v in model.state_dict().items()})
        calls["after"] += 1
    monkeypatch.setattr(CLIPMethod, "terms", poisoned)
    monkeypatch.setattr(CLIPMethod, "after_step", after_step)
    model = tiny_model(cfg)
    layout = Layout(tmp_path / "d", tmp_path / "r")
    with pytest.raises(NonFiniteLossError, match=r"non-finite loss at step 4 \(episode 0\): term 'clip' "
                                                 r"\(clip=nan, total=nan\); stopped, no checkpoint"):
        train(model, pairs, cfg, layout.train_files("nan"))
    assert calls["terms"] == 6  # steps 0-5: the read-back after step 5 found it
    for k, v in model.state_dict().items():
        if "running_" not in k and "num_batches" not in k:  # BatchNorm statistics move in every forward
            assert torch.equal(v, snapshot[k]), k
    assert [s["step"] for s in read_train_log(layout.train_log("nan"), "step")] == [0, 1, 2]  # the clean window


def test_masked_step_skips_on_the_flag_and_is_exact_without_it():
    """Fused AdamW with the found_inf flag: 1 leaves weights and moments as they were; 0 gives the weights of a
    plain ``step()`` bit for bit."""
    cfg = tiny_config(method="clip")
    models = [tiny_model(cfg) for _ in range(3)]
    opts = [build_optimizer(m, cfg) for m in models]
    x = torch.randn(4, 3, 64, 64)
    for m in models:
        m.clip.visual(x).square().mean().backward()
    before = {k: v.clone() for k, v in models[0].state_dict().items()}
    opts[0].step()
    masked_step(opts[1], torch.zeros(()))
    masked_step(opts[2], torch.ones(()))
    a, b, c = (m.state_dict() for m in models)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert all(torch.equal(c[k], before[k]) for k in c)
    assert not hasattr(opts[1], "found_inf")
    steps = [float(s["step"]) for s in opts[2].state.values()]
    assert steps and set(steps) == {0.0}  # the skipped step is not counted


def test_masked_step_sgd_skips_weights_and_momentum_and_is_exact_without_it():
    """Fused SGD (optimizer: sgd, PCL / MoCo) with the found_inf flag: 1 leaves weights and momentum buffers as they
    were, 0 gives a plain ``step()`` bit for bit; a flagged FIRST step (an fp16 overflow at step 0) leaves zero
    buffers, so the later steps are those of a run without it (fused SGD alone would leave them uninitialised)."""
    cfg = tiny_config(method="clip", optimizer="sgd", lr=0.03, momentum=0.9, weight_decay=1e-4)
    models = [tiny_model(cfg) for _ in range(4)]
    opts = [build_optimizer(m, cfg) for m in models]
    assert all(isinstance(o, torch.optim.SGD) and o.defaults["fused"] for o in opts)
    x = torch.randn(4, 3, 64, 64)

    def backward(m, scale=1.0):
        m.zero_grad(set_to_none=True)
        (scale * m.clip.visual(x).square().mean()).backward()

    for m in models[:3]:
        backward(m)
    before = {k: v.clone() for k, v in models[0].state_dict().items()}
    opts[0].step()
    masked_step(opts[1], torch.zeros(()))
    masked_step(opts[2], torch.ones(()))
    a, b, c = (m.state_dict() for m in models[:3])
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert all(torch.equal(c[k], before[k]) for k in c)
    bufs = [st["momentum_buffer"] for st in opts[2].state.values()]
    assert bufs and all(not buf.any() for buf in bufs)  # zeros: the skipped step wrote nothing
    # models[2]: flagged first step, then two clean ones; models[3]: the two clean ones only
    for m, o in ((models[2], opts[2]), (models[3], opts[3])):
        for _ in range(2):
            backward(m)
            masked_step(o, torch.zeros(()))
    c, d = dict(models[2].named_parameters()), dict(models[3].named_parameters())  # (BatchNorm saw 3 vs 2 batches)
    assert all(torch.equal(c[k], d[k]) for k in c)
    assert any(not torch.equal(c[k], before[k]) for k in c)


def test_window_fp16_overflow_skips_without_stopping_while_fp32_stops():
    """Under fp16 a non-finite gradient norm is the GradScaler's overflow: that step only is skipped and nothing
    stops; in fp32 it stops at the read-back, naming the step, and every later update of the window is skipped."""
    info, loss = DistInfo(), torch.tensor(1.0)
    written: list[dict] = []
    for fp16 in (True, False):
        w = StepWindow(10, 1, written.append, checkpoint=__import__("pathlib").Path("none.pt"),
                       device=torch.device("cpu"), overflow_skips=fp16)
        flags = []
        for step, norm in enumerate([1.0, float("inf"), 2.0]):
            head, bad = w.loss_flag({"clip": loss}, loss, info)
            grad_norm = torch.tensor(norm)
            flags.append(float(w.found_inf(bad, grad_norm)))
            w.push({"kind": "step", "step": step, "episode": 0, "loss": loss, "grad_norm": grad_norm, "clip": loss},
                   ["clip"], head, bad)
        if fp16:
            assert flags == [0.0, 1.0, 0.0]
            w.flush({})
            assert [r["grad_norm"] for r in written] == [1.0, float("inf"), 2.0]
        else:
            assert flags == [0.0, 1.0, 1.0]
            with pytest.raises(NonFiniteLossError, match=r"gradient norm at step 1 \(episode 0\): inf"):
                w.flush({})


def test_fp16_is_refused_off_cuda():
    from protoclip.config.strict import build as build_config, to_dict
    from protoclip.train.config import TrainConfig

    data = {**to_dict(tiny_config()), "precision": "fp16"}
    with pytest.raises(ConfigError, match="precision: fp16"):
        build_config(TrainConfig, data, "test.yaml")
    ok = build_config(TrainConfig, {**data, "gpu": True, "device": "auto"}, "test.yaml")
    assert ok.precision == "fp16"
    with pytest.raises(ConfigError, match="fp16 runs on CUDA only"):
        autocast_factory("fp16", torch.device("cpu"))
    assert dataclasses.replace(ok, precision="bf16").precision == "bf16"


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_grad_scaler_path_trains_as_without_it(tmp_path, pairs, monkeypatch, optimizer):
    """The fp16 step's GradScaler path (scale the loss, unscale before clipping, skip on overflow, update the
    scale, save it with the checkpoint) with a real GradScaler on the CPU and fp32 compute: scaling by a power of two
    and back is exact, so the weights and the log equal the run without a scaler; with either optimizer."""
    cfg = eight_steps(epochs=2.0, optimizer=optimizer, **({"lr": 0.03} if optimizer == "sgd" else {}))
    plain_layout = Layout(tmp_path / "d", tmp_path / "plain")
    plain = train(tiny_model(cfg), pairs, cfg, plain_layout.train_files("r"))
    scalers = []

    def cpu_scaler(precision, device):
        scalers.append(torch.amp.GradScaler("cpu", init_scale=2.0 ** 10))
        return scalers[-1]
    monkeypatch.setattr(loop, "build_scaler", cpu_scaler)
    layout = Layout(tmp_path / "d", tmp_path / "scaled")
    scaled = train(tiny_model(cfg), pairs, cfg, layout.train_files("r"))
    a, b = plain.state_dict(), scaled.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert _records(layout.train_log("r")) == _records(plain_layout.train_log("r"))
    from protoclip.train.checkpoint import load_checkpoint

    saved = load_checkpoint(layout.checkpoint("r"))["extra"]["scaler"]
    assert saved["scale"] == 2.0 ** 10 and saved["_growth_tracker"] == 16  # 16 clean steps through update()
