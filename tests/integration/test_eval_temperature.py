"""The evaluation's `temperature` task on a tiny saved model: model.pt -> FeatureExtractor -> its task adapter,
checked against the temperature-paper quantities computed here from the model's own encodings (float64)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from testkit.training import method_config as _cfg
from testkit.training import method_model as _model
from testkit.training import one_thread, tiny_config

_threads = pytest.fixture(autouse=True)(one_thread)


def _toy_set():
    from protoclip.evaluate.datasets import ArraySplit, CaptionSet, LabelledSet

    rng = np.random.default_rng(0)
    imgs = rng.integers(0, 255, (6, 64, 64, 3), dtype=np.uint8)
    test = ArraySplit(imgs, np.array([0, 1, 2, 0, 1, 2]))
    # image 1 has two captions: its pair is the first one
    caps = CaptionSet("caps", ArraySplit(imgs[:3], np.arange(3)),
                      [["a red cat"], ["a blue car", "a blue van"], ["a green tree"]])
    return LabelledSet("toy", ["cat", "car", "tree"], ["a photo of a {}.", "a {}."], test, captions=caps), imgs


def _features(tmp_path, cfg, ecfg=None):
    """The model, the toy set, its images and what a task reads of it (protoclip.evaluate.adapters.SetInput)."""
    from protoclip.evaluate.adapters import SetInput
    from protoclip.evaluate.config import EvaluateConfig
    from protoclip.evaluate.features import FeatureExtractor
    from protoclip.models import save_model
    from protoclip.registry import method_class
    from protoclip.config.strict import to_dict

    model = _model(cfg).eval()
    save_model(tmp_path / "m.pt", model, to_dict(cfg), eval_spec=method_class(cfg.method).eval_spec(cfg))
    ds, imgs = _toy_set()
    ex = FeatureExtractor(tmp_path / "m.pt", device="cpu", batch_size=4)
    feats = ex.features(tmp_path / "f.npz", ds)
    return model, ds, imgs, SetInput(feats, ds, ecfg or EvaluateConfig(), tmp_path / "f.png", ex.similarity, ex)


def _naive_log_ratio(sim, tau):
    b = len(sim)
    r = [math.exp(tau * sim[i][i]) / (sum(math.exp(tau * sim[i][j]) for j in range(b) if j != i)
                                      + sum(math.exp(tau * sim[j][i]) for j in range(b) if j != i)) for i in range(b)]
    return math.log(sum(r) / b)


def _encode(model, cfg, imgs, texts):
    from protoclip.data.loading.transforms import eval_transform
    from protoclip.models import get_tokenizer

    tf = eval_transform(model.image_size)
    with torch.no_grad():
        zi = model.encode_image(torch.stack([tf(im) for im in imgs])).double()
        zt = model.encode_text(get_tokenizer(cfg.model)(texts)).double()
    return zi, zt


@pytest.mark.parametrize("kind", ["multitoken", "clip"])
def test_temperature_task_matches_the_model(tmp_path, kind):
    from PIL import Image

    from protoclip.evaluate.config import EvaluateConfig
    from protoclip.evaluate.tasks.temperature import TemperatureConfig, task_temperature
    from protoclip.evaluate.tasks.zeroshot import task_zeroshot
    from protoclip.evaluate.plan import too_small
    from protoclip.losses.distances import neg_distance

    cfg = _cfg("multitoken") if kind == "multitoken" else tiny_config(method="clip", model="tiny-vit")
    ecfg = EvaluateConfig(sections={"temperature": TemperatureConfig(
        batch_sizes=[3, 8], shuffle_shares=[0.0], scale_min=0.5, scale_max=50.0, scale_steps=5, histogram_bins=4)})
    model, ds, imgs, x = _features(tmp_path, cfg, ecfg)
    assert too_small("temperature", x.feats, x.similarity) is None
    result = task_temperature(x)
    m, sizes = result.metrics, result.sizes
    assert sizes["n_pairs"] == 3 and result.examples == {} and m["skipped_batch_sizes"] == [8]
    # oracle: the 3 pairs (first caption per image) encoded here; the method's similarity in float64
    zi, zt = _encode(model, cfg, [Image.fromarray(im) for im in imgs[:3]], ["a red cat", "a blue car", "a green tree"])
    sim = (neg_distance(zi, zt, "ps_negtrace", 4) if kind == "multitoken" else neg_distance(zi, zt)).tolist()
    (curve,) = m["sweep"]
    for tau, got in zip(m["scales"], curve["log_mean_ratio"]):
        assert got == pytest.approx(_naive_log_ratio(sim, tau), rel=1e-4, abs=1e-5)
    assert sum(m["histograms"]["pos_image_text"]) == 3 and sum(m["histograms"]["neg_image_text"]) == 6
    assert m["histograms"]["mean_pos_image_text"] == pytest.approx(np.mean([sim[i][i] for i in range(3)]), abs=1e-5)
    if kind == "clip":
        assert "token_subsets" not in m
        return
    # Table 11: zero-shot with 1 of the 4 tokens = per-token cosines averaged over the prompts (logits averaged)
    t = m["token_subsets"]
    assert m["tokens"] == 4 and t["all"] == pytest.approx(task_zeroshot(x).metrics["top1"])
    xi, xt = _encode(model, cfg, [Image.fromarray(im) for im in imgs],
                     [tpl.format(c) for c in ds.classnames for tpl in ds.templates])
    ci = torch.nn.functional.normalize(xi.reshape(6, 4, -1), dim=-1)
    ct = torch.nn.functional.normalize(xt.reshape(3, 2, 4, -1), dim=-1)
    accs = []
    for k in range(4):
        scores = torch.einsum("ic,jpc->ijp", ci[:, k], ct[:, :, k]).mean(2)
        accs.append(100.0 * float((scores.argmax(1) == torch.tensor([0, 1, 2, 0, 1, 2])).float().mean()))
    assert t["sizes"]["1"]["n_subsets"] == 4 and t["sizes"]["1"]["mean"] == pytest.approx(np.mean(accs))
    assert set(t["sizes"]) == {"1", "2"}


def test_temperature_task_not_run_where_it_does_not_apply(tmp_path):
    from protoclip.evaluate.plan import not_applicable, too_small
    from protoclip.similarity import Similarity
    from protoclip.tasks import TaskStatus

    _, ds, _, x = _features(tmp_path, _cfg("nclip"))
    assert too_small("temperature", x.feats, x.similarity) == TaskStatus(
        TaskStatus.TOO_SMALL, "the nclip_ce similarity is not a distance")
    from protoclip.evaluate.set_features import SetFeatures

    cosine_without_captions = SetFeatures(test_z=np.ones((2, 3)), test_y=np.zeros(2, int))
    assert too_small("temperature", cosine_without_captions, Similarity()).reason.startswith("no caption pairs")
    from protoclip.evaluate.datasets import LabelledSet

    assert not_applicable("temperature", LabelledSet("x", ["a"], [], test=[(None, 0)], train=None)) is not None
    assert not_applicable("temperature", ds) is None
