"""Transforms (ProtoCLIP Sec. IV-B3 parameters, shapes, normalisation) and ImageTextDataset / load_manifest."""
from __future__ import annotations

import io
import random
import tarfile

import numpy as np
import pandas as pd
import pytest
import torch
from open_clip.transform import OPENAI_DATASET_MEAN, OPENAI_DATASET_STD, color_jitter, gray_scale
from PIL import Image
from torchvision import transforms as T

from protoclip.data.loading.pairs import ImageTextDataset, load_manifest
from protoclip.data.loading.transforms import eval_transform, normalize_batch, train_transform
from testkit.data import make_png


def steps(tf):
    return tf.transforms


@pytest.mark.parametrize("kind,scale,jitter_p,blur_p,kernel_224", [
    ("simclr", (0.08, 1.0), 0.8, 0.5, 23), ("protoclip", (0.5, 1.0), 0.2, 0.2, 21), ("none", (0.9, 1.0), None, None, None)])
def test_train_transform_parameters(kind, scale, jitter_p, blur_p, kernel_224):
    # protoclip: megvii-research/protoclip src/open_clip/transform.py ('protoclip-light-augmentation');
    # simclr: SimCLR appendix A (s = 1, blur p = 0.5, kernel 10 % of the side)
    tf = train_transform(24, kind)
    crop = next(s for s in steps(tf) if isinstance(s, T.RandomResizedCrop))
    assert crop.scale == scale and crop.size == (24, 24)
    jit = [s for s in steps(tf) if isinstance(s, color_jitter)]
    gray = [s for s in steps(tf) if isinstance(s, gray_scale)]
    flips = [s for s in steps(tf) if isinstance(s, T.RandomHorizontalFlip)]
    if jitter_p is None:
        assert not jit and not gray and not flips
    else:
        assert jit[0].p == jitter_p and gray[0].p == 0.2 and len(flips) == 1
        cj = jit[0].transf
        for rng in (cj.brightness, cj.contrast, cj.saturation):
            assert rng == pytest.approx((0.2, 1.8))  # strength 0.8
        assert cj.hue == pytest.approx((-0.2, 0.2))
        for size, kernel, sigma_max in ((224, kernel_224, 2.0), (24, 3, 2.0 * 24 / 224)):
            blur = next(s for s in steps(train_transform(size, kind)) if isinstance(s, T.RandomApply)
                        and isinstance(s.transforms[0], T.GaussianBlur))
            assert blur.p == blur_p and blur.transforms[0].kernel_size == (kernel, kernel)
            assert blur.transforms[0].sigma == pytest.approx((0.1 * size / 224, sigma_max))
    assert isinstance(steps(tf)[-1], T.PILToTensor)  # uint8 out; normalize_batch on the device


def test_transforms_shapes_and_normalisation():
    white = Image.new("RGBA", (50, 30), (255, 255, 255, 255))
    expected = (1.0 - torch.tensor(OPENAI_DATASET_MEAN)) / torch.tensor(OPENAI_DATASET_STD)
    for tf in (train_transform(32, "protoclip"), train_transform(32, "none"), train_transform(32, "simclr")):
        x = tf(white)
        assert x.shape == (3, 32, 32) and x.dtype == torch.uint8  # normalised on the device (normalize_batch)
    x = normalize_batch(train_transform(32, "none")(white)[None])[0]
    assert x.dtype == torch.float32 and torch.allclose(x.mean(dim=(1, 2)), expected, atol=1e-6)
    assert eval_transform(32)(white).dtype == torch.float32
    x = eval_transform(32)(white)
    assert torch.allclose(x.mean(dim=(1, 2)), expected, atol=1e-4)  # white stays white: no jitter at eval
    with pytest.raises(ValueError, match="unknown augmentation"):
        train_transform(32, "heavy")


