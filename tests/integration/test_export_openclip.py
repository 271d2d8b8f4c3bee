"""`protoclip export`: a trained model leaves the project as an open_clip ``local-dir:`` folder that open_clip loads
with the same embeddings, preprocessing and tokens, and that CLIP_benchmark's own zero-shot and retrieval code
(clip-benchmark 1.6.2, imported as a library, offline) scores as the project's evaluation does. Methods open_clip
cannot represent stop with one line (exit 2)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import open_clip
import pytest
import torch
import yaml
from PIL import Image

from protoclip.data.loading.transforms import eval_transform
from protoclip.models import build_model, get_tokenizer, load_model, save_model
from protoclip.models.export_openclip import CONFIG_FILE, WEIGHTS_FILE, ExportError, export_openclip
from protoclip.config.strict import to_dict
from protoclip.train.config import TrainConfig
from protoclip.registry import method_class
from testkit import REPO
from testkit.training import WORDS, one_thread

_threads = pytest.fixture(autouse=True)(one_thread)


def saved_model(tmp_path: Path, name: str = "tiny-vit", method: str = "clip", seed: int = 0, **build) -> Path:
    """A tiny random model (32 px, context 24: both overrides of the open_clip config) saved as a run's model.pt."""
    torch.manual_seed(seed)
    model = build_model(name, head_hidden=32, head_out=16, image_size=32, context_length=24, **build)
    with torch.no_grad():
        model.clip.logit_scale.fill_(3.1)  # a learned 1/tau that differs from the init
    tcfg = TrainConfig(name=f"r_{method}", method=method, model=name, image_size=32, teacher=None,
                       lock_image_epoch=None, class_tokens=int(build.get("class_tokens", 0)))
    # the evaluation spec as the train stage records it (the method's similarity, image-only flag)
    spec = method_class(method).eval_spec(tcfg)
    return save_model(tmp_path / f"{name}_{method}.pt", model, to_dict(tcfg), eval_spec=spec)


def images(n: int, size: int = 40, seed: int = 0) -> list[Image.Image]:
    rng = np.random.default_rng(seed)  # not the model's 32 px: the transform's resize + crop is part of the check
    return [Image.fromarray(rng.integers(0, 255, (size, size + 8, 3), dtype=np.uint8)) for _ in range(n)]


