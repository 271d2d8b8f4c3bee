"""Broken evaluation data stops with one line naming the file: a truncated image inside a webdataset
shard, a cut shard, a non-image file in an image folder or a torchvision set, a cut or foreign offline .npz.

Each case goes through `load_eval_set` and the feature extraction loader (`image_batches`); one case per kind goes
through the real `protoclip evaluate` CLI in a subprocess (exit 2, one stderr line, no traceback)."""
from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from protoclip.errors import UserError
from protoclip.evaluate.config import EvalDatasetConfig
from protoclip.evaluate.datasets import load_eval_set
from protoclip.files.layout import Layout
from testkit import REPO


def _png(value: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((8, 8, 3), value, np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def _jpeg(value: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(value).integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(buf, "JPEG")
    return buf.getvalue()


def _shard(path: Path, members: list[tuple[str, bytes]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def _wds_set(root: Path, bad: str) -> str:
    """clip_benchmark layout with one broken test shard; returns what the error line must name."""
    (root / "classnames.txt").write_text("cat\ndog\n")
    _shard(root / "train" / "0.tar", [("t.cls", b"0"), ("t.png", _png(5)), ("u.cls", b"1"), ("u.png", _png(25))])
    _shard(root / "test" / "0.tar", [("a.cls", b"0"), ("a.png", _png(10)), ("b.cls", b"1"), ("b.png", _png(20))])
    shard = root / "test" / "1.tar"
    jpg = _jpeg(1)
    if bad == "truncated_jpeg":
        _shard(shard, [("c.cls", b"0"), ("c.jpg", jpg[: len(jpg) // 2]), ("d.cls", b"1"), ("d.png", _png(30))])
        return f"{shard}::c.jpg"
    _shard(shard, [("c.cls", b"0"), ("c.jpg", jpg), ("d.cls", b"1"), ("d.jpg", _jpeg(2))])  # cut shard
    data = shard.read_bytes()
    shard.write_bytes(data[: 512 + len(jpg) + 1024 + 100])  # inside d.jpg's header / data
    return str(shard)


def _folder_set(root: Path) -> str:
    for cls, v in (("cat", 10), ("dog", 20)):
        (root / "test" / cls).mkdir(parents=True)
        (root / "test" / cls / "0.png").write_bytes(_png(v))
    bad = root / "test" / "dog" / "1.jpg"
    bad.write_text("not an image, e.g. an HTML error page saved as .jpg\n")
    return str(bad)


def _dtd_set(root: Path) -> str:
    """torchvision's DTD layout (the 47 classes, one image each) with one non-image file."""
    from protoclip.evaluate.prompts import load_prompts

    base = root / "dtd" / "dtd"
    (base / "labels").mkdir(parents=True)
    lines = []
    classes = load_prompts("dtd").classnames
    for c, name in enumerate(classes):
        (base / "images" / name).mkdir(parents=True)
        (base / "images" / name / "0.jpg").write_bytes(_png(c))
        lines.append(f"{name}/0.jpg")
    bad = base / "images" / classes[5] / "0.jpg"
    bad.write_bytes(b"GIF89a cut")
    for s in ("train1", "test1"):
        (base / "labels" / f"{s}.txt").write_text("\n".join(lines) + "\n")
    return str(bad)


def _npz(path: Path, bad: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)  # noise: a compressed file that a cut leaves without its directory
    np.savez_compressed(path, images=rng.integers(0, 255, (8, 16, 16, 3), dtype=np.uint8),
                        labels=np.repeat(np.arange(2), 4), split=np.array(["train", "test"] * 4),
                        classnames=np.array(["a", "b"]))
    data = path.read_bytes()
    path.write_bytes({"cut": data[: len(data) // 2], "empty": b"", "text": b"images: none\n",
                      "pickle": b"\x80\x04K\x01."}[bad])
    return str(path)


def _make(kind: str, tmp_path: Path) -> tuple[str, EvalDatasetConfig, str]:
    """(set name, its config, what the one line must name) for a broken set of ``kind``."""
    root = tmp_path / "set"
    if kind.startswith("wds"):
        root.mkdir()
        return "pets_wds", EvalDatasetConfig(kind="wds", path=str(root)), _wds_set(root, kind[4:])
    if kind == "folder":
        return "toys", EvalDatasetConfig(kind="folder", path=str(root)), _folder_set(root)
    if kind == "torchvision":
        return "dtd", EvalDatasetConfig(kind="torchvision", path=str(root)), _dtd_set(root)
    if kind == "dtd_classes":  # a class that is not DTD's: the data is not the set the prompts name
        _dtd_set(root)
        labels = root / "dtd" / "dtd" / "labels" / "test1.txt"
        labels.write_text(labels.read_text().replace("banded/", "plaid/"))
        (root / "dtd" / "dtd" / "images" / "plaid").mkdir()
        return "dtd", EvalDatasetConfig(kind="torchvision", path=str(root)), str(root / "dtd")
    path = tmp_path / "set.npz"
    return "digits", EvalDatasetConfig(kind="offline", path=str(path)), _npz(path, kind[4:])


def _extract(ds) -> int:
    """Every image of every split through the feature extraction loader; the number of images read."""
    from protoclip.evaluate.batches import image_batches

    def transform(img):
        import torchvision.transforms.functional as F
        return F.to_tensor(img.resize((8, 8)))

    n = 0
    for split in (ds.train, ds.test):
        if split is not None:
            n += sum(len(y) for _, y in image_batches(split, transform, batch_size=2))
    return n


KINDS = ["wds_truncated_jpeg", "wds_cut", "folder", "torchvision", "npz_cut", "npz_empty", "npz_text", "npz_pickle"]


@pytest.mark.parametrize("kind", KINDS)
def test_broken_eval_data_is_one_line_naming_the_file(kind, tmp_path):
    name, cfg, names = _make(kind, tmp_path)
    with pytest.raises(UserError) as err:
        _extract(load_eval_set(name, cfg, Layout(tmp_path)))
    msg = str(err.value)
    assert msg.startswith(f"{names}: ") and "\n" not in msg, msg
    if kind.startswith("npz"):
        assert "protoclip prepare" in msg


def test_intact_neighbours_read_every_image(tmp_path):
    """The same fixtures without the damage load and extract in full (the error is the damage, not the layout)."""
    root = tmp_path / "wds"
    (root / "classnames.txt").parent.mkdir()
    (root / "classnames.txt").write_text("cat\ndog\n")
    _shard(root / "test" / "0.tar", [("a.cls", b"0"), ("a.jpg", _jpeg(1)), ("b.cls", b"1"), ("b.png", _png(20))])
    ds = load_eval_set("pets_wds", EvalDatasetConfig(kind="wds", path=str(root)), Layout(tmp_path))
    assert _extract(ds) == 2 and [y for _, y in ds.test] == [0, 1]
    folder = tmp_path / "folder"
    bad = Path(_folder_set(folder))
    bad.write_bytes(_png(30))
    assert _extract(load_eval_set("toys", EvalDatasetConfig(kind="folder", path=str(folder)), Layout(tmp_path))) == 3


@pytest.mark.parametrize("kind", ["wds_truncated_jpeg", "npz_cut", "dtd_classes"])
def test_protoclip_evaluate_exits_2_with_one_line(kind, tmp_path):
    from protoclip.models import build_model, save_model

    name, cfg, names = _make(kind, tmp_path)
    results = tmp_path / "results"
    (results / "runs" / "r").mkdir(parents=True)
    save_model(results / "runs" / "r" / "model.pt", build_model("tiny-rn", head_hidden=16, head_out=8),
               {"model": "tiny-rn", "method": "clip"})
    config = {"paths": {"data_dir": str(tmp_path / "data"), "results_dir": str(results),
                        "mlflow_uri": f"sqlite:///{tmp_path}/mlflow.db"},
              "runs": {"r": {"method": "clip"}},
              "evaluate": {"device": "cpu", "datasets": {name: {"kind": cfg.kind, "path": cfg.path,
                                                                "tasks": ["knn"]}}}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db"}
    out = subprocess.run([sys.executable, "-m", "protoclip.cli", "evaluate", "--config",
                          str(tmp_path / "config.yaml"), "--run", "r"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr and lines and names in lines[-1] and "data error" in lines[-1], out.stderr