def test_eval_transform_centre_crop():
    img = np.zeros((20, 60, 3), np.uint8)
    img[:, 20:40] = 255  # a white centre band, black sides: the centre crop keeps only the band
    x = eval_transform(20)(Image.fromarray(img))
    expected = (1.0 - torch.tensor(OPENAI_DATASET_MEAN)) / torch.tensor(OPENAI_DATASET_STD)
    assert torch.allclose(x.mean(dim=(1, 2)), expected, atol=0.05)


def fake_tokenizer(texts):
    out = torch.zeros(len(texts), 8, dtype=torch.long)
    for i, t in enumerate(texts):
        ids = [len(w) for w in t.split()][:8]
        out[i, : len(ids)] = torch.tensor(ids)
    return out


def test_load_manifest_filters_and_absolute_paths(tiny_manifest):
    df = load_manifest(tiny_manifest)
    assert len(df) == 40 and all(p.startswith("/") for p in df["path"])
    held = load_manifest(tiny_manifest, split="heldout")
    train = load_manifest(tiny_manifest, sources=["tiny"], split="train")
    assert len(held) + len(train) == 40 and not set(held["id"]) & set(train["id"])
    with pytest.raises(ValueError, match="no pairs of source"):
        load_manifest(tiny_manifest, sources=["nope"])
    with pytest.raises(ValueError, match="split"):
        load_manifest(tiny_manifest, split="val")


def test_image_text_dataset_items(tiny_manifest):
    df = load_manifest(tiny_manifest)
    ds = ImageTextDataset(df, eval_transform(16), fake_tokenizer)
    assert len(ds) == 40
    img, tok, sid = ds[3]
    assert img.shape == (3, 16, 16) and tok.dtype == torch.long and tok.shape == (8,)
    assert sid == df.loc[3, "id"]
    assert tok[:3].tolist() == [len(w) for w in df.loc[3, "caption"].split()]
    batch = next(iter(torch.utils.data.DataLoader(ds, batch_size=5)))
    assert batch[0].shape == (5, 3, 16, 16) and batch[1].shape == (5, 8) and len(batch[2]) == 5


def test_a_bytes_transform_gets_the_checked_file_undecoded(tiny_manifest):
    """decode_on: device's workers (EncodedImage): the stored file, checked against the manifest's sha256, and a
    batch of them as a tuple of bytes; a changed file stops the read as for a decoded one."""
    from pathlib import Path

    from protoclip.data.loading.reading import ImageReadError
    from protoclip.data.loading.transforms import EncodedImage

    df = load_manifest(tiny_manifest)
    ds = ImageTextDataset(df, EncodedImage(), fake_tokenizer)
    data, tok, sid = ds[3]
    assert data == Path(df.loc[3, "path"]).read_bytes() and sid == df.loc[3, "id"]
    batch = next(iter(torch.utils.data.DataLoader(ds, batch_size=4)))
    assert [bytes(b) for b in batch[0]] == [Path(p).read_bytes() for p in df["path"][:4]]
    Path(df.loc[5, "path"]).write_bytes(Path(df.loc[6, "path"]).read_bytes())  # another picture's file
    with pytest.raises(ImageReadError, match="changed since"):
        ds[5]


def test_captions_tokenized_once_for_small_frames_per_item_for_large(tiny_manifest):
    """A frame up to ``token_cache_rows`` rows is tokenized in one call at construction and never again (a run's
    every epoch reads the same tokens); above it, once per item (memory flat). Same tokens both ways, for
    open_clip's tokenizer too."""
    import open_clip

    df = load_manifest(tiny_manifest)
    calls = []

    def counting(texts):
        calls.append(len(texts))
        return fake_tokenizer(texts)

    cached = ImageTextDataset(df, eval_transform(16), counting)
    assert calls == [40]
    first = [cached[i][1] for i in range(40)] + [cached[i][1] for i in range(40)]  # two epochs
    assert calls == [40]
    calls.clear()
    per_item = ImageTextDataset(df, eval_transform(16), counting, token_cache_rows=39)
    assert calls == [] and all(torch.equal(per_item[i][1], first[i]) for i in range(40)) and calls == [1] * 40
    assert all(t.dtype == torch.long for t in first)
    tok = open_clip.get_tokenizer("RN50")
    a, b = ImageTextDataset(df, eval_transform(16), tok), ImageTextDataset(df, eval_transform(16), tok, 0)
    assert all(torch.equal(a.tokens(i), b.tokens(i)) and a.tokens(i).shape == (77,) for i in range(40))


