"""``train.augment_on: device``: the workers crop and flip, the loader applies the colour steps on the device
(protoclip.data.loading.device_augment). A tiny ProtoCLIP run on real images trains the same weights with one worker,
two workers, and cut after an episode and resumed; it differs from the run augmented in the workers; a three-view
method (PCL: two augmented views, one float centre crop) trains with it. ``train.decode_on: device`` (the workers
read the files, the device decodes, crops and flips): the same exactness on JPEG files; the combinations it cannot
run are refused."""
from __future__ import annotations

import dataclasses
import io
import random

import pytest
import torch
from PIL import Image

from protoclip.data.loading.transforms import image_form
from protoclip.files.layout import Layout
from protoclip.train.loop import train
from protoclip.train.methods.base import method_class
from testkit.training import PilPairs, last_state, one_thread, tiny_config, tiny_model

_threads = pytest.fixture(autouse=True)(one_thread)


class JpegPairs(PilPairs):
    """PilPairs stored as JPEG files (quality 90): a transform whose form is the stored file gets the file, others
    the decoded picture, as ImageTextDataset does."""

    def __init__(self, transform, n: int = 48):
        super().__init__(transform, n=n)
        self.files = []
        for img in self.images:
            buf = io.BytesIO()
            img.save(buf, format="JPEG", quality=90)
            self.files.append(buf.getvalue())
        self.images = [Image.open(io.BytesIO(f)).convert("RGB") for f in self.files]

    def __getitem__(self, i: int):
        if image_form(self.transform).stored:
            return self.transform(self.files[i]), self.tokens[i], f"s{i:04d}"
        return super().__getitem__(i)


def run(tmp_path, name: str, cfg, cut: int | None = None) -> dict[str, torch.Tensor]:
    pairs = JpegPairs if cfg.decode_on == "device" else PilPairs
    data = pairs(method_class(cfg.method).train_transform(cfg, 64), n=48)
    layout = Layout(tmp_path / "data", tmp_path / name)
    random.seed(cfg.seed)
    model = train(tiny_model(cfg), data, cfg, layout.train_files("r"), stop_after_episodes=cut)
    if cut is not None:
        torch.manual_seed(1234)  # a fresh process: the resume restores what it needs
        model = train(tiny_model(cfg, seed=99), data, cfg, layout.train_files("r"), state=last_state(layout, "r", cfg))
    return model.state_dict()


@pytest.mark.parametrize("decode_on", ["workers", "device"])
def test_the_device_path_is_exact_across_workers_and_resume(tmp_path, decode_on):
    """Colour on the device (decode_on: workers), and decoding too (device): one worker, two, and two cut after an
    episode and resumed train the same weights; the path really differs from the one before it."""
    cfg = tiny_config(episode_size=16, batch_size=8, epochs=1.0, augment_on="device", decode_on=decode_on,
                      num_workers=1)  # 48 pairs: 3 episodes
    one = run(tmp_path, "one", cfg)
    two = run(tmp_path, "two", dataclasses.replace(cfg, num_workers=2))
    cut = run(tmp_path, "cut", dataclasses.replace(cfg, num_workers=2), cut=1)
    for k in one:
        assert torch.equal(one[k], two[k]) and torch.equal(one[k], cut[k]), k
    before = {"decode_on": "workers"} if decode_on == "device" else {"augment_on": "workers"}
    other = run(tmp_path, "before", dataclasses.replace(cfg, **before))
    assert any(not torch.equal(one[k], other[k]) for k in one if one[k].is_floating_point())


def test_a_three_view_method_trains_with_device_augmentation(tmp_path):
    from protoclip.train.config import PAUCConfig
    from protoclip.train.methods.pcl import PCLConfig

    cfg = tiny_config(method="pcl", augmentation="mocov2", augment_on="device", episode_size=16, batch_size=8,
                      epochs=1.0)
    pcl = PCLConfig(tau=0.2, momentum=0.9, queue_size=16, negatives=4, num_clusters=[2, 4], infonce_only_episodes=1,
                    kmeans_iters=5, kmeans_redo=1)
    cfg = dataclasses.replace(cfg, sections={**cfg.sections, "pcl": pcl}, pauc=PAUCConfig())
    state = run(tmp_path, "pcl", cfg)
    assert all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point())


def test_device_decoding_is_refused_where_it_cannot_run():
    with pytest.raises(ValueError, match="augment_on: device"):
        tiny_config(decode_on="device").validate()
    with pytest.raises(ValueError, match="one-view"):
        tiny_config(method="pcl", augmentation="mocov2", lock_image_epoch=None, augment_on="device",
                    decode_on="device").validate()
