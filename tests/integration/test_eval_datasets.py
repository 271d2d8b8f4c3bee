"""Evaluation data set loaders on tiny fixtures each test builds itself (no network, no real data)."""
from __future__ import annotations

import io
import json
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from protoclip.errors import UserError
from protoclip.evaluate.config import EvalDatasetConfig
from protoclip.evaluate.datasets import (
    HELDOUT_TEMPLATES,
    CaptionSet,
    LabelledSet,
    Skipped,
    label_words,
    load_eval_set,
)
from protoclip.evaluate.prompts import load_prompts
from protoclip.files.layout import Layout

RNG = np.random.default_rng(0)


def _img(value: int, size: int = 6) -> Image.Image:
    return Image.fromarray(np.full((size, size, 3), value, dtype=np.uint8))


def _mean(img: Image.Image) -> int:
    return int(round(np.asarray(img).mean()))


def _write_png(path: Path, value: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    _img(value).save(path)
    return path


# --------------------------------------------------------------------------- skipped
def test_null_path_is_skipped(tmp_path):
    out = load_eval_set("cifar10", EvalDatasetConfig(kind="torchvision", path=None), Layout(tmp_path, tmp_path))
    assert out == Skipped("cifar10", "skipped: cifar10 path not configured")


def test_missing_path_is_skipped(tmp_path):
    missing = tmp_path / "nowhere"
    out = load_eval_set("cifar10", EvalDatasetConfig(kind="torchvision", path=str(missing)),
                        Layout(tmp_path, tmp_path))
    assert isinstance(out, Skipped) and out.reason == f"skipped: cifar10 not found at {missing}"


def test_missing_offline_npz_is_skipped(tmp_path):
    layout = Layout(tmp_path / "data", tmp_path / "results")
    out = load_eval_set("digits", EvalDatasetConfig(kind="offline"), layout)
    assert out.reason == f"skipped: digits not found at {layout.eval_set('digits')}"


def test_existing_root_without_torchvision_files_is_skipped(tmp_path):
    out = load_eval_set("stl10", EvalDatasetConfig(kind="torchvision", path=str(tmp_path)), Layout(tmp_path))
    assert isinstance(out, Skipped) and out.reason.startswith(f"skipped: stl10 not found at {tmp_path}")


# --------------------------------------------------------------------------- offline npz
def test_offline_npz(tmp_path):
    layout = Layout(tmp_path / "data", tmp_path / "results")
    n = 12
    images = RNG.integers(0, 255, size=(n, 5, 5, 3), dtype=np.uint8)
    labels = np.arange(n) % 10
    split = np.array(["train"] * 8 + ["test"] * 4)
    layout.eval_set("fashion_mnist").parent.mkdir(parents=True)
    np.savez(layout.eval_set("fashion_mnist"), images=images, labels=labels, split=split,
             classnames=np.array(["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                                  "Sneaker", "Bag", "Ankle boot"]))  # as protoclip.data.corpus.evalsets writes them
    ds = load_eval_set("fashion_mnist", EvalDatasetConfig(kind="offline"), layout)
    assert isinstance(ds, LabelledSet)
    assert (len(ds.train), len(ds.test)) == (8, 4)
    # the prompts JSON's spellings replace the npz names (same classes up to case, same label order)
    assert ds.classnames == load_prompts("fashion_mnist").classnames and ds.classnames[1] == "trouser"
    assert ds.templates == load_prompts("fashion_mnist").templates
    got = list(ds.test)
    assert [y for _, y in got] == list(labels[8:])
    assert np.array_equal(np.asarray(got[0][0]), images[8]) and got[0][0].mode == "RGB"


def test_offline_npz_with_other_class_names_keeps_them(tmp_path):
    layout = Layout(tmp_path / "data", tmp_path / "results")
    layout.eval_set("digits").parent.mkdir(parents=True)
    np.savez(layout.eval_set("digits"), images=np.zeros((4, 3, 3), np.uint8), labels=np.array([0, 1, 0, 1]),
             split=np.array(["train", "train", "test", "test"]), classnames=np.array(["zero", "one"]))
    ds = load_eval_set("digits", EvalDatasetConfig(kind="offline"), layout)
    assert ds.classnames == ["zero", "one"] and ds.templates == load_prompts("digits").templates
    assert np.asarray(next(iter(ds.test))[0]).shape == (3, 3, 3)  # grey [N,H,W] images become RGB


# --------------------------------------------------------------------------- heldout pairs
def test_heldout_pairs_from_manifest(tmp_path):
    layout = Layout(tmp_path / "data", tmp_path / "results")
    rows = []
    for i in range(10):
        split = "heldout" if i >= 6 else "train"
        label = ["animals", "food", ""][i % 3]
        path = _write_png(layout.prepared / "images" / f"{i}.png", 10 * i)
        # relative paths are relative to the prepared-data folder (as protoclip.data writes them)
        rel = path.relative_to(layout.prepared) if i % 2 else path
        rows.append({"id": f"s{i}", "path": str(rel), "caption": f"caption {i}", "source": "t", "label": label,
                     "sha256": "x", "split": split})
    layout.prepared.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(layout.manifest)
    ds = load_eval_set("heldout_pairs", EvalDatasetConfig(kind="offline"), layout)
    assert isinstance(ds, LabelledSet) and ds.templates == HELDOUT_TEMPLATES  # zero-shot on coarse labels
    assert ds.classnames == ["animals", "food"]
    # heldout rows 6..9: labels animals(6), ''(8) excluded, food(7), animals(9)
    assert [(_mean(im), y) for im, y in ds.test] == [(60, 0), (70, 1), (90, 0)]
    assert sorted(y for _, y in ds.train) == [0, 0, 1, 1]  # train rows 0,1,3,4 (2, 5 unlabelled)
    cap = ds.captions
    assert isinstance(cap, CaptionSet) and len(cap.images) == 4
    assert cap.texts == ["caption 6", "caption 7", "caption 8", "caption 9"]
    assert list(cap.text_to_image) == [0, 1, 2, 3]


def test_coarse_label_words_for_zero_shot():
    labels = ["Travel & Places/transport-ground", "animals/mammals", "food", "Food & Drink/food-fruit",
              "nature/mammals", "objects_misc"]
    assert label_words(labels) == ["transport ground", "animals mammals", "food", "food fruit",
                                   "nature mammals", "objects misc"]  # two 'mammals' collide: full paths
    assert len(set(label_words(labels))) == len(labels)


def test_heldout_without_heldout_rows_raises(tmp_path):
    layout = Layout(tmp_path / "data", tmp_path / "results")
    layout.prepared.mkdir(parents=True)
    pd.DataFrame([{"id": "a", "path": "x.png", "caption": "c", "source": "s", "label": "", "sha256": "",
                   "split": "train"}]).to_parquet(layout.manifest)
    with pytest.raises(ValueError, match="heldout"):
        load_eval_set("heldout_pairs", EvalDatasetConfig(kind="offline"), layout)


# --------------------------------------------------------------------------- torchvision CIFAR10
def _cifar10_folder(root: Path, n_per_batch: int = 3) -> dict[str, list[int]]:
    base = root / "cifar-10-batches-py"
    base.mkdir(parents=True)
    labels: dict[str, list[int]] = {"train": [], "test": []}
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for k, name in enumerate(names):
        ys = [(k + j) % 10 for j in range(n_per_batch)]
        values = [20 * k + j for j in range(n_per_batch)]
        data = np.stack([np.full(3072, v, dtype=np.uint8) for v in values])  # [N, 3*32*32] channel-first
        with open(base / name, "wb") as f:
            pickle.dump({"data": data, "labels": ys}, f)
        labels["test" if name == "test_batch" else "train"] += list(zip(values, ys))
    with open(base / "batches.meta", "wb") as f:
        pickle.dump({"label_names": load_prompts("cifar10").classnames}, f)
    return labels


def test_torchvision_cifar10_pickles(tmp_path):
    expected = _cifar10_folder(tmp_path)
    ds = load_eval_set("cifar10", EvalDatasetConfig(kind="torchvision", path=str(tmp_path)), Layout(tmp_path))
    assert isinstance(ds, LabelledSet)
    assert (len(ds.train), len(ds.test)) == (15, 3)
    assert ds.classnames[0] == "airplane" and len(ds.templates) == 18
    assert [(_mean(im), y) for im, y in ds.test] == expected["test"]
    assert [(_mean(im), y) for im, y in ds.train] == expected["train"]


# --------------------------------------------------------------------------- folder tree
def test_folder_tree_matches_prompt_names(tmp_path):
    # UCF101-style CamelCase folders match the JSON names ("Apply Eye Makeup") after normalisation
    for split, n in (("train", 2), ("testlist01", 1)):
        for c, folder in enumerate(["ApplyEyeMakeup", "Archery"]):
            for j in range(n):
                _write_png(tmp_path / split / folder / f"{j}.jpg", 100 * c + j)
    ds = load_eval_set("ucf101", EvalDatasetConfig(kind="folder", path=str(tmp_path)), Layout(tmp_path))
    assert ds.classnames == ["Apply Eye Makeup", "Archery"]  # absent JSON classes are left out
    assert ds.templates == load_prompts("ucf101").templates
    assert [y for _, y in ds.test] == [0, 1] and [y for _, y in ds.train] == [0, 0, 1, 1]


def test_folder_tree_unknown_set_uses_folder_names(tmp_path):
    for c in ("red_car", "blue_boat"):
        _write_png(tmp_path / "test" / c / "a.png", 5)
    ds = load_eval_set("toys", EvalDatasetConfig(kind="folder", path=str(tmp_path)), Layout(tmp_path))
    assert ds.classnames == ["blue boat", "red car"] and ds.templates == [] and ds.train is None


def test_folder_tree_classnames_txt_and_numeric_folders(tmp_path):
    for c in ("000", "001"):
        _write_png(tmp_path / "test" / c / "a.png", 5)
    with pytest.raises(ValueError, match="classnames.txt"):
        load_eval_set("birdsnap", EvalDatasetConfig(kind="folder", path=str(tmp_path)), Layout(tmp_path))
    (tmp_path / "classnames.txt").write_text("Coopers Hawk\nNorthern Goshawk\n")
    ds = load_eval_set("birdsnap", EvalDatasetConfig(kind="folder", path=str(tmp_path)), Layout(tmp_path))
    assert ds.classnames == ["Coopers Hawk", "Northern Goshawk"]
    assert ds.templates == ["a photo of a {}, a type of bird."]


def test_folder_tree_of_class_ids_takes_the_prompts_in_id_order(tmp_path):
    """CLOOB-style trees named by class id: the prompts' list is in id order; numbers sort as numbers."""
    names = load_prompts("gtsrb").classnames
    for c in range(43):  # unpadded numbers: as strings "10" < "2", as ids 2 < 10
        _write_png(tmp_path / "test" / str(c) / "a.png", c)
    ds = load_eval_set("gtsrb", EvalDatasetConfig(kind="folder", path=str(tmp_path)), Layout(tmp_path))
    assert ds.classnames == names
    assert sorted((_mean(img), y) for img, y in ds.test) == [(c, c) for c in range(43)]
    import shutil

    shutil.rmtree(tmp_path / "test" / "42")
    with pytest.raises(UserError, match="42 class folders named by id, but gtsrb has 43 prompt classes"):
        load_eval_set("gtsrb", EvalDatasetConfig(kind="folder", path=str(tmp_path)), Layout(tmp_path))


def test_imagenet_folder_tree_with_wnids(tmp_path):
    wnids = load_prompts("imagenet").wnids  # the 1000 classes' WordNet ids, in label order
    _write_png(tmp_path / "val" / wnids[21] / "x.JPEG", 3)  # a partial tree: labels come from the wnid, not the
    _write_png(tmp_path / "val" / wnids[999] / "y.JPEG", 4)  # folder's rank among the folders present
    ds = load_eval_set("imagenet", EvalDatasetConfig(kind="torchvision", path=str(tmp_path)), Layout(tmp_path))
    assert ds.classnames[21] == "kite (bird of prey)"
    assert [y for _, y in ds.test] == [21, 999]


# --------------------------------------------------------------------------- webdataset shards
def _write_shard(path: Path, samples: list[tuple[str, int, int]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tf:
        for key, label, value in samples:
            buf = io.BytesIO()
            _img(value).save(buf, format="PNG")
            for ext, data in (("cls", str(label).encode()), ("png", buf.getvalue())):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))


def test_wds_clip_benchmark_layout(tmp_path):
    _write_shard(tmp_path / "test" / "0.tar", [("s0", 1, 10), ("s1", 0, 20)])
    _write_shard(tmp_path / "test" / "1.tar", [("s2", 2, 30)])
    _write_shard(tmp_path / "train" / "0.tar", [("t0", 0, 40)])
    (tmp_path / "classnames.txt").write_text("cat\ndog\nbird\n")
    (tmp_path / "zeroshot_classification_templates.txt").write_text("a photo of a {c}.\na drawing of a {c}.\n")
    ds = load_eval_set("pets_wds", EvalDatasetConfig(kind="wds", path=str(tmp_path)), Layout(tmp_path))
    assert ds.classnames == ["cat", "dog", "bird"]
    assert ds.templates == ["a photo of a {}.", "a drawing of a {}."]
    assert len(ds.test) == 3 and len(ds.train) == 1
    assert [(_mean(im), y) for im, y in ds.test] == [(10, 1), (20, 0), (30, 2)]


# --------------------------------------------------------------------------- COCO captions
def _coco_images(root: Path, folder: str, names: list[str]) -> None:
    for i, n in enumerate(names):
        _write_png(root / folder / n, 50 + i)


def test_coco_captions_val2017(tmp_path):
    names = ["000000000003.jpg", "000000000001.jpg", "000000000002.jpg"]
    _coco_images(tmp_path, "val2017", names)
    ann = {"images": [{"id": 3, "file_name": names[0]}, {"id": 1, "file_name": names[1]},
                      {"id": 2, "file_name": names[2]}],
           "annotations": [{"image_id": i, "id": 10 * i + j, "caption": f"img {i} cap {j} "}
                           for i in (1, 2, 3) for j in range(2)]}
    (tmp_path / "annotations").mkdir()
    (tmp_path / "annotations" / "captions_val2017.json").write_text(json.dumps(ann))
    ds = load_eval_set("coco", EvalDatasetConfig(kind="coco", path=str(tmp_path), split="val2017"), Layout(tmp_path))
    assert isinstance(ds, CaptionSet)
    assert ds.captions == [[f"img {i} cap 0", f"img {i} cap 1"] for i in (1, 2, 3)]  # sorted by image id
    assert list(ds.text_to_image) == [0, 0, 1, 1, 2, 2]
    assert [_mean(im) for im, _ in ds.images] == [51, 52, 50]


def test_coco_karpathy_split(tmp_path):
    _coco_images(tmp_path, "val2014", ["a.jpg", "b.jpg", "c.jpg"])
    imgs = [{"filepath": "val2014", "filename": f, "split": s,
             "sentences": [{"raw": f"{f} one"}, {"raw": f"{f} two"}]}
            for f, s in (("a.jpg", "test"), ("b.jpg", "train"), ("c.jpg", "test"))]
    (tmp_path / "dataset_coco.json").write_text(json.dumps({"images": imgs}))
    ds = load_eval_set("coco", EvalDatasetConfig(kind="coco", path=str(tmp_path), split="karpathy_test"),
                       Layout(tmp_path))
    assert ds.captions == [["a.jpg one", "a.jpg two"], ["c.jpg one", "c.jpg two"]]
    assert [_mean(im) for im, _ in ds.images] == [50, 52]


def test_reads_the_digits_set_prepare_writes(tmp_path):
    """Contract with protoclip.data: the npz that `prepare` writes is what the evaluator reads."""
    from protoclip.data.corpus import evalsets
    layout = Layout(tmp_path / "data", tmp_path / "results")
    arrays = evalsets.build_digits()
    evalsets.save_eval_set(layout.eval_set("digits"), arrays)
    ds = load_eval_set("digits", EvalDatasetConfig(kind="offline"), layout)
    is_test = arrays["split"] == "test"
    assert len(ds.test) == int(is_test.sum()) and len(ds.train) == int((~is_test).sum())
    assert ds.classnames == [str(i) for i in range(10)]
    img, y = ds.test[0]
    first = np.flatnonzero(is_test)[0]
    assert y == arrays["labels"][first] and np.array_equal(np.asarray(img), arrays["images"][first])


def test_heldout_pairs_on_the_shared_manifest_fixture(tiny_manifest):
    """Contract with protoclip.data: a manifest as `prepare` writes it (relative paths, seeded split)."""
    df = pd.read_parquet(tiny_manifest.manifest)
    ds = load_eval_set("heldout_pairs", EvalDatasetConfig(kind="offline"), tiny_manifest)
    held = df[df["split"] == "heldout"]
    assert len(ds.captions.images) == len(held) and ds.captions.texts == list(held["caption"])
    assert len(ds.test) == int((held["label"] != "").sum())
    assert ds.classnames == sorted(set(df.loc[df["label"] != "", "label"]))
    img, y = ds.test[0]
    assert img.mode == "RGB" and ds.classnames[y] == held[held["label"] != ""]["label"].iloc[0]
