"""A training method is one module plus one registration line: a toy method defined here (and nowhere else),
with a config section and an evaluation similarity of its own, is validated by the config loader (its section
strictly, its own rules), trains through `run_train`, records how it is evaluated in model.pt, and is evaluated
through `run_evaluate` by what the model file says (its own similarity), not by the project config. Also: the
registry check of ``TrainConfig.method``."""
from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
import torch
import yaml

from protoclip.project import load_config
from protoclip.errors import ConfigError
from protoclip.models import EvalSpec, read_eval_spec, save_model
from protoclip.config.strict import build, to_dict
from protoclip.train.config import TrainConfig
from protoclip.train.methods.base import Method, register
from protoclip.registry import METHODS, method_class
from protoclip.similarity import Similarity
from testkit import REPO
from testkit.training import tiny_config


# ---- the toy method: everything about it is here; `@register` is its one registration line
@dataclass
class ToyAlignConfig:
    """The toy method's own section, ``train.toy_align``."""
    uniformity_weight: float = 1.0  # weight of the uniformity term

    def validate(self) -> None:
        if self.uniformity_weight < 0:
            raise ValueError("uniformity_weight must be >= 0")


class ToyHeadCosine(Similarity):
    """The toy's evaluation score: the cosine of the projection heads' outputs h^I, h^T (not of z); a prompt
    ensemble is the normalised mean of the prompts' unit h^T."""

    name = "toy_head_cosine"
    dot_product = True

    def pre(self, z, h):
        return torch.nn.functional.normalize(h.float(), dim=1)

    def image(self, z, h):
        return self.pre(z, h)

    def text(self, pre):
        return torch.nn.functional.normalize(pre, dim=1)


@register("toy_align", sections={"toy_align": ToyAlignConfig})
class ToyAlign(Method):
    """Two augmented views of each image pulled together on the sphere of h^I, plus Wang & Isola's uniformity
    term (log E exp(-2 |h_a - h_b|^2) over the batch) so the features do not collapse, plus an InfoNCE of h^I
    against its caption's h^T (scale 10); evaluated by the cosine of h (:class:`ToyHeadCosine`)."""

    similarity = ToyHeadCosine

    @classmethod
    def check_config(cls, cfg: TrainConfig) -> None:
        super().check_config(cfg)
        if cfg.class_tokens:
            raise ValueError("method 'toy_align' has one class token: set class_tokens: 0")

    @classmethod
    def train_transform(cls, cfg: TrainConfig, image_size: int):
        from protoclip.data.loading.transforms import MultiView, train_transform

        aug = train_transform(image_size, cfg.augmentation)
        return MultiView(aug, aug)

    def outputs(self) -> set[str]:
        return {"h_a", "h_b", "h_t"}

    def forward(self, model, images, tokens):
        return {"h_a": model.image_head(model.encode_image(images[0])),
                "h_b": model.image_head(model.encode_image(images[1])),
                "h_t": model.text_head(model.encode_text(tokens))}

    def terms(self, model, out, positions, state):
        a = torch.nn.functional.normalize(out["h_a"].float(), dim=1)
        b = torch.nn.functional.normalize(out["h_b"].float(), dim=1)
        t = torch.nn.functional.normalize(out["h_t"].float(), dim=1)
        pair = torch.nn.functional.cross_entropy(10.0 * a @ t.T, torch.arange(len(a), device=a.device))
        return {"align": (a - b).pow(2).sum(1).mean(), "unif": torch.pdist(a).pow(2).mul(-2).exp().mean().log(),
                "pair": pair}

    def total(self, terms):
        return terms["align"] + self.cfg.toy_align.uniformity_weight * terms["unif"] + terms["pair"]


def test_method_name_is_checked_against_the_registry():
    assert METHODS["toy_align"] is ToyAlign and method_class("toy_align") is ToyAlign
    assert build(TrainConfig, {"method": "toy_align"}).method == "toy_align"
    with pytest.raises(ConfigError, match=r"f\.yaml: method: unknown training method 'nope' \(known: .*toy_align"):
        build(TrainConfig, {"method": "nope"}, "f.yaml")
    with pytest.raises(ConfigError, match="f.yaml: method 'toy_align' has one class token"):
        build(TrainConfig, {"method": "toy_align", "class_tokens": 2}, "f.yaml")  # the method's own rule
    with pytest.raises(ConfigError, match="pauc.enabled needs prototypes: method 'pcl' or 'protoclip'"):
        build(TrainConfig, {"method": "toy_align", "pauc": {"enabled": True}}, "f.yaml")  # the base rule
    with pytest.raises(ValueError, match="registered twice"):
        register("toy_align")(ToyAlign)


