"""Training methods as plug-ins of one trainer: registry, multi-class-token towers, evaluation similarities,
and for nCLIP / xCLIP / multi-token CLIP a tiny run from `run_train` and a bit-identical resume."""
from __future__ import annotations

import pytest
import torch

from protoclip.files.layout import Layout
from protoclip.files.records import read_train_log
from protoclip.train.loop import train
from protoclip.train.methods.base import METHODS, build_method, method_class
from testkit.training import NEW_METHODS as NEW
from testkit.training import RandomPairs, last_state, one_thread, tiny_config
from testkit.training import method_config as _cfg
from testkit.training import method_model as _model

_threads = pytest.fixture(autouse=True)(one_thread)


def test_registry_holds_the_shipped_methods_and_the_config_checks_names_against_it():
    from protoclip.errors import ConfigError
    from protoclip.config.strict import build
    from protoclip.registry import load_methods
    from protoclip.train.config import TrainConfig

    load_methods()  # the registry fills as the method modules are imported (alone, this file imports none first)
    assert set(METHODS) >= {"clip", "protoclip", "nclip", "xclip", "pcl"}
    for name in ("clip", "protoclip", "nclip", "xclip"):
        assert build(TrainConfig, {"method": name}).method == name
    with pytest.raises(ValueError, match="unknown training method"):
        method_class("nope")
    with pytest.raises(ConfigError, match="method: unknown training method 'nope'"):
        build(TrainConfig, {"method": "nope"})


def test_method_outputs_weights_and_similarity():
    cfg = tiny_config(method="xclip")
    m = build_method(cfg)
    assert m.outputs() == {"z_image", "z_text", "logit_scale", "h_image", "h_text"}
    one = torch.tensor(1.0)
    assert float(m.total({"clip": one, "nclip": one, "nclip_ce": one})) == pytest.approx(0.2 + 1.0)  # Eq. 5
    assert method_class("xclip").similarity_for(cfg).name == "cosine"
    assert method_class("nclip").similarity_for(tiny_config(method="nclip")).name == "nclip_ce"
    mt = tiny_config(**{k: v for k, v in NEW["multitoken"].items() if k != "loss"},
                     loss={"distance": "ps_negtrace"})
    assert method_class("clip").similarity_for(mt).name == "product_sphere"
    assert mt.subspheres() == 4 and mt.clip_max_logit_scale() == 3.95
    assert tiny_config(method="clip").clip_max_logit_scale() == 100.0


def _mt_model(m: int = 3):
    from protoclip.models import build_model

    torch.manual_seed(0)
    return build_model("tiny-vit-mt", head_hidden=8, head_out=4, class_tokens=m).eval()


def test_multitoken_towers_shapes_and_token_placement():
    from open_clip.transformer import TextTransformer, VisionTransformer

    from protoclip.models import get_tokenizer

    model = _mt_model(3)
    assert isinstance(model.clip.visual, VisionTransformer) and isinstance(model.clip.text, TextTransformer)
    assert model.embed_dim == 3 * 32
    tok = get_tokenizer("tiny-vit-mt")(["a red cat", "a dog on a boat"])
    z = model.encode_text(tok)
    assert z.shape == (2, 96)
    # the class tokens sit right after EOT and attention is causal: ids after EOT (pads) do not matter
    eot = tok.argmax(1)
    garbage = tok.clone()
    garbage[0, eot[0] + 1:] = 1234
    assert torch.allclose(model.encode_text(garbage)[0], z[0], atol=1e-5)
    other = get_tokenizer("tiny-vit-mt")(["a red dog", "a dog on a boat"])
    assert not torch.allclose(model.encode_text(other)[0], z[0])
    zi = model.encode_image(torch.randn(2, 3, 64, 64))
    assert zi.shape == (2, 96)
    chunks = zi.reshape(2, 3, 32)
    assert not torch.allclose(chunks[:, 0], chunks[:, 1])  # distinct class tokens give distinct outputs
    # trainable new parameters with their own (random, distinct) initialisation
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    assert {"clip.visual.extra_class_embedding", "clip.visual.extra_positional_embedding",
            "clip.text.mt_class_embedding", "clip.text.extra_positional_embedding"} <= names


def test_multitoken_model_file_roundtrip(tmp_path):
    from protoclip.models import load_model, save_model

    model = _mt_model(2)
    save_model(tmp_path / "m.pt", model, {"method": "clip", "class_tokens": 2})
    back, cfg = load_model(tmp_path / "m.pt")
    x = torch.randn(2, 3, 64, 64)
    assert back.class_tokens == 2 and torch.equal(back.encode_image(x), model.encode_image(x))


