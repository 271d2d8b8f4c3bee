"""``model: tv-resnet50``: torchvision's ResNet-50 with PCL's head in place of fc (pcl-protonce.txt l.150; pauc-nemd.txt
l.156), image only: built, checked at config load, saved and loaded, refused by the open_clip export."""
from __future__ import annotations

import pytest
import torch
import torchvision
from torch import nn

from protoclip.config.architectures import check_model
from protoclip.models import build_model, get_tokenizer, load_model, save_model
from protoclip.models.model import MoCoHead
from testkit.training import one_thread


# tiny layers on 2 shared cores: one torch thread (several spin-wait: 20 s instead of 0.7 s per probe)
_threads = pytest.fixture(autouse=True)(one_thread)


@pytest.mark.parametrize("hidden, layers", [
    (0, [(nn.Linear, 2048, 128)]),  # PCL v1 / PAUC: "the last fully-connected layer outputs a 128-D" (l.150 / l.156)
    (2048, [(nn.Linear, 2048, 2048), (nn.ReLU, None, None), (nn.Linear, 2048, 128)]),  # PCL v2's MLP (l.150)
])
def test_tv_resnet50_is_torchvisions_resnet_with_the_head_as_fc(hidden, layers):
    torch.manual_seed(0)
    model = build_model("tv-resnet50", head_hidden=hidden, head_out=128, head="moco", image_size=32).eval()
    assert type(model.clip.visual) is torchvision.models.ResNet and isinstance(model.clip.visual.fc, nn.Identity)
    assert [type(m) for m in model.clip.visual.layer4[0].children()][:2] == [nn.Conv2d, nn.BatchNorm2d]
    assert len(model.clip.visual.layer1) == 3 and len(model.clip.visual.layer3) == 6  # ResNet-50's [3, 4, 6, 3]
    assert isinstance(model.image_head, MoCoHead) and model.text_head is None
    got = [(type(m), getattr(m, "in_features", None), getattr(m, "out_features", None)) for m in model.image_head]
    assert got == layers
    # independently: torchvision's resnet50 whose fc is this head gives h; z is its 2048-d pooled feature
    ref = torchvision.models.resnet50(weights=None)
    ref.fc = nn.Identity()
    ref.load_state_dict(model.clip.visual.state_dict())
    ref.fc = model.image_head
    ref.eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        z = model.encode_image(x)
        assert z.shape == (2, 2048)
        torch.testing.assert_close(model.image_head(z), ref(x))
        torch.testing.assert_close(z, torch.flatten(ref.avgpool(ref.layer4(ref.layer3(ref.layer2(ref.layer1(
            ref.maxpool(ref.relu(ref.bn1(ref.conv1(x))))))))), 1))


def test_no_text_tower():
    model = build_model("tv-resnet50", head_hidden=0, head="moco")
    assert model.image_size == 224  # the papers' input size by default
    assert get_tokenizer("tv-resnet50")(["a cat", "a dog"]).shape == (2, model.context_length)
    with pytest.raises(ValueError, match="no text tower"):
        model(tokens=torch.zeros(2, model.context_length, dtype=torch.long))


def test_check_model_names_the_key():
    check_model("tv-resnet50", image_size=32)
    for kw, key in [({"embed_dim": 512}, "embed_dim"), ({"context_length": 77}, "context_length"),
                    ({"class_tokens": 4}, "class_tokens"), ({"image_size": 16}, "image_size")]:
        with pytest.raises(ValueError, match=key):
            check_model("tv-resnet50", **kw)


def test_config_allows_it_only_for_image_only_methods():
    from protoclip.config.strict import build
    from protoclip.errors import ConfigError
    from protoclip.train.config import TrainConfig

    cfg = build(TrainConfig, {"method": "pcl", "model": "tv-resnet50", "lock_image_epoch": None})
    assert cfg.model == "tv-resnet50"
    with pytest.raises(ConfigError, match="image-only torchvision backbone"):
        build(TrainConfig, {"method": "clip", "model": "tv-resnet50"})


def test_model_file_round_trip_and_export_refused(tmp_path):
    from protoclip.models.export_openclip import ExportError, export_openclip, export_refusal

    torch.manual_seed(0)
    model = build_model("tv-resnet50", head_hidden=0, head="moco", image_size=64)
    path = save_model(tmp_path / "model.pt", model, {"name": "pcl", "method": "pcl"},
                      eval_spec={"method": "pcl", "image_only": True})
    loaded, config = load_model(path)
    assert config["method"] == "pcl" and loaded.image_size == 64 and isinstance(loaded.image_head, MoCoHead)
    for k, v in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    assert "torchvision" in export_refusal("pcl", "pcl", "cosine", 0, "tv-resnet50")
    assert export_refusal("pcl", "pcl", "cosine", 0, "RN50") is None
    with pytest.raises(ExportError, match="torchvision"):
        export_openclip(path, tmp_path / "export")