def test_a_method_brings_its_config_section():
    """``train.toy_align`` exists because the toy method registered it: built strictly, its defaults in every
    run, its values checked when the config loads, written back beside the declared fields."""
    from protoclip.registry import method_sections

    assert method_sections()["toy_align"] is ToyAlignConfig
    assert TrainConfig().toy_align == ToyAlignConfig()  # every run has it, with its defaults
    cfg = build(TrainConfig, {"method": "toy_align", "toy_align": {"uniformity_weight": "5e-1"}})
    assert cfg.toy_align.uniformity_weight == 0.5 and to_dict(cfg)["toy_align"] == {"uniformity_weight": 0.5}
    assert build(TrainConfig, to_dict(cfg)) == cfg  # the round trip every run's overrides take
    with pytest.raises(ConfigError, match=r"f\.yaml: toy_align\.uniformity_weight must be >= 0"):
        build(TrainConfig, {"method": "toy_align", "toy_align": {"uniformity_weight": -1}}, "f.yaml")
    with pytest.raises(ConfigError, match=r"f\.yaml: unknown key 'toy_align\.weight' \(known keys of 'toy_align': "
                                          r"uniformity_weight\)"):
        build(TrainConfig, {"toy_align": {"weight": 1}}, "f.yaml")
    with pytest.raises(ConfigError, match=r"unknown key 'toy_alignn' \(known keys of '<top>': .*toy_align"):
        build(TrainConfig, {"toy_alignn": {}}, "f.yaml")
    with pytest.raises(ValueError, match="train.toy_align registered twice with different classes"):
        register("toy_other", sections={"toy_align": dict})


def test_shipped_method_rules_and_teacher_needs():
    ok = {"method": "pcl", "lock_image_epoch": None}
    assert build(TrainConfig, ok).method == "pcl"
    for bad, msg in [({"method": "pcl"}, "method 'pcl' trains only the image encoder"),
                     ({"method": "clip", "pauc": {"enabled": True}}, "pauc.enabled needs prototypes"),
                     ({"method": "protoclip", "pauc": {"enabled": True, "align_mode": "two_view"}}, "two_view"),
                     ({"loss": {"proto_weight": 0, "external_weight": 0}}, "is CLIP: use method 'clip'")]:
        with pytest.raises(ConfigError, match=msg):
            build(TrainConfig, bad, "f.yaml")
    build(TrainConfig, {**ok, "pauc": {"enabled": True, "align_mode": "two_view"}})
    reads = {m: build(TrainConfig, {"method": m, "teacher": "t", "lock_image_epoch": None}).reads_teacher()
             for m in ("clip", "protoclip", "nclip", "xclip", "pcl", "toy_align")}
    assert reads == {"clip": False, "protoclip": True, "nclip": False, "xclip": False, "pcl": False,
                     "toy_align": False}
    assert not build(TrainConfig, {"teacher": None}).reads_teacher()
    assert not build(TrainConfig, {"teacher": "t", "loss": {"external_weight": 0.0}}).reads_teacher()


def test_config_registry_check_does_not_import_torch(tmp_path):
    """The config loader consults the methods (names, rules, teacher needs) without importing torch."""
    import subprocess

    code = ("import sys; from protoclip.config.strict import build; from protoclip.train.config import TrainConfig; "
            "c = build(TrainConfig, {'method': 'protoclip', 'teacher': 't'}); assert c.reads_teacher(); "
            "import protoclip.train.methods; print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'numpy', 'open_clip')))")
    src = str(REPO / "src")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == "[]"


def test_importing_the_config_layer_imports_no_method():
    """The config assembler reaches the methods only through the registry, when a config is built."""
    import subprocess

    code = ("import sys, protoclip.project; "
            "print(sorted(m for m in sys.modules if m.startswith('protoclip.train.methods')))")
    src = str(REPO / "src")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == "[]"


def test_eval_spec_of_the_shipped_methods():
    spec = {m: method_class(m).eval_spec(tiny_config(method=m)) for m in ("protoclip", "nclip", "xclip", "pcl")}
    assert {m: (s["similarity"], s["image_only"]) for m, s in spec.items()} == {
        "protoclip": ("cosine", False), "nclip": ("nclip_ce", False), "xclip": ("cosine", False),
        "pcl": ("cosine", True)}
    mt = tiny_config(method="clip", class_tokens=4, loss={"distance": "ps_negtrace"})
    assert method_class("clip").eval_spec(mt) == {"method": "clip", "similarity": "product_sphere",
                                                  "subspheres": 4, "image_only": False}
    assert EvalSpec().similarity == "cosine"
    with pytest.raises(ValueError, match="subspheres >= 1"):
        EvalSpec(subspheres=0)