def test_similarity_embeddings_dot_products():
    from protoclip.losses.distances import neg_distance
    from protoclip.losses.nclip import nclip_similarity
    from protoclip.similarity import similarity_of

    g = torch.Generator().manual_seed(0)
    zi, zt = torch.randn(3, 12, generator=g), torch.randn(4, 12, generator=g)
    hi, ht = torch.randn(3, 5, generator=g), torch.randn(4, 5, generator=g)
    ps = similarity_of("clip", "product_sphere", 4)
    ps_i, ps_t = ps.image(zi, None), ps.text(ps.pre(zt, None))
    assert torch.allclose(ps_i @ ps_t.T, neg_distance(zi, zt, "ps_negtrace", 4), atol=1e-5)
    nc = similarity_of("nclip", "nclip_ce")
    n_i, n_t = nc.image(None, hi), nc.text(nc.pre(None, ht))
    want = nclip_similarity(torch.log_softmax(hi, 1), torch.log_softmax(ht, 1))
    assert torch.allclose(n_i @ n_t.T, want, atol=1e-5)
    # prompt ensemble for nCLIP: the mean of the probability vectors, then scored
    row = nc.text(nc.ensemble(nc.pre(None, ht[:2])))
    mean_p = torch.softmax(ht[:2], 1).mean(0, keepdim=True)
    assert torch.allclose(n_i @ row.T, nclip_similarity(torch.log_softmax(hi, 1), mean_p.log()), atol=1e-5)
    # a model file naming a similarity its method does not have: refused by name
    with pytest.raises(ValueError, match="method 'protoclip' has no evaluation similarity 'nclip_ce'"):
        similarity_of("protoclip", "nclip_ce")
    assert similarity_of(None, "cosine").name == "cosine" and not similarity_of("xclip", "cosine").dot_product


@pytest.mark.parametrize("name", sorted(NEW))
def test_new_methods_resume_bit_identically(tmp_path, name):
    pairs = RandomPairs(n=64)
    cfg = _cfg(name, epochs=1.0)  # 2 episodes x 2 steps; "killed" after the first
    full = train(_model(cfg), pairs, cfg, Layout(tmp_path / "d", tmp_path / "a").train_files("r"))
    layout = Layout(tmp_path / "d", tmp_path / "b")
    train(_model(cfg), pairs, cfg, layout.train_files("r"), stop_after_episodes=1)
    torch.manual_seed(1234)
    resumed = train(_model(cfg, seed=99), pairs, cfg, layout.train_files("r"), state=last_state(layout, "r", cfg))
    sa, sb = full.state_dict(), resumed.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    log_a = read_train_log(tmp_path / "a" / "runs" / "r" / "train_log.jsonl", "step")
    log_b = read_train_log(layout.train_log("r"), "step")
    assert [s["loss"] for s in log_a] == [s["loss"] for s in log_b]
    eps = read_train_log(layout.train_log("r"), "episode")
    keys = {"nclip": ["mean/nclip_kl", "mean/nclip_eh", "mean/nclip_he", "mean/nclip_row_std_image",
                      "mean/nclip_col_std_text", "mean/nclip_acc_same_argmax", "mean/clip_acc"],
            "xclip": ["mean/clip", "mean/nclip", "mean/clip_acc", "mean/nclip_kl"],
            "multitoken": ["mean/clip", "mean/equilibrium", "mean/clip_scale", "mean/clip_acc_i2t"]}[name]
    assert all(k in eps[-1] for k in keys), set(keys) - set(eps[-1])
    if name == "xclip":
        steps = read_train_log(layout.train_log("r"), "step")
        assert all(s["loss"] == pytest.approx(0.2 * s["clip"] + s["nclip"], rel=1e-5) for s in steps)
    if name == "multitoken":  # the Multi(n, m) clamp (3.95) holds from the first step (init 1/0.07 = 14.3)
        assert all(s["clip_scale"] <= 3.95 + 1e-4 for s in read_train_log(layout.train_log("r"), "step")[1:])


def test_fixed_temperature_stays_fixed(tmp_path):
    cfg = tiny_config(method="clip", epochs=0.5, loss={"learn_temperature": False, "init_temperature": 0.5})
    model = train(_model(cfg), RandomPairs(n=64), cfg, Layout(tmp_path / "d", tmp_path / "r").train_files("t"))
    assert float(model.logit_scale.exp()) == pytest.approx(2.0)