@pytest.mark.parametrize("name", ["tiny-vit", "tiny-rn"])
def test_open_clip_loads_the_export_with_the_same_embeddings(tmp_path, name):
    path = saved_model(tmp_path, name)
    out = export_openclip(path, tmp_path / "export")
    assert sorted(p.name for p in out.iterdir()) == [CONFIG_FILE, WEIGHTS_FILE]

    ours, _ = load_model(path)
    oc, _, preprocess = open_clip.create_model_and_transforms(f"local-dir:{out}")
    oc.eval()
    tokenizer = open_clip.get_tokenizer(f"local-dir:{out}")
    assert oc.logit_scale.item() == pytest.approx(3.1)

    imgs = images(5)
    x_ours = torch.stack([eval_transform(ours.image_size)(im) for im in imgs])
    x_oc = torch.stack([preprocess(im) for im in imgs])
    assert torch.equal(x_ours, x_oc)  # the same preprocessing (size, crop, mean / std, bicubic)
    texts = ["a red cat", "two dogs on a boat under the moon", "a photo of a tree"]
    tok_ours = get_tokenizer(name, context_length=ours.context_length)(texts)
    tok_oc = tokenizer(texts)
    assert tok_oc.shape == (3, 24) and torch.equal(tok_ours, tok_oc)
    with torch.no_grad():
        torch.testing.assert_close(oc.encode_image(x_oc), ours.encode_image(x_ours), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(oc.encode_text(tok_oc), ours.encode_text(tok_ours), rtol=1e-5, atol=1e-5)

    meta = json.loads((out / CONFIG_FILE).read_text())["protoclip"]
    assert meta["run"] == "r_clip" and meta["method"] == "clip" and len(meta["notes"]) == 1


def test_methods_open_clip_cannot_represent_stop_with_a_reason(tmp_path):
    with pytest.raises(ExportError, match="multi-class-token"):
        export_openclip(saved_model(tmp_path, "tiny-vit", method="clip", class_tokens=2), tmp_path / "mt")
    with pytest.raises(ExportError, match="nclip_ce"):
        export_openclip(saved_model(tmp_path, "tiny-rn", method="nclip", head="nclip"), tmp_path / "nclip")
    assert not (tmp_path / "mt" / CONFIG_FILE).exists() and not (tmp_path / "nclip" / CONFIG_FILE).exists()
    out = export_openclip(saved_model(tmp_path, "tiny-rn", method="pcl"), tmp_path / "pcl")
    notes = json.loads((out / CONFIG_FILE).read_text())["protoclip"]["notes"]
    assert any("text tower is untrained" in n for n in notes)


def test_cli_export_writes_the_folder_and_refuses_in_one_line(tmp_path):
    cfg = {"paths": {"data_dir": str(tmp_path / "data"), "results_dir": str(tmp_path / "results"),
                     "mlflow_uri": f"sqlite:///{tmp_path}/mlflow.db"},
           "train": {"model": "tiny-rn", "teacher": None, "lock_image_epoch": None},
           "runs": {"r_clip": {"method": "clip"}, "r_nclip": {"method": "nclip"}}}
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(cfg))
    runs = tmp_path / "results" / "runs"
    for run, method, head in (("r_clip", "clip", "swav"), ("r_nclip", "nclip", "nclip")):
        (runs / run).mkdir(parents=True)
        saved_model(tmp_path, "tiny-rn", method=method, head=head).rename(runs / run / "model.pt")
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "protoclip.cli", "export", "--config", str(config), *args],
                              env=env, capture_output=True, text=True, timeout=300)

    ok = cli("--run", "r_clip")
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "results" / "export" / "r_clip" / WEIGHTS_FILE).is_file()
    bad = cli("--run", "r_nclip", "--out", str(tmp_path / "x"))
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines()[-1].startswith("protoclip export: cannot export: run 'r_nclip'")


# --------------------------------------------------------------------------- CLIP_benchmark on the exported model
class _Images(torch.utils.data.Dataset):
    """A labelled split as CLIP_benchmark's datasets are: (transformed image, label) items and ``.classes``."""

    def __init__(self, split, transform, classes):
        self.split, self.transform, self.classes = split, transform, list(classes)

    def __len__(self):
        return len(self.split)

    def __getitem__(self, i):
        img, y = self.split[i]
        return self.transform(img), y


