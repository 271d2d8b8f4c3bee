"""A training method is one module plus one registration line: a toy method defined here (and nowhere else),
with a config section of its own, is validated by the config loader (its section strictly, its own rules),
trains through `run_train`, records how it is evaluated in model.pt, and is evaluated through `run_evaluate` by
what the model file says, not by the project config. Also: the registry check of ``TrainConfig.method`` and the
fallback for model files saved before they carried an evaluation spec."""
from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
import torch
import yaml

from protoclip.config import load_config
from protoclip.errors import ConfigError
from protoclip.models import EvalSpec, read_eval_spec, save_model
from protoclip.models.checkpoint import legacy_eval_spec
from protoclip.schema import build, to_dict
from protoclip.train.config import TrainConfig
from protoclip.train.methods.base import Method, MultiView, register
from protoclip.train.registry import METHODS, method_class
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


@register("toy_align", sections={"toy_align": ToyAlignConfig})
class ToyAlign(Method):
    """Image-only: two augmented views of each image pulled together on the sphere of h^I, plus Wang & Isola's
    uniformity term (log E exp(-2 |h_a - h_b|^2) over the batch) so the features do not collapse."""

    image_only = True  # the text tower is never trained: zero-shot / retrieval are not applicable

    @classmethod
    def check_config(cls, cfg: TrainConfig) -> None:
        super().check_config(cfg)
        if cfg.class_tokens:
            raise ValueError("method 'toy_align' has one class token: set class_tokens: 0")

    @classmethod
    def train_transform(cls, cfg: TrainConfig, image_size: int):
        from protoclip.data.transforms import train_transform

        aug = train_transform(image_size, cfg.augmentation)
        return MultiView(aug, aug)

    def outputs(self) -> set[str]:
        return {"h_a", "h_b"}

    def forward(self, model, images, tokens):
        return {"h_a": model.image_head(model.encode_image(images[0])),
                "h_b": model.image_head(model.encode_image(images[1]))}

    def terms(self, model, out, positions, state):
        a = torch.nn.functional.normalize(out["h_a"].float(), dim=1)
        b = torch.nn.functional.normalize(out["h_b"].float(), dim=1)
        return {"align": (a - b).pow(2).sum(1).mean(), "unif": torch.pdist(a).pow(2).mul(-2).exp().mean().log()}

    def total(self, terms):
        return terms["align"] + self.cfg.toy_align.uniformity_weight * terms["unif"]


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
    from protoclip.train.registry import method_sections

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

    code = ("import sys; from protoclip.schema import build; from protoclip.train.config import TrainConfig; "
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

    code = ("import sys, protoclip.config; "
            "print(sorted(m for m in sys.modules if m.startswith('protoclip.train.methods')))")
    src = str(REPO / "src")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == "[]"


# the rules of the five methods before model files carried their spec, one config each way they differ
LEGACY_CASES = [dict(method="protoclip"), dict(method="clip"), dict(method="xclip"), dict(method="nclip"),
                dict(method="pcl"), dict(method="clip", class_tokens=4, loss={"distance": "ps_negtrace"}),
                dict(method="clip", class_tokens=4, loss={"distance": "ps_geodesic", "subspheres": 2}),
                dict(method="clip", class_tokens=3), dict(method="nclip", class_tokens=2)]


@pytest.mark.parametrize("case", LEGACY_CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_legacy_model_files_get_the_spec_their_method_gives(tmp_path, case):
    cfg = tiny_config(**case)
    want = EvalSpec(**method_class(cfg.method).eval_spec(cfg))
    assert legacy_eval_spec(json.loads(json.dumps(to_dict(cfg)))) == want
    # a file without eval_json (as saved before it existed) is read through the fallback
    from protoclip.models import build_model

    path = save_model(tmp_path / "m.pt", build_model("tiny-rn", head_hidden=8, head_out=4), to_dict(cfg))
    payload = torch.load(path, weights_only=True)
    del payload["eval_json"]
    torch.save(payload, path)
    assert read_eval_spec(path) == want


def test_eval_spec_of_the_shipped_methods():
    spec = {m: method_class(m).eval_spec(tiny_config(method=m)) for m in ("protoclip", "nclip", "xclip", "pcl")}
    assert {m: (s["similarity"], s["image_only"]) for m, s in spec.items()} == {
        "protoclip": ("cosine", False), "nclip": ("nclip_ce", False), "xclip": ("cosine", False),
        "pcl": ("cosine", True)}
    mt = tiny_config(method="clip", class_tokens=4, loss={"distance": "ps_negtrace"})
    assert method_class("clip").eval_spec(mt) == {"method": "clip", "similarity": "product_sphere",
                                                  "subspheres": 4, "image_only": False}
    assert legacy_eval_spec({}) == EvalSpec() and EvalSpec().similarity == "cosine"
    with pytest.raises(ValueError, match="similarity must be one of"):
        EvalSpec(similarity="dot")


def test_toy_method_trains_and_evaluates_through_the_normal_path(tmp_path, monkeypatch):
    """config -> run_train -> model.pt (its spec) -> run_evaluate, for a method that exists only in this file."""
    from protoclip.evaluate.config import EvalDatasetConfig, EvaluateConfig
    from protoclip.evaluate.stage import run_evaluate
    from protoclip.layout import Layout
    from protoclip.records import read_train_log as read_log
    from protoclip.tasks import NOT_APPLICABLE
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
    assert read_eval_spec(out) == EvalSpec(method="toy_align", similarity="cosine", subspheres=1, image_only=True)
    steps = read_log(layout.train_log("toy"), "step")
    assert steps and all(set(s) >= {"align", "unif"} for s in steps)
    for s in steps:  # the section's value reached the method: loss = align + 0.5 unif
        assert s["loss"] == pytest.approx(s["align"] + 0.5 * s["unif"], rel=1e-5, abs=1e-6)

    # evaluation reads the method from the model file: a project config that now says `clip` changes nothing
    cfg._runs = {"toy": ({"method": "clip", "teacher": None}, "<edited after training>")}
    cfg.evaluate = EvaluateConfig(datasets={"digits": EvalDatasetConfig(kind="offline")}, batch_size=8,
                                  device="cpu")
    digits_npz(layout)

    @contextmanager
    def fake_evaluation_run(cfg_, run, model_sha256, targets=None):
        yield RecordingTracker()

    monkeypatch.setattr("protoclip.evaluate.stage.evaluation_run", fake_evaluation_run)
    run_evaluate(cfg, "toy", tasks=["knn", "zeroshot"], datasets=["digits"])
    zs = json.loads(layout.metrics("toy", "zeroshot", "digits").read_text())
    assert zs["skipped"].startswith(f"{NOT_APPLICABLE}image-only method (toy_align)") and "metrics" not in zs
    knn = json.loads(layout.metrics("toy", "knn", "digits").read_text())
    assert 0.0 <= knn["metrics"]["top1"] <= 100.0