def test_run_train_nclip_from_config_and_model_file(tmp_path):
    """`protoclip train --run` path: config -> stage -> trainer -> model.pt that rebuilds the nCLIP heads."""
    import yaml

    from protoclip.project import load_config
    from protoclip.models import load_model, read_eval_spec
    from protoclip.train.stage import run_train
    from testkit.training import stage_project as _project

    path = _project(tmp_path, teacher=False)
    raw = yaml.safe_load(path.read_text())
    raw["runs"] = {"n": {"method": "nclip", "teacher": None, "model": "tiny-vit", "head_hidden": 16, "head_out": 32}}
    path.write_text(yaml.safe_dump(raw))
    cfg = load_config(path)
    out = run_train(cfg, "n")
    model, saved = load_model(out)
    assert model.head == "nclip" and model.image_head.out_dim == 32
    spec = read_eval_spec(out)
    assert (spec.method, spec.similarity, spec.subspheres, spec.image_only) == ("nclip", "nclip_ce", 1, False)
    assert read_train_log(Layout.from_config(cfg).train_log("n"), "episode")[-1]["mean/nclip_he"] > 0


@pytest.mark.parametrize("kind", ["nclip", "multitoken"])
def test_feature_extractor_and_stage_use_the_method_similarity(tmp_path, kind):
    """model.pt -> FeatureExtractor -> the stage's zero-shot and retrieval tasks score with the method's own
    similarity (nCLIP -CE / summed per-token cosine), checked against scores computed here from the model."""
    import numpy as np

    from protoclip.data.loading.transforms import eval_transform
    from protoclip.evaluate.config import EvaluateConfig
    from protoclip.evaluate.datasets import ArraySplit, CaptionSet, LabelledSet
    from protoclip.evaluate.adapters import SetInput
    from protoclip.evaluate.tasks.retrieval import task_retrieval
    from protoclip.evaluate.tasks.zeroshot import task_zeroshot
    from protoclip.evaluate.adapters import zeroshot_classifier
    from protoclip.evaluate.features import FeatureExtractor
    from protoclip.losses.distances import neg_distance
    from protoclip.losses.nclip import nclip_similarity
    from protoclip.models import get_tokenizer, save_model
    from protoclip.config.strict import to_dict

    cfg = _cfg("nclip" if kind == "nclip" else "multitoken")
    model = _model(cfg).eval()
    save_model(tmp_path / "m.pt", model, to_dict(cfg), eval_spec=method_class(cfg.method).eval_spec(cfg))
    rng = np.random.default_rng(0)
    imgs = rng.integers(0, 255, (6, 64, 64, 3), dtype=np.uint8)
    test = ArraySplit(imgs, np.array([0, 1, 2, 0, 1, 2]))
    caps = CaptionSet("caps", ArraySplit(imgs[:3], np.arange(3)), [["a red cat"], ["a blue car"], ["a green tree"]])
    ds = LabelledSet("toy", ["cat", "car", "tree"], ["a photo of a {}.", "a {}."], test, captions=caps)
    ex = FeatureExtractor(tmp_path / "m.pt", device="cpu", batch_size=4)
    f = ex.features(tmp_path / "f.npz", ds)
    assert ex.similarity.name == ("nclip_ce" if kind == "nclip" else "product_sphere")
    inputs = SetInput(f, ds, EvaluateConfig(), tmp_path / "f.png", ex.similarity, ex)
    # oracle: encode here, score by the method's similarity, prompt-ensemble per the spec
    tok, tf = get_tokenizer(cfg.model), eval_transform(model.image_size)
    with torch.no_grad():
        x = torch.stack([tf(test[i][0]) for i in range(6)])
        zi = model.encode_image(x)
        prompts = [t.format(c) for c in ds.classnames for t in ds.templates]
        zt = model.encode_text(tok(prompts))
        if kind == "nclip":
            q = torch.softmax(model.text_head(zt), 1).reshape(3, 2, -1).mean(1)
            scores = nclip_similarity(torch.log_softmax(model.image_head(zi), 1), q.log())
        else:
            scores = neg_distance(zi, zt, "ps_negtrace", 4).reshape(6, 3, 2).mean(2)  # logits averaged
    got = torch.from_numpy(f.test_s @ zeroshot_classifier(inputs).T)
    torch.testing.assert_close(got, scores.float(), atol=1e-4, rtol=1e-4)  # the dot product is the score
    want = 100.0 * float((scores.argmax(1) == torch.tensor([0, 1, 2, 0, 1, 2])).float().mean())
    zs = task_zeroshot(inputs)
    assert zs.metrics["top1"] == pytest.approx(want) and ("nclip_ce" in zs.features or "product_sphere" in zs.features)
    assert torch.equal(torch.from_numpy(zs.examples["top1"]), scores.argmax(1) == torch.tensor([0, 1, 2, 0, 1, 2]))
    r = task_retrieval(SetInput(f, caps, EvaluateConfig(), tmp_path / "f.png", ex.similarity, ex))
    assert "similarity" in r.features and 0.0 <= r.metrics["mean_recall"] <= 100.0