def test_a_model_file_without_its_evaluation_spec_is_refused(tmp_path):
    from protoclip.models import build_model
    from protoclip.models.checkpoint import ModelFileError

    path = save_model(tmp_path / "m.pt", build_model("tiny-rn", head_hidden=8, head_out=4), {"method": "clip"})
    payload = torch.load(path, weights_only=True)
    del payload["eval_json"]
    torch.save(payload, path)
    with pytest.raises(ModelFileError, match="no evaluation spec"):
        read_eval_spec(path)


def test_toy_method_trains_and_evaluates_through_the_normal_path(tmp_path, monkeypatch):
    """config -> run_train -> model.pt (its spec) -> run_evaluate scoring zero-shot by the toy's own similarity,
    for a method that exists only in this file."""
    from protoclip.data.loading.transforms import eval_transform
    from protoclip.evaluate.config import EvalDatasetConfig, EvaluateConfig
    from protoclip.evaluate.datasets import load_eval_set
    from protoclip.evaluate.stage import run_evaluate
    from protoclip.files.layout import Layout
    from protoclip.models import get_tokenizer, load_model
    from protoclip.files.records import read_train_log as read_log
    from protoclip.train.stage import run_train
    from testkit.evaluation import RecordingTracker, digits_npz
    from testkit.training import stage_project as _project

    torch.set_num_threads(1)
    path = _project(tmp_path, teacher=False)
    raw = yaml.safe_load(path.read_text())
    raw["runs"] = {"toy": {"method": "toy_align", "teacher": None, "toy_align": {"uniformity_weight": 0.5}}}
    path.write_text(yaml.safe_dump(raw))
    cfg = load_config(path)
    out = run_train(cfg, "toy")
    layout = Layout.from_config(cfg)
    assert read_eval_spec(out) == EvalSpec(method="toy_align", similarity="toy_head_cosine", subspheres=1,
                                           image_only=False)
    steps = read_log(layout.train_log("toy"), "step")
    assert steps and all(set(s) >= {"align", "unif", "pair"} for s in steps)
    for s in steps:  # the section's value reached the method: loss = align + 0.5 unif + pair
        assert s["loss"] == pytest.approx(s["align"] + 0.5 * s["unif"] + s["pair"], rel=1e-5, abs=1e-6)

    # evaluation reads the method from the model file: a project config that now says `clip` changes nothing
    cfg._runs = {"toy": ({"method": "clip", "teacher": None}, "<edited after training>")}
    cfg.evaluate = EvaluateConfig(datasets={"digits": EvalDatasetConfig(kind="offline")}, batch_size=8,
                                  device="cpu")
    digits_npz(layout)

    @contextmanager
    def fake_evaluation_run(paths, run, model_sha256, targets):
        yield RecordingTracker()

    monkeypatch.setattr("protoclip.evaluate.stage.evaluation_run", fake_evaluation_run)
    run_evaluate(cfg, "toy", tasks=["knn", "zeroshot"], datasets=["digits"])
    zs = json.loads(layout.metrics("toy", "zeroshot", "digits").read_text())
    assert zs["features"] == "toy_head_cosine similarity (image vs prompt-ensembled text)"
    knn = json.loads(layout.metrics("toy", "knn", "digits").read_text())
    assert 0.0 <= knn["metrics"]["top1"] <= 100.0
    # oracle: the heads' cosine computed here, one image and one class at a time, prompts averaged as unit h^T
    model, _ = load_model(out)
    ds = load_eval_set("digits", cfg.evaluate.datasets["digits"], layout)
    tf, tok = eval_transform(model.image_size), get_tokenizer(model.name, context_length=model.context_length)
    with torch.no_grad():
        classes = []
        for c in ds.classnames:
            ht = model.text_head(model.encode_text(tok([t.format(c) for t in ds.templates]))).double()
            classes.append(torch.nn.functional.normalize(torch.nn.functional.normalize(ht, dim=1).mean(0), dim=0))
        hits = []
        for img, y in ds.test:
            hi = model.image_head(model.encode_image(tf(img)[None])).double()[0]
            scores = torch.stack([torch.dot(hi / hi.norm(), c) for c in classes])
            hits.append(int(scores.argmax()) == int(y))
    assert zs["metrics"]["top1"] == pytest.approx(100.0 * sum(hits) / len(hits))