def test_clip_benchmark_scores_the_export_as_the_project_does(tmp_path):
    """CLIP_benchmark's zero-shot classification (prompt ensemble, top-1 / top-5) and retrieval (R@1/5/10 both
    ways) on the exported model give the project's numbers for the same protocol on an offline set (sklearn
    digits, the offline default's ``digits``, 150 test images with the project's prompts; 60 of them with two
    unique captions each)."""
    from clip_benchmark.metrics import zeroshot_classification, zeroshot_retrieval

    from protoclip.data.corpus.evalsets import build_digits
    from protoclip.evaluate.adapters import SetInput, zeroshot_classifier
    from protoclip.evaluate.config import EvaluateConfig
    from protoclip.evaluate.datasets import ArraySplit, CaptionSet, load_offline_npz
    from protoclip.evaluate.features import FeatureExtractor
    from protoclip.evaluate.metrics.retrieval import retrieval_recall
    from protoclip.evaluate.metrics.zeroshot import zeroshot_classify

    arrays = build_digits()
    test = np.flatnonzero(arrays["split"] == "test")[:150]
    npz = tmp_path / "digits.npz"
    np.savez(npz, **{k: (v[test] if k != "classnames" else v) for k, v in arrays.items()})
    ds = load_offline_npz("digits", npz)
    assert ds.templates and ds.train is None
    rng = np.random.default_rng(0)
    cap_imgs = ArraySplit(arrays["images"][test[:60]], np.arange(60))
    captions = [[f"{' '.join(rng.choice(WORDS, 3))} digit {ds.classnames[y]} number {i} {j}" for j in range(2)]
                for i, y in enumerate(arrays["labels"][test[:60]])]
    caps = CaptionSet("digit_captions", cap_imgs, captions)

    path = saved_model(tmp_path, "tiny-vit")
    ex = FeatureExtractor(path, device="cpu", batch_size=64)
    f = ex.extract(ds)
    classes = zeroshot_classifier(SetInput(f, ds, EvaluateConfig(), tmp_path / "f.png", ex.similarity, ex))
    ours_zs = zeroshot_classify(f.test_z, classes, f.test_y)
    g = ex.extract(caps)
    ours_ret = retrieval_recall(g.caption_image_z, g.caption_text_z, g.caption_text_to_image)

    out = export_openclip(path, tmp_path / "export")
    model, _, preprocess = open_clip.create_model_and_transforms(f"local-dir:{out}")
    model.eval()
    tokenizer = open_clip.get_tokenizer(f"local-dir:{out}")
    loader = torch.utils.data.DataLoader(_Images(ds.test, preprocess, ds.classnames), batch_size=64)
    templates = [t.replace("{}", "{c}") for t in ds.templates]  # CLIP_benchmark fills `{c}`
    # CLIP_benchmark's protocol: its prompt-ensembled classifier and its logits. Its `evaluate` ends in `accuracy`,
    # whose float() of a 1-element array raises under NumPy >= 2.4 (LAION-AI/CLIP_benchmark issue #147, open), so
    # top-k is counted here from its logits
    classifier = zeroshot_classification.zero_shot_classifier(model, tokenizer, ds.classnames, templates, "cpu",
                                                              amp=False)
    logits, target = zeroshot_classification.run_classification(model, classifier, loader, "cpu", amp=False)
    for k in (1, 5):
        cb_topk = 100 * (logits.topk(k, dim=1).indices == target[:, None]).any(1).double().mean().item()
        assert cb_topk == pytest.approx(ours_zs[f"top{k}"], abs=1e-9)

    cap_loader = torch.utils.data.DataLoader(
        [(preprocess(cap_imgs[i][0]), captions[i]) for i in range(len(captions))], batch_size=16,
        collate_fn=lambda b: (torch.stack([x for x, _ in b]), [c for _, c in b]))  # CLIP_benchmark's COCO collate
    cb_ret = zeroshot_retrieval.evaluate(model, cap_loader, tokenizer, "cpu", amp=False, recall_k_list=[1, 5, 10])
    for k in (1, 5, 10):  # CLIP_benchmark's recalls are float32 fractions: equal up to its rounding (one hit = 0.8)
        assert 100 * cb_ret[f"image_retrieval_recall@{k}"] == pytest.approx(ours_ret[f"text_to_image_R@{k}"], abs=1e-4)
        assert 100 * cb_ret[f"text_retrieval_recall@{k}"] == pytest.approx(ours_ret[f"image_to_text_R@{k}"], abs=1e-4)


def test_exportable_runs_are_read_from_the_config(tmp_path):
    from protoclip.project import load_config
    from protoclip.dag.stages import exportable_runs

    cfg = {"paths": {"data_dir": str(tmp_path / "data"), "results_dir": str(tmp_path / "results")},
           "train": {"model": "tiny-vit", "teacher": None, "lock_image_epoch": None},
           "runs": {"a_clip": {"method": "clip"}, "b_proto": {"method": "protoclip"}, "c_nclip": {"method": "nclip"},
                    "d_xclip": {"method": "xclip"}, "e_multi": {"method": "clip", "class_tokens": 2},
                    "f_pcl": {"method": "pcl"}}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    assert exportable_runs(load_config(tmp_path / "config.yaml")) == ["a_clip", "b_proto", "d_xclip", "f_pcl"]


def test_snakemake_export_all_exports_every_exportable_run():
    """`snakemake export_all` (not part of `all`) plans one `protoclip export` job per run open_clip can represent."""
    import re

    from protoclip.project import load_config
    from protoclip.dag.stages import exportable_runs

    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    out = subprocess.run([sys.executable, "-m", "snakemake", "export_all", "-n", "--quiet", "rules"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    counts = dict(re.findall(r"^(\w+)\s+(\d+)$", out.stdout + out.stderr, flags=re.M))
    runs = exportable_runs(load_config(REPO / "config" / "config.yaml"))
    assert int(counts["export"]) == len(runs) and "methods_nclip" not in runs
