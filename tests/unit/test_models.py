"""protoclip.models: open_clip builds, SwAV heads, temperatures, parameter groups, save/load, tokenizer."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from protoclip.models import ProjectionHead, build_model, get_tokenizer, load_model, save_model

TINY = ["tiny-rn", "tiny-vit"]


@pytest.fixture(scope="module")
def tiny_models():
    torch.manual_seed(0)
    return {name: build_model(name, head_hidden=64, head_out=16) for name in TINY}


@pytest.mark.parametrize("name", TINY)
def test_tiny_forward_shapes(tiny_models, name):
    model = tiny_models[name]
    assert (model.image_size, model.context_length, model.embed_dim) == (64, 32, 128)
    tok = get_tokenizer(name)
    tokens = tok(["a photo of a dog", "a red truck", "x", "an emoji of a smiling face"])
    images = torch.randn(4, 3, 64, 64)
    out = model(images, tokens)
    assert set(out) == {"z_image", "z_text", "h_image", "h_text"}
    assert out["z_image"].shape == out["z_text"].shape == (4, 128)
    assert out["h_image"].shape == out["h_text"].shape == (4, 16)
    # unnormalised: norms are not all 1
    assert not torch.allclose(out["z_image"].norm(dim=-1), torch.ones(4), atol=1e-3)
    # z equals open_clip's own (unnormalised) encoders; h is the head applied to z
    torch.testing.assert_close(out["z_image"], model.clip.encode_image(images))
    torch.testing.assert_close(out["z_text"], model.clip.encode_text(tokens))
    # gradients reach both encoders and both heads
    sum(v.pow(2).sum() for v in out.values()).backward()
    for part in (model.clip.visual, model.image_head, model.text_head, model.clip.transformer):
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in part.parameters())
    model.zero_grad(set_to_none=True)


def test_forward_one_side_only(tiny_models):
    model = tiny_models["tiny-rn"].eval()
    assert set(model(images=torch.randn(2, 3, 64, 64))) == {"z_image", "h_image"}
    assert set(model(tokens=get_tokenizer("tiny-rn")(["a", "b"]))) == {"z_text", "h_text"}
    with pytest.raises(ValueError):
        model()
    with pytest.raises(ValueError, match="tokens must be"):
        model.encode_text(torch.zeros(2, 77, dtype=torch.long))
    model.train()


def test_rn50_builds_with_paper_sizes():
    model = build_model("RN50")  # construction only: a 224 px forward is too slow for CI
    assert (model.image_size, model.context_length, model.embed_dim) == (224, 77, 1024)
    assert isinstance(model.image_head[0], nn.Linear) and model.image_head[0].in_features == 1024
    assert model.image_head[0].out_features == 2048 and model.image_head[-1].out_features == 128
    assert len(get_tokenizer("RN50")(["a cat"])[0]) == 77


def test_unknown_model_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown model 'no-such-net'"):
        build_model("no-such-net")


def test_head_matches_handwritten_swav_mlp():
    torch.manual_seed(1)
    head = ProjectionHead(12, hidden=20, out_dim=5)
    assert [type(m) for m in head] == [nn.Linear, nn.BatchNorm1d, nn.ReLU, nn.Linear]
    x = torch.randn(32, 12)
    lin1, bn, _, lin2 = head
    # train mode: batch statistics (biased variance), as BatchNorm1d documents
    a = x @ lin1.weight.T + lin1.bias
    a_hat = (a - a.mean(0)) / torch.sqrt(a.var(0, unbiased=False) + bn.eps) * bn.weight + bn.bias
    expected = torch.clamp(a_hat, min=0) @ lin2.weight.T + lin2.bias
    torch.testing.assert_close(head.train()(x), expected)
    # hidden=0: a single linear layer
    lin = ProjectionHead(12, hidden=0, out_dim=5)
    assert len(lin) == 1 and isinstance(lin[0], nn.Linear)
    with pytest.raises(ValueError):
        ProjectionHead(0, 8, 4)


def test_temperature_init():
    model = build_model("tiny-vit", head_hidden=8, head_out=4)
    for p in (model.logit_scale, model.proto_logit_scale):
        assert isinstance(p, nn.Parameter) and p.requires_grad
        assert p.item() == pytest.approx(math.log(1 / 0.07), rel=1e-6)
    assert model.logit_scale is model.clip.logit_scale  # one tau_CLIP, shared with open_clip
    other = build_model("tiny-vit", head_hidden=8, head_out=4, init_temperature=0.2)
    assert other.proto_logit_scale.exp().item() == pytest.approx(5.0, rel=1e-5)
    assert other.logit_scale.exp().item() == pytest.approx(5.0, rel=1e-5)


@pytest.mark.parametrize("name", TINY)
def test_param_groups_partition(tiny_models, name):
    model = tiny_models[name]
    groups = model.param_groups(weight_decay=0.5)
    assert [g["name"] for g in groups] == ["image_decay", "image_no_decay", "other_decay", "other_no_decay"]
    by_name = {g["name"]: g for g in groups}
    # every trainable parameter is in exactly one group
    seen = [id(p) for g in groups for p in g["params"]]
    assert len(seen) == len(set(seen))
    assert set(seen) == {id(p) for p in model.parameters()}
    names = {g["name"]: set(g["param_names"]) for g in groups}
    for key in ("image_decay", "other_decay"):
        assert by_name[key]["weight_decay"] == 0.5
        assert all(p.ndim >= 2 for p in by_name[key]["params"])  # no bias / norm gain / temperature
        assert not any(("logit_scale" in n or n.endswith(".bias") or "head" in n) for n in names[key])
    for key in ("image_no_decay", "other_no_decay"):
        assert by_name[key]["weight_decay"] == 0.0
    # open_clip's `exclude` rule (ndim < 2 or bn/ln/bias/logit_scale in the name) agrees for the encoders
    def openclip_exclude(n, p):
        return p.ndim < 2 or "bn" in n or "ln" in n or "bias" in n or "logit_scale" in n
    for n, p in model.named_parameters():
        if "head" not in n:
            in_no_decay = n in names["image_no_decay"] | names["other_no_decay"]
            assert in_no_decay == openclip_exclude(n, p), n
    assert {"clip.logit_scale", "proto_logit_scale"} <= names["other_no_decay"]
    image_params = names["image_decay"] | names["image_no_decay"]
    assert image_params == {n for n, _ in model.named_parameters() if n.startswith("clip.visual.")}
    # heads: no decay by default (official code); weights decayed when asked
    groups_hd = {g["name"]: set(g["param_names"]) for g in model.param_groups(0.1, head_weight_decay=True)}
    assert "image_head.0.weight" in groups_hd["other_decay"] and "image_head.0.bias" in groups_hd["other_no_decay"]
    assert "image_head.0.weight" in names["other_no_decay"]
    # the groups drive a real optimizer
    torch.optim.AdamW(groups, lr=1e-3)


def test_param_groups_skip_frozen():
    model = build_model("tiny-rn", head_hidden=8, head_out=4)
    for p in model.clip.visual.parameters():
        p.requires_grad_(False)
    groups = {g["name"]: g for g in model.param_groups(0.2)}
    assert groups["image_decay"]["params"] == [] and groups["image_no_decay"]["params"] == []
    assert groups["other_decay"]["params"]


@pytest.mark.parametrize("name", TINY)
def test_save_load_round_trip(tmp_path, name):
    torch.manual_seed(2)
    model = build_model(name, head_hidden=32, head_out=8)
    # move weights, temperatures and BatchNorm running stats away from their init
    model.train()
    with torch.no_grad():
        model(torch.randn(8, 3, 64, 64), get_tokenizer(name)(["a"] * 8))
        model.proto_logit_scale.fill_(3.3)
        model.text_head[0].weight.mul_(1.5)
    cfg = {"model": name, "lr": 5e-4, "betas": (0.9, 0.999), "path": tmp_path}
    path = save_model(tmp_path / "run" / "model.pt", model, cfg)
    assert path.is_file() and not list(path.parent.glob(".*tmp*"))
    loaded, cfg2 = load_model(path)
    assert not loaded.training
    assert (loaded.name, loaded.head_hidden, loaded.head_out) == (name, 32, 8)
    assert cfg2 == {"model": name, "lr": 5e-4, "betas": [0.9, 0.999], "path": str(tmp_path)}
    sd, sd2 = model.state_dict(), loaded.state_dict()
    assert sd.keys() == sd2.keys() and all(torch.equal(sd[k], sd2[k]) for k in sd)
    model.eval()
    images, tokens = torch.randn(3, 3, 64, 64), get_tokenizer(name)(["a dog", "a cat", "a car"])
    out, out2 = model(images, tokens), loaded(images, tokens)
    for k in out:
        assert torch.equal(out[k], out2[k]), k


def test_load_model_rejects_other_files(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_model(tmp_path / "missing.pt")
    torch.save({"state_dict": {}}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not a protoclip-model"):
        load_model(tmp_path / "other.pt")


def test_tokenizer_context_length():
    tok = get_tokenizer("tiny-rn")
    t = tok(["a photo of a cat", " ".join(["word"] * 100)])
    assert t.shape == (2, 32) and t.dtype == torch.long
    assert int(t.max()) < 49408
    # long captions are truncated and still end in the end-of-text token (the pooled position)
    assert int(t[1, -1]) == tok.eot_token_id


@pytest.mark.parametrize("name", TINY)
def test_tiny_models_are_cpu_sized(name):
    """One forward+backward at batch 128, 64 px must cost < 100 GFLOP (measured: ~76 tiny-rn, ~60 tiny-vit),
    i.e. about a second on 2 CPU cores. FLOPs are counted (deterministic) rather than timed (the CI machine is
    shared); cost is linear in the batch, so batch 8 is counted and scaled by 16."""
    from torch.utils.flop_counter import FlopCounterMode

    model = build_model(name)
    images, tokens = torch.randn(8, 3, 64, 64), torch.randint(1, 49407, (8, 32))
    with FlopCounterMode(display=False) as counter:
        out = model(images, tokens)
        sum(v.float().mean() for v in out.values()).backward()
    gflop_at_128 = counter.get_total_flops() * 16 / 1e9
    assert 10 < gflop_at_128 < 100, gflop_at_128


def test_embed_dim_and_context_length_overrides_round_trip(tmp_path):
    # Table I: RN101's z^I is 1024-d (open_clip: 512); Sec. IV-A1: 76 text tokens (open_clip: 77)
    from protoclip.models.build import architecture_overrides, model_config
    rn101 = model_config("RN101")
    assert rn101["embed_dim"] == 512 and rn101["text_cfg"]["context_length"] == 77  # why the overrides exist
    assert architecture_overrides(rn101, 1024, 76) == {"embed_dim": 1024,
                                                      "text_cfg": {**rn101["text_cfg"], "context_length": 76}}
    assert architecture_overrides(rn101, None, None) == {} == architecture_overrides(rn101, 512, 77)
    torch.manual_seed(0)
    model = build_model("tiny-rn", head_hidden=32, head_out=8, embed_dim=96, context_length=20)
    assert model.embed_dim == 96 and model.context_length == 20
    tok = get_tokenizer("tiny-rn", context_length=model.context_length)
    tokens = tok(["a red circle", " ".join(["word"] * 50)])
    assert tokens.shape == (2, 20) and int(tokens[1, -1]) == tok.eot_token_id
    model.eval()
    out = model(torch.randn(2, 3, 64, 64), tokens)
    assert out["z_image"].shape == (2, 96) and out["z_text"].shape == (2, 96) and out["h_text"].shape == (2, 8)
    with pytest.raises(ValueError, match=r"tokens must be \[B, 20\]"):
        model(torch.randn(2, 3, 64, 64), get_tokenizer("tiny-rn")(["a", "b"]))  # tokenizer and tower disagree
    loaded, _ = load_model(save_model(tmp_path / "m.pt", model, {}))
    assert (loaded.embed_dim, loaded.context_length) == (96, 20)
    assert torch.equal(loaded(torch.zeros(1, 3, 64, 64), tokens[:1])["z_text"],
                       model(torch.zeros(1, 3, 64, 64), tokens[:1])["z_text"])


@pytest.mark.parametrize("name,class_tokens", [("tiny-rn", 0), ("tiny-vit", 0), ("tiny-vit", 4)])
def test_image_size_override_round_trip(tmp_path, name, class_tokens):
    # the offline default trains the 64 px tiny configs at 32 px (train.image_size)
    from protoclip.models.build import architecture_overrides, model_config
    cfg = model_config(name)
    assert architecture_overrides(cfg, None, None, 32) == {"vision_cfg": {**cfg["vision_cfg"], "image_size": 32}}
    assert architecture_overrides(cfg, None, None, 64) == {}  # the config's own size: nothing to override
    torch.manual_seed(0)
    model = build_model(name, head_hidden=32, head_out=8, image_size=32, class_tokens=class_tokens).eval()
    assert model.image_size == 32
    tokens = get_tokenizer(name)(["a red circle", "a blue square"])
    out = model(torch.randn(2, 3, 32, 32), tokens)
    assert out["z_image"].shape == (2, 128 * max(class_tokens, 1)) and torch.isfinite(out["z_image"]).all()
    with pytest.raises(Exception):  # the 64 px input the tower was not built for
        model(torch.randn(2, 3, 64, 64), tokens)
    loaded, _ = load_model(save_model(tmp_path / "m.pt", model, {}))
    x = torch.randn(1, 3, 32, 32)
    assert loaded.image_size == 32 and torch.equal(loaded(x, tokens[:1])["z_image"], model(x, tokens[:1])["z_image"])


def test_image_size_override_must_fit_the_architecture():
    with pytest.raises(ValueError, match="multiple of 8"):
        build_model("tiny-vit", image_size=36)  # patch 8
    with pytest.raises(ValueError, match="multiple of 32"):
        build_model("tiny-rn", image_size=48)  # ModifiedResNet downsamples 32x


@pytest.mark.parametrize("name", TINY)
def test_trimmed_text_tower_equals_open_clip_values_and_gradients(name):
    """encode_text on CPU runs only up to the batch's last EOT (models.model.encode_text_trimmed): the same z^T and
    the same gradients as open_clip's full-context encode_text, also when one caption fills the context."""
    from protoclip.models.model import encode_text_trimmed, trims_text

    torch.manual_seed(0)
    model = build_model(name, head_hidden=64, head_out=16)
    assert trims_text(model.clip)
    tok = get_tokenizer(name)
    short = tok(["a red truck", "x", "an emoji of a smiling face with open mouth"])
    full = tok(["word " * 60, "a dog"])  # truncated to the context: EOT at the last position
    for tokens in (short, full):
        n = int(tokens.argmax(-1).max()) + 1
        assert (n < tokens.shape[1]) == (tokens is short)
        ref_model = build_model(name, head_hidden=64, head_out=16)
        ref_model.load_state_dict(model.state_dict())
        z = model.encode_text(tokens)
        ref = ref_model.clip.encode_text(tokens)  # open_clip's own, every position
        torch.testing.assert_close(z, ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(encode_text_trimmed(model.clip, tokens), ref, rtol=1e-5, atol=1e-5)
        w = torch.randn_like(z)
        (z * w).sum().backward()
        (ref * w).sum().backward()
        grads = dict(ref_model.named_parameters())
        checked = 0
        for pname, p in model.named_parameters():
            g_ref = grads[pname].grad
            if g_ref is None or not g_ref.abs().sum():
                assert p.grad is None or not p.grad.abs().sum(), pname  # no gradient where open_clip has none
                continue
            # float32: attention over 26 vs 32 positions sums in another order, so compare by relative norm
            assert ((p.grad - g_ref).norm() / g_ref.norm()).item() < 1e-4, pname
            checked += 1
        assert checked > 10
        model.zero_grad()


def test_trimming_only_for_plain_clip_text_towers():
    from protoclip.models.model import trims_text

    assert not trims_text(build_model("tiny-vit", head_hidden=64, head_out=16, class_tokens=2).clip)
