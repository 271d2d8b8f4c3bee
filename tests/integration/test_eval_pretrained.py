"""A released checkpoint as a run (``pretrained:``): a run's ``protoclip export`` read back as ``local-dir:`` by
another run with no training job gives the exported run's own evaluation numbers, metrics.json and MLflow metrics.

Offline: the checkpoint is a tiny CLIP saved as a trained run's model.pt (a few AdamW steps on random pairs, so its
weights and learned temperature are no initialisation) and exported; no open_clip tag is downloaded."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from protoclip import models
from protoclip.errors import ConfigError
from protoclip.evaluate.collect import run_collect
from protoclip.evaluate.stage import run_evaluate
from protoclip.files import records
from protoclip.files.hashing import sha256_file
from protoclip.files.layout import Layout
from protoclip.models.export_openclip import WEIGHTS_FILE, export_openclip
from protoclip.models.pretrained import PretrainedError
from protoclip.project import load_config
from protoclip.registry import method_class
from testkit.evaluation import digits_npz, eval_manifest
from testkit.training import one_thread

_threads = pytest.fixture(autouse=True)(one_thread)

TRAINED, RELEASED = "clip_small", "clip_released"
Z_TASKS = ["zeroshot", "linear", "knn", "retrieval", "clustering"]  # the tasks that score z (h: see nemd below)


def write_config(tmp_path: Path, export: Path) -> Path:
    config = {
        "paths": {"data_dir": str(tmp_path / "data"), "results_dir": str(tmp_path / "results"),
                  "mlflow_uri": f"sqlite:///{tmp_path}/mlflow.db", "mlflow_experiment": "pretrained"},
        "train": {"model": "tiny-rn", "head_hidden": 32, "head_out": 16, "teacher": None, "lock_image_epoch": None},
        "evaluate": {"batch_size": 8, "device": "cpu",
                     "datasets": {"digits": {"kind": "offline"}, "heldout_pairs": {"kind": "offline"}}},
        "runs": {TRAINED: {"method": "clip"},
                 RELEASED: {"method": "clip", "pretrained": {"tag": f"local-dir:{export}"}}},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def trained_model(cfg, layout: Layout) -> Path:
    """The run's model.pt as the train stage writes it (its method's eval spec), after 5 AdamW steps of the CLIP
    loss on random image-caption pairs (the logit scale moves too)."""
    tcfg = cfg.run(TRAINED)
    torch.manual_seed(0)
    model = models.build_model("tiny-rn", head_hidden=32, head_out=16)
    tok = models.get_tokenizer("tiny-rn")(["a red cat", "two dogs", "a blue car", "the sun", "a tree", "a boat"])
    images = torch.randn(6, 3, model.image_size, model.image_size)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(5):
        zi = torch.nn.functional.normalize(model.encode_image(images), dim=-1)
        zt = torch.nn.functional.normalize(model.encode_text(tok), dim=-1)
        logits = model.logit_scale.exp() * zi @ zt.T
        target = torch.arange(6)
        loss = (torch.nn.functional.cross_entropy(logits, target) + torch.nn.functional.cross_entropy(logits.T, target))
        opt.zero_grad()
        (loss / 2).backward()
        opt.step()
    from protoclip.config.strict import to_dict

    return models.save_model(layout.model(TRAINED), model, to_dict(tcfg),
                             eval_spec=method_class("clip").eval_spec(tcfg))


def test_local_dir_export_evaluates_to_the_trained_runs_numbers(tmp_path):
    export = tmp_path / "export" / TRAINED
    cfg = load_config(write_config(tmp_path, export))
    layout = Layout.from_config(cfg)
    digits_npz(layout)
    eval_manifest(layout)
    model_pt = trained_model(cfg, layout)
    tasks = Z_TASKS + ["nemd"]

    run_evaluate(cfg, TRAINED, tasks=tasks)
    export_openclip(model_pt, export)
    run_evaluate(cfg, RELEASED, tasks=tasks)  # no model.pt: the checkpoint through open_clip's local-dir:
    for run in (TRAINED, RELEASED):
        run_collect(cfg, run)
    assert not layout.model(RELEASED).exists()
    from protoclip.models.pretrained import load_pretrained

    released, _, _, weights = load_pretrained(None, f"local-dir:{export}")
    trained, _ = models.load_model(model_pt)
    assert weights == export / WEIGHTS_FILE and trained.logit_scale.item() != pytest.approx(np.log(1 / 0.07))
    assert released.logit_scale.item() == trained.logit_scale.item()  # the checkpoint's learned 1/tau, kept

    checked = 0
    for task, ds, path in records.metrics_files(layout, TRAINED):
        ours = json.loads(path.read_text())
        theirs = json.loads(layout.metrics(RELEASED, task, ds).read_text())
        assert theirs["run"] == RELEASED and theirs["model_sha256"] == sha256_file(export / WEIGHTS_FILE)
        if task == "nemd":
            # NEMD's headline reads h (the projection head g^I, not exported: h = z for a released CLIP); its
            # z_image block reads z, which the export keeps
            assert theirs["metrics"]["z_image"] == ours["metrics"]["z_image"]
            assert theirs["metrics"] != ours["metrics"]
            continue
        # the same fp32 weights, tokens and preprocessing: the same numbers, exactly
        assert theirs["metrics"] == ours["metrics"], (task, ds)
        assert {k: v for k, v in theirs.items() if k.startswith("n_")} == {k: v for k, v in ours.items()
                                                                            if k.startswith("n_")}
        examples = layout.examples(TRAINED, task, ds)
        if examples.exists():
            a, b = np.load(examples), np.load(layout.examples(RELEASED, task, ds))
            assert sorted(a.files) == sorted(b.files) and all(np.array_equal(a[k], b[k]) for k in a.files)
        checked += 1
    assert checked == 9  # 5 tasks on digits but retrieval (no captions), 5 on heldout_pairs
    assert 0.0 < json.loads(layout.metrics(TRAINED, "zeroshot", "digits").read_text())["metrics"]["top1"] < 100.0

    # the collected metrics.json (what the report's rows read): the same but for NEMD's h block
    summary = {r: json.loads(layout.metrics_summary(r).read_text()) for r in (TRAINED, RELEASED)}
    for s in summary.values():
        s.pop("nemd")
    assert summary[TRAINED] == summary[RELEASED]

    # MLflow: the released run's evaluation run carries the same eval/ metrics and says what it evaluated
    import mlflow

    mlflow.set_tracking_uri(cfg.paths.mlflow_uri)
    client = mlflow.tracking.MlflowClient()
    exp = client.get_experiment_by_name("pretrained")
    runs = {r.data.tags["protoclip.run"]: r for r in client.search_runs([exp.experiment_id])}
    assert set(runs) == {TRAINED, RELEASED}
    released = runs[RELEASED]
    assert released.data.tags["protoclip.pretrained"] == f"local-dir:{export}"
    assert released.data.params["pretrained.tag"] == f"local-dir:{export}"
    mine = {k: v for k, v in runs[TRAINED].data.metrics.items() if not k.startswith("eval/nemd/")}
    assert mine and mine == {k: v for k, v in released.data.metrics.items() if not k.startswith("eval/nemd/")}


def test_a_missing_local_dir_stops_the_evaluation_naming_it(tmp_path):
    cfg = load_config(write_config(tmp_path, tmp_path / "never_exported"))  # loads: the export may come later
    with pytest.raises(PretrainedError, match="never_exported/open_clip_config.json not found"):
        run_evaluate(cfg, RELEASED, tasks=["zeroshot"], datasets=["digits"])
    from protoclip.train.stage import run_train

    with pytest.raises(ConfigError, match=f"run '{RELEASED}' is a released checkpoint"):
        run_train(cfg, RELEASED)


def test_an_open_clip_tag_loads_its_released_weights_with_their_activation(tmp_path, monkeypatch):
    """``pretrained: {model: RN50, tag: yfcc15m}`` (Tables V-VIII's RN50 CLIP row), offline: open_clip's Hugging Face
    cache holds a stand-in for the released file (random RN50-quickgelu weights under the tag's hub id); the run's
    model is those weights in QuickGELU towers (the tag was trained with QuickGELU, open_clip's RN50 config has
    GELU), its logit scale, and its identity is that file's sha256."""
    import huggingface_hub.constants
    import open_clip
    from safetensors.torch import save_file

    from protoclip.evaluate.features import PretrainedFeatures
    from protoclip.models.pretrained import load_pretrained

    hub_id = open_clip.get_pretrained_cfg("RN50", "yfcc15m")["hf_hub"].strip("/")  # timm/resnet50_clip.yfcc15m
    repo = tmp_path / "hub" / ("models--" + hub_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    torch.manual_seed(0)
    stand_in = open_clip.create_model("RN50-quickgelu")
    with torch.no_grad():
        stand_in.logit_scale.fill_(4.2)
    weights = snapshot / "open_clip_model.safetensors"
    save_file({k: v.contiguous() for k, v in stand_in.state_dict().items()}, weights)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)

    model, tokenizer, transform, found = load_pretrained("RN50", "yfcc15m")
    assert found == weights
    assert model.clip.state_dict().keys() == stand_in.state_dict().keys()
    assert all(torch.equal(v, stand_in.state_dict()[k]) for k, v in model.clip.state_dict().items())
    assert model.logit_scale.item() == pytest.approx(4.2)
    acts = {type(m).__name__ for m in model.clip.transformer.modules()}
    assert "QuickGELU" in acts and "GELU" not in acts
    assert (model.name, model.embed_dim, model.image_size, model.context_length) == ("RN50", 1024, 224, 77)
    assert tokenizer(["a photo of a cat"]).shape == (1, 77)
    from PIL import Image

    assert transform(Image.new("RGB", (300, 260))).shape == (3, 224, 224)
    del model, stand_in
    features = PretrainedFeatures("RN50", "yfcc15m", device="cpu")
    assert features.model_sha256 == sha256_file(weights) and features.similarity.name == "cosine"
    weights.unlink()  # 100M parameters: not left in the kept pytest folders