def test_an_image_cache_decodes_a_row_once_within_its_budget_and_the_items_stay_the_same(tiny_manifest,
                                                                                         monkeypatch):
    """With ``image_cache_bytes`` a row is read and decoded once however many passes read it, while the
    augmentation still draws on every read: two passes from one seed give the tensors of the uncached dataset
    (a transform that changed the kept image would show in the second pass). Rows past the budget are read
    every time."""
    from protoclip.data.loading import pairs

    df = load_manifest(tiny_manifest)
    reads = []
    real = pairs.read_image
    monkeypatch.setattr(pairs, "read_image", lambda path, *a: reads.append(path) or real(path, *a))
    tf = train_transform(16, "protoclip")

    def two_passes(ds):
        random.seed(0)  # open_clip's colour jitter and greyscale draw from `random`
        torch.manual_seed(0)
        return [ds[i][0] for _ in range(2) for i in range(40)]

    plain = two_passes(ImageTextDataset(df, tf, fake_tokenizer))
    assert len(reads) == 80
    reads.clear()
    assert all(torch.equal(a, b) for a, b in zip(two_passes(ImageTextDataset(df, tf, fake_tokenizer,
                                                                          image_cache_bytes=2**30)), plain))
    assert len(reads) == 40
    sizes = [w * h * 3 for w, h in (Image.open(p).size for p in df["path"])]
    reads.clear()
    ten = ImageTextDataset(df, tf, fake_tokenizer, image_cache_bytes=sum(sizes[:10]))
    assert all(torch.equal(a, b) for a, b in zip(two_passes(ten), plain))
    assert len(reads) == 40 + 30 and ten._images.nbytes == sum(sizes[:10]) and sorted(ten._images.rows) == list(
        range(10))


def test_image_text_dataset_reads_tar_members_with_open_clip_tokenizer(tmp_path):
    import open_clip

    png = make_png(tmp_path / "a.png", "red", "circle", 20).read_bytes()
    with tarfile.open(tmp_path / "s.tar", "w") as tar:
        info = tarfile.TarInfo("k/0001.png")
        info.size = len(png)
        tar.addfile(info, io.BytesIO(png))
    df = pd.DataFrame({"id": ["w/1"], "path": [f"{tmp_path}/s.tar::k/0001.png"], "caption": ["a red circle"]})
    tok = open_clip.get_tokenizer("RN50")
    img, tokens, sid = ImageTextDataset(df, eval_transform(20), tok)[0]
    assert tokens.shape == (77,) and torch.equal(tokens, tok(["a red circle"])[0])
    assert sid == "w/1" and img.shape == (3, 20, 20)
    assert img[0, 10, 10] > img[1, 10, 10]  # the red circle is red


def test_empty_or_broken_manifest_is_a_config_error_naming_the_file(tmp_path):
    from protoclip.data.loading.manifest import to_frame, write_manifest
    from protoclip.errors import ConfigError
    from protoclip.files.layout import Layout

    layout = Layout(tmp_path / "data", tmp_path / "results")
    write_manifest(to_frame([]), layout.manifest)
    with pytest.raises(ConfigError, match="the manifest has no pairs") as err:
        load_manifest(layout, sources=["offline"], split="train")
    assert str(layout.manifest) in str(err.value)
    layout.manifest.write_bytes(b"")  # a zero-byte file (a killed copy, a touch)
    with pytest.raises(ConfigError, match="not a readable manifest"):
        load_manifest(layout)
