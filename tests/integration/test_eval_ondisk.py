"""The paper's evaluation sets in the formats they ship in, as miniatures each test writes: the real file formats
(CIFAR's pickled batches, STL-10's binaries, Food-101's meta JSON, DTD's label lists, Flowers' .mat files, GTSRB's
CSV, Cars' .mat annotations, Pets' annotation lists, Country211 / RenderedSST2 folders, ImageNet's devkit,
LOC_val_solution.csv and CLIP_benchmark's shards, COCO / Flickr30k caption files), a few images per class.

Every image carries a serial number in its pixels; the test remembers the class each serial was written as. The
check is the one zero-shot depends on: for every test image the loader yields, the class name it is scored
against (``classnames[label]``) is the image's own class.
"""
from __future__ import annotations

import io
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from protoclip.errors import UserError
from protoclip.evaluate.config import EvalDatasetConfig
from protoclip.evaluate.datasets import CaptionSet, LabelledSet, Skipped, load_eval_set
from protoclip.evaluate.datasets.sets import norm
from protoclip.evaluate.prompts import load_prompts
from protoclip.files.layout import Layout


class Serials:
    """Images whose pixels hold a serial number, and the class name each serial was written as."""

    def __init__(self) -> None:
        self.names: dict[int, str] = {}

    def new(self, classname: str) -> int:
        serial = len(self.names) + 1
        self.names[serial] = classname
        return serial

    @staticmethod
    def pixels(serial: int, size: int = 4) -> np.ndarray:
        img = np.zeros((size, size, 3), np.uint8)
        img[..., 0], img[..., 1], img[..., 2] = serial % 256, serial // 256, 77
        return img

    def image(self, classname: str, fmt: str = "PNG") -> bytes:
        buf = io.BytesIO()
        Image.fromarray(self.pixels(self.new(classname))).save(buf, format=fmt)
        return buf.getvalue()

    @staticmethod
    def serial_of(img: Image.Image) -> int:
        r, g, b = np.asarray(img)[0, 0]
        assert b == 77, "not a serial image"
        return int(r) + 256 * int(g)

    def check(self, ds: LabelledSet, split: str = "test") -> int:
        """Every image of the split is scored against its own class name; returns the number of images."""
        images = list(getattr(ds, split))
        assert images, f"{ds.name}: empty {split} split"
        for img, y in images:
            own = self.names[self.serial_of(img)]
            assert norm(ds.classnames[y]) == norm(own), f"{ds.name}: image of '{own}' scored as '{ds.classnames[y]}'"
        return len(images)


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _load(name: str, kind: str, path: Path, tasks=None, **kw):
    return load_eval_set(name, EvalDatasetConfig(kind=kind, path=str(path), **kw), Layout(path), tasks=tasks)


# --------------------------------------------------------------------------- torchvision layouts
def _cifar(root: Path, s: Serials, hundred: bool) -> None:
    names = load_prompts("cifar100" if hundred else "cifar10").classnames
    on_disk = [n.replace(" ", "_") for n in names]  # CIFAR-100's meta spells 'aquarium_fish'
    base = root / ("cifar-100-python" if hundred else "cifar-10-batches-py")
    base.mkdir(parents=True)
    files = ["train", "test"] if hundred else [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for k, fname in enumerate(files):
        labels = [(k + j) % len(names) for j in range(len(names) if hundred else 4)]
        rows = []
        for y in labels:  # CIFAR rows: 1024 red, 1024 green, 1024 blue values (32x32, row-major)
            px = Serials.pixels(s.new(on_disk[y]), 32)
            rows.append(np.concatenate([px[..., c].ravel() for c in range(3)]))
        key = "fine_labels" if hundred else "labels"
        with open(base / fname, "wb") as f:
            pickle.dump({"data": np.stack(rows).astype(np.uint8), key: labels}, f)
    meta, key = ("meta", "fine_label_names") if hundred else ("batches.meta", "label_names")
    with open(base / meta, "wb") as f:
        pickle.dump({key: on_disk}, f)


def _stl10(root: Path, s: Serials) -> None:
    base = root / "stl10_binary"
    base.mkdir(parents=True)
    names = ["airplane", "bird", "car", "cat", "deer", "dog", "horse", "monkey", "ship", "truck"]
    (base / "class_names.txt").write_text("\n".join(names) + "\n")
    for split in ("train", "test"):
        labels = np.arange(10).repeat(2)
        imgs = np.stack([Serials.pixels(s.new(names[y]), 96).transpose(2, 1, 0) for y in labels])  # [N,3,96,96]
        (base / f"{split}_X.bin").write_bytes(imgs.astype(np.uint8).tobytes())
        (base / f"{split}_y.bin").write_bytes((labels + 1).astype(np.uint8).tobytes())  # 1-based
    # no unlabeled_X.bin (2.6 GB in the real set): no task reads it


def _dtd(root: Path, s: Serials) -> None:
    base = root / "dtd" / "dtd"
    for split in ("train1", "test1", "val1"):
        lines = []
        for c in load_prompts("dtd").classnames:
            rel = f"{c}/{c}_{split}.jpg"
            _write(base / "images" / rel, s.image(c))  # PNG bytes: lossless serials (PIL reads by content)
            lines.append(rel)
        _write(base / "labels" / f"{split}.txt", ("\n".join(lines) + "\n").encode())


def _food101(root: Path, s: Serials) -> None:
    base = root / "food-101"
    for split in ("train", "test"):
        meta = {}
        for c in load_prompts("food101").classnames:
            folder = c.replace(" ", "_")
            meta[folder] = [f"{folder}/{split}{i}" for i in range(1 if split == "test" else 2)]
            for rel in meta[folder]:
                _write(base / "images" / f"{rel}.jpg", s.image(folder))
        _write(base / "meta" / f"{split}.json", json.dumps(meta).encode())


def _pets(root: Path, s: Serials, splits=("trainval", "test")) -> None:
    """The official ids: breeds in case-insensitive order of their file names (cats capitalised, dogs not)."""
    base = root / "oxford-iiit-pet"
    clip = load_prompts("oxford_pets").classnames
    prefixes = sorted((c.replace(" ", "_") for c in clip), key=str.lower)
    for split in splits:
        lines = []
        for cid, prefix in enumerate(prefixes, 1):
            species = 1 if prefix[0].isupper() else 2
            image_id = f"{prefix}_{100 + len(split)}"
            _write(base / "images" / f"{image_id}.jpg", s.image(prefix))
            lines.append(f"{image_id} {cid} {species} 1")
        _write(base / "annotations" / f"{split}.txt", ("\n".join(lines) + "\n").encode())


def _sst2(root: Path, s: Serials) -> None:
    for split in ("train", "valid", "test"):
        for c in ("negative", "positive"):
            for i in range(2):
                _write(root / "rendered-sst2" / split / c / f"{i}.png", s.image(c))


def _country211(root: Path, s: Serials, splits=("train", "valid", "test")) -> None:
    # the folders are ISO codes, whose sorted order CLIP's list follows; stand-in codes in sorted order here
    codes = [a + b for a in "ABCDEFGHIJ" for b in "ABCDEFGHIJKLMNOPQRSTUVWXYZ"][:211]
    for split in splits:
        for code, name in zip(codes, load_prompts("country211").classnames):
            _write(root / "country211" / split / code / f"{split}.jpg", s.image(name))


def _flowers102(root: Path, s: Serials) -> None:
    from scipy.io import savemat

    base = root / "flowers-102"
    names = load_prompts("flowers102").classnames  # CLIP's list is in the ids' order (imagelabels.mat, 1-based)
    labels, ids = [], {"trnid": [], "valid": [], "tstid": []}
    for key in ids:
        for c in range(102):
            image_id = len(labels) + 1
            labels.append(c + 1)
            ids[key].append(image_id)
            _write(base / "jpg" / f"image_{image_id:05d}.jpg", s.image(names[c]))
    savemat(base / "imagelabels.mat", {"labels": np.array(labels)})
    savemat(base / "setid.mat", {k: np.array(v) for k, v in ids.items()})


def _gtsrb(root: Path, s: Serials, train: bool = True) -> None:
    base = root / "gtsrb"
    names = load_prompts("gtsrb").classnames  # CLIP's list is in ClassId order
    rows = ["Filename;Width;Height;Roi.X1;Roi.Y1;Roi.X2;Roi.Y2;ClassId"]
    for c in range(43):
        if train:
            _write(base / "GTSRB" / "Training" / f"{c:05d}" / f"00000_{c:05d}.ppm", s.image(names[c], "PPM"))
        fname = f"{c:05d}.ppm"
        _write(base / "GTSRB" / "Final_Test" / "Images" / fname, s.image(names[c], "PPM"))
        rows.append(f"{fname};4;4;0;0;3;3;{c}")
    _write(base / "GT-final_test.csv", ("\n".join(rows) + "\n").encode())


def _cars(root: Path, s: Serials) -> None:
    from scipy.io import savemat

    base = root / "stanford_cars"
    names = load_prompts("stanford_cars").classnames
    (base / "devkit").mkdir(parents=True)
    savemat(base / "devkit" / "cars_meta.mat", {"class_names": np.array(names, dtype=object)})
    for split, mat in (("train", base / "devkit" / "cars_train_annos.mat"),
                       ("test", base / "cars_test_annos_withlabels.mat")):
        dtype = [("bbox_x1", "O"), ("bbox_y1", "O"), ("bbox_x2", "O"), ("bbox_y2", "O"), ("class", "O"),
                 ("fname", "O")]
        annos = np.zeros(len(names), dtype=dtype)
        for c, name in enumerate(names):
            fname = f"{split}{c:05d}.jpg"
            _write(base / f"cars_{split}" / fname, s.image(name))
            annos[c] = (0, 0, 3, 3, c + 1, fname)  # classes 1-based
        savemat(mat, {"annotations": annos})


WRITERS = {
    "cifar10": lambda root, s: _cifar(root, s, hundred=False), "cifar100": lambda root, s: _cifar(root, s, True),
    "stl10": _stl10, "dtd": _dtd, "food101": _food101, "oxford_pets": _pets, "rendered_sst2": _sst2,
    "country211": _country211, "flowers102": _flowers102, "gtsrb": _gtsrb, "stanford_cars": _cars,
}


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_torchvision_layout_scores_every_image_against_its_own_class(name, tmp_path):
    s = Serials()
    WRITERS[name](tmp_path / "download", s)
    ds = _load(name, "torchvision", tmp_path / "download")
    assert isinstance(ds, LabelledSet), ds
    assert sorted(map(norm, ds.classnames)) == sorted(map(norm, load_prompts(name).classnames))
    assert s.check(ds, "test") > 0 and s.check(ds, "train") > 0
    assert ds.templates == load_prompts(name).templates


def test_pets_labels_follow_the_data_not_clips_list(tmp_path):
    """CLIP's Pets list is sorted case-sensitively (cats first); the data's ids are not: 33 of 37 breeds differ."""
    s = Serials()
    _pets(tmp_path, s)
    ds = _load("oxford_pets", "torchvision", tmp_path)
    clips_order = sorted(ds.classnames)  # case-sensitive: 'Abyssinian', 'Bengal', ..., 'Sphynx', 'american bulldog'
    assert sum(a != b for a, b in zip(ds.classnames, clips_order)) == 33
    assert ds.classnames[:6] == ["Abyssinian", "american bulldog", "american pit bull terrier", "basset hound",
                                 "beagle", "Bengal"]
    assert s.check(ds) == 37 and s.check(ds, "train") == 37


def test_path_may_be_torchvisions_folder_itself(tmp_path):
    s = Serials()
    _food101(tmp_path, s)
    ds = _load("food101", "torchvision", tmp_path / "food-101", tasks=["zeroshot"])
    assert isinstance(ds, LabelledSet) and ds.train is None and ds.train_missing is None  # not asked for
    s.check(ds)
    other = tmp_path / "elsewhere"
    other.mkdir()
    skipped = _load("food101", "torchvision", other)
    assert isinstance(skipped, Skipped) and "no food-101/ in it" in skipped.reason


def test_test_only_copies_keep_the_set_and_skip_the_probes(tmp_path):
    s = Serials()
    _gtsrb(tmp_path / "gtsrb_root", s, train=False)
    ds = _load("gtsrb", "torchvision", tmp_path / "gtsrb_root")
    assert isinstance(ds, LabelledSet) and ds.train is None
    assert ds.train_missing.startswith(f"no train split in {tmp_path / 'gtsrb_root' / 'gtsrb'}")
    s.check(ds)
    _country211(tmp_path / "c211", s, splits=("test",))
    ds = _load("country211", "torchvision", tmp_path / "c211")
    assert ds.train is None and "no train split" in ds.train_missing
    s.check(ds)


def test_a_class_list_that_does_not_match_is_refused_in_one_line(tmp_path):
    s = Serials()
    _dtd(tmp_path, s)
    labels = tmp_path / "dtd" / "dtd" / "labels" / "test1.txt"
    labels.write_text(labels.read_text().replace("banded/", "striped_ish/"))
    (tmp_path / "dtd" / "dtd" / "images" / "striped_ish").mkdir()
    with pytest.raises(UserError) as err:
        _load("dtd", "torchvision", tmp_path)
    msg = str(err.value)
    assert msg.startswith(f"{tmp_path / 'dtd'}: ") and "'striped_ish' is not a prompt class name" in msg
    assert "\n" not in msg


def test_wrong_class_count_is_refused(tmp_path):
    s = Serials()
    _gtsrb(tmp_path, s)
    csv = tmp_path / "gtsrb" / "GT-final_test.csv"
    csv.write_text(csv.read_text().replace(";42\n", ";50\n"))  # a ClassId beyond GTSRB's 43
    with pytest.raises(UserError, match="gtsrb has 51 classes, its prompts 43"):
        _load("gtsrb", "torchvision", tmp_path)


# --------------------------------------------------------------------------- ImageNet
WNIDS, NAMES = load_prompts("imagenet").wnids, load_prompts("imagenet").classnames
PICKED = [0, 21, 400, 999, 7, 512]  # classes of the miniature (not the first six: labels must come by wnid)


def _imagenet_images(s: Serials) -> list[tuple[str, int, bytes]]:
    """(val file name, class index, JPEG-free PNG bytes) of 12 validation images, 2 per picked class."""
    out = []
    for i in range(12):
        c = PICKED[(i * 5) % len(PICKED)]
        out.append((f"ILSVRC2012_val_{i + 1:08d}.JPEG", c, s.image(NAMES[c])))
    return out


def _devkit(root: Path, images, rng) -> None:
    """ILSVRC2012_devkit_t12: meta.mat (1000 leaf synsets with shuffled ILSVRC2012_IDs, one inner synset) and the
    validation ground truth (one ILSVRC2012_ID per line, in file-name order)."""
    from scipy.io import savemat

    ids = rng.permutation(1000) + 1  # ILSVRC2012_ID of each sorted wnid: not the label order
    dtype = [("ILSVRC2012_ID", "O"), ("WNID", "O"), ("words", "O"), ("gloss", "O"), ("num_children", "O")]
    synsets = np.zeros(1001, dtype=dtype)
    for k, w in enumerate(WNIDS):
        synsets[k] = (int(ids[k]), w, "w", "g", 0)
    synsets[1000] = (1001, "n00001740", "entity", "g", 3)  # an inner node: not a class
    data = root / "ILSVRC2012_devkit_t12" / "data"
    data.mkdir(parents=True)
    savemat(data / "meta.mat", {"synsets": synsets})
    (data / "ILSVRC2012_validation_ground_truth.txt").write_text(
        "\n".join(str(int(ids[c])) for _, c, _ in images) + "\n")


def _labels_by_serial(ds) -> dict[int, int]:
    return {Serials.serial_of(img): y for img, y in ds.test}


@pytest.mark.filterwarnings("ignore:This DataLoader will create 8 worker processes")  # CLIP_benchmark's writer
def test_imagenet_official_val_folders_and_clip_benchmark_shards_agree(tmp_path):
    s = Serials()
    images = _imagenet_images(s)
    expected = {Serials.serial_of(Image.open(io.BytesIO(b))): c for _, c, b in images}
    # 1. official: flat val/ + the devkit
    flat = tmp_path / "official"
    for fname, _, data in images:
        _write(flat / "val" / fname, data)
    _devkit(flat, images, np.random.default_rng(0))
    (flat / "test").mkdir()  # the unlabelled test images are never read
    _write(flat / "test" / "ILSVRC2012_test_00000001.JPEG", s.image("unlabelled"))
    # 2. Kaggle: flat ILSVRC/Data/CLS-LOC/val + LOC_val_solution.csv
    kaggle = tmp_path / "kaggle"
    rows = ["ImageId,PredictionString"]
    for fname, c, data in images:
        _write(kaggle / "ILSVRC" / "Data" / "CLS-LOC" / "val" / fname, data)
        rows.append(f"{Path(fname).stem},{WNIDS[c]} 1 2 3 4 {WNIDS[c]} 5 6 7 8")
    (kaggle / "LOC_val_solution.csv").write_text("\n".join(rows) + "\n")
    # 3. valprep.sh: val/<wnid>/
    folders = tmp_path / "valprep"
    for fname, c, data in images:
        _write(folders / "val" / WNIDS[c] / fname, data)
    # 4. CLIP_benchmark's export of torchvision's ImageNet (labels: torchvision's targets), by its own writer
    from clip_benchmark.webdataset_builder import convert_dataset

    class Exported(list):
        classes = load_prompts("imagenet").classnames

    shards = tmp_path / "wds_imagenet1k"
    convert_dataset(Exported((Image.open(io.BytesIO(b)), c) for _, c, b in images), "test", str(shards),
                    transform=lambda im: _png_bytes(im), image_format="png", verbose=False)
    got = {}
    for label, root, kind in (("devkit", flat, "torchvision"), ("LOC_val_solution.csv", kaggle, "torchvision"),
                              ("valprep", folders, "torchvision"), ("shards", shards, "wds")):
        ds = _load("imagenet", kind, root, tasks=["zeroshot"])
        assert isinstance(ds, LabelledSet) and ds.classnames[21] == "kite (bird of prey)", label
        got[label] = _labels_by_serial(ds)
        assert got[label] == expected, label
        s.check(ds)


def _png_bytes(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def test_imagenet_flat_val_with_torchvisions_meta_bin(tmp_path):
    import torch

    s = Serials()
    images = _imagenet_images(s)
    for fname, _, data in images:
        _write(tmp_path / "val" / fname, data)
    torch.save(({w: (n,) for w, n in zip(WNIDS, NAMES)}, [WNIDS[c] for _, c, _ in images]), tmp_path / "meta.bin")
    ds = _load("imagenet", "torchvision", tmp_path, tasks=["zeroshot"])
    assert s.check(ds) == 12 and [y for _, y in ds.test] == [c for _, c, _ in images]


def test_imagenet_flat_val_without_labels_is_one_line(tmp_path):
    s = Serials()
    for fname, _, data in _imagenet_images(s):
        _write(tmp_path / "val" / fname, data)
    with pytest.raises(UserError, match="12 flat validation images but no labels") as err:
        _load("imagenet", "torchvision", tmp_path)
    assert str(err.value).startswith(f"{tmp_path / 'val'}: ")


def test_imagenet_devkit_tarball_and_train_split(tmp_path):
    import tarfile

    s = Serials()
    images = _imagenet_images(s)
    for fname, _, data in images:
        _write(tmp_path / "val" / fname, data)
    staging = tmp_path / "staging"
    _devkit(staging, images, np.random.default_rng(1))
    with tarfile.open(tmp_path / "ILSVRC2012_devkit_t12.tar.gz", "w:gz") as tf:
        tf.add(staging / "ILSVRC2012_devkit_t12", arcname="ILSVRC2012_devkit_t12")
    ds = _load("imagenet", "torchvision", tmp_path, tasks=["knn"])
    assert ds.train is None and ds.train_missing.startswith("no train split")
    s.check(ds)
    for c in PICKED:
        _write(tmp_path / "train" / WNIDS[c] / f"{WNIDS[c]}_1.JPEG", s.image(NAMES[c]))
    ds = _load("imagenet", "torchvision", tmp_path, tasks=["knn"])
    assert len(ds.train) == len(PICKED) and s.check(ds, "train") == len(PICKED)


# --------------------------------------------------------------------------- CLIP_benchmark webdataset shards
def _shards(root: Path, split: str, samples: list[dict], per_shard: int = 2) -> None:
    import webdataset as wds

    (root / split).mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(root / split / "%d.tar"), maxcount=per_shard, verbose=0) as sink:
        for i, sample in enumerate(samples):
            sink.write({"__key__": f"s{i:07d}", **sample})
        n = sink.shard
    (root / split / "nshards.txt").write_text(f"{n}\n")


def test_wds_nshards_and_a_missing_shard(tmp_path):
    s = Serials()
    names = load_prompts("cifar10").classnames
    _shards(tmp_path, "test", [{"png": s.image(names[i % 10]), "cls": i % 10} for i in range(25)])
    (tmp_path / "classnames.txt").write_text("\n".join(names) + "\n")
    ds = _load("cifar10", "wds", tmp_path, tasks=["zeroshot"])
    assert len(ds.test) == 25 and s.check(ds) == 25  # 13 shards, read in numeric order (10.tar after 9.tar)
    (tmp_path / "test" / "7.tar").unlink()
    with pytest.raises(UserError) as err:
        _load("cifar10", "wds", tmp_path, tasks=["zeroshot"])
    assert str(err.value).startswith(f"{tmp_path / 'test' / '7.tar'}: missing")


def test_wds_class_names_checked_against_the_prompts(tmp_path):
    """CLIP_benchmark's Pets export names its classes in the data's order (title case); the prompts match it."""
    s = Serials()
    data_order = sorted(load_prompts("oxford_pets").classnames, key=str.lower)
    _shards(tmp_path, "test", [{"png": s.image(n), "cls": i} for i, n in enumerate(data_order)], per_shard=50)
    (tmp_path / "classnames.txt").write_text("\n".join(n.title() for n in data_order) + "\n")
    ds = _load("oxford_pets", "wds", tmp_path, tasks=["zeroshot"])
    assert s.check(ds) == 37 and ds.classnames == data_order
    (tmp_path / "classnames.txt").write_text("\n".join(["Sphynx"] * 36 + ["Unicorn"]) + "\n")
    with pytest.raises(UserError, match="classnames.txt: the 37 class names of oxford_pets do not match"):
        _load("oxford_pets", "wds", tmp_path, tasks=["zeroshot"])


def test_wds_retrieval_shards(tmp_path):
    s = Serials()
    samples = [{"webp": _webp(s, f"image {i}"), "txt": f"a caption of {i}\nanother of {i}"} for i in range(5)]
    _shards(tmp_path, "test", samples)
    (tmp_path / "dataset_type.txt").write_text("retrieval\n")
    ds = _load("mscoco_wds", "wds", tmp_path)
    assert isinstance(ds, CaptionSet) and len(ds.images) == 5
    assert ds.captions[3] == ["a caption of 3", "another of 3"]
    assert [s.names[Serials.serial_of(img)] for img, _ in ds.images] == [f"image {i}" for i in range(5)]
    assert [i for _, i in ds.images] == list(range(5))
    from protoclip.evaluate.plan import static_tasks

    assert static_tasks("mscoco_wds", EvalDatasetConfig(kind="wds", path=str(tmp_path))) == ["retrieval",
                                                                                            "temperature"]


def _webp(s: Serials, name: str) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(Serials.pixels(s.new(name))).save(buf, format="WEBP", lossless=True)
    return buf.getvalue()


# --------------------------------------------------------------------------- COCO / Flickr30k
def _coco(root: Path, s: Serials) -> None:
    """Karpathy's split (test: a, c; train: b) over val2014, in its three common files, and COCO 2017 val."""
    karpathy = [("COCO_val2014_000000000001.jpg", "test"), ("COCO_val2014_000000000002.jpg", "train"),
                ("COCO_val2014_000000000003.jpg", "test")]
    imgs = []
    for k, (f, split) in enumerate(karpathy, 1):
        _write(root / "val2014" / f, s.image(f))
        imgs.append({"filepath": "val2014", "filename": f, "split": split, "cocoid": k,
                     "sentences": [{"raw": f"{f} one "}, {"raw": f"{f} two"}]})
    (root / "dataset_coco.json").write_text(json.dumps({"images": imgs}))
    test = [i for i in imgs if i["split"] == "test"]
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    (root / "annotations" / "coco_test_karpathy.json").write_text(json.dumps({  # CLIP_benchmark: COCO format
        "images": [{"id": i["cocoid"], "file_name": i["filename"]} for i in test],
        "annotations": [{"image_id": i["cocoid"], "id": 10 * i["cocoid"] + j, "caption": c["raw"]}
                        for i in test for j, c in enumerate(i["sentences"])]}))
    (root / "coco_karpathy_test.json").write_text(json.dumps([  # BLIP: a list
        {"image": f"val2014/{i['filename']}", "caption": [c["raw"] for c in i["sentences"]]} for i in test]))
    val2017 = {"images": [{"id": 9, "file_name": "000000000009.jpg"}, {"id": 5, "file_name": "000000000005.jpg"}],
               "annotations": [{"image_id": i, "id": 100 + i + j, "caption": f"2017 image {i} cap {j}"}
                               for i in (9, 5) for j in range(3)]}
    (root / "annotations" / "captions_val2017.json").write_text(json.dumps(val2017))
    for im in val2017["images"]:
        _write(root / "val2017" / im["file_name"], s.image(im["file_name"]))


@pytest.mark.parametrize("keep", ["dataset_coco.json", "annotations/coco_test_karpathy.json",
                                  "coco_karpathy_test.json"])
def test_coco_karpathy_test_from_each_common_file(keep, tmp_path):
    s = Serials()
    _coco(tmp_path, s)
    for f in ("dataset_coco.json", "annotations/coco_test_karpathy.json", "coco_karpathy_test.json"):
        if f != keep:
            (tmp_path / f).unlink()
    ds = _load("mscoco", "coco", tmp_path, split="karpathy_test")
    assert [s.names[Serials.serial_of(img)] for img, _ in ds.images] == ["COCO_val2014_000000000001.jpg",
                                                                         "COCO_val2014_000000000003.jpg"]
    assert ds.captions == [["COCO_val2014_000000000001.jpg one", "COCO_val2014_000000000001.jpg two"],
                           ["COCO_val2014_000000000003.jpg one", "COCO_val2014_000000000003.jpg two"]]


def test_coco_split_setting_picks_the_images(tmp_path):
    s = Serials()
    _coco(tmp_path, s)
    ds = _load("mscoco", "coco", tmp_path, split="val2017")  # the official ProtoCLIP code's set
    assert [s.names[Serials.serial_of(img)] for img, _ in ds.images] == ["000000000005.jpg", "000000000009.jpg"]
    assert ds.captions[0] == [f"2017 image 5 cap {j}" for j in range(3)] and len(ds.texts) == 6
    with pytest.raises(UserError, match="split None of a coco set is not one of karpathy_test, val2017"):
        _load("mscoco", "coco", tmp_path)
    (tmp_path / "val2014" / "COCO_val2014_000000000003.jpg").unlink()
    with pytest.raises(UserError) as err:
        _load("mscoco", "coco", tmp_path, split="karpathy_test")
    assert str(err.value).startswith(f"{tmp_path / 'val2014' / 'COCO_val2014_000000000003.jpg'}: missing (1 of the 2")


@pytest.mark.parametrize("fmt", ["karpathy", "clip_benchmark", "blip"])
def test_flickr30k_karpathy_test(fmt, tmp_path):
    s = Serials()
    files = [("1000.jpg", "test"), ("2000.jpg", "val"), ("3000.jpg", "test")]
    for f, _ in files:
        _write(tmp_path / "flickr30k-images" / f, s.image(f))
    test = [f for f, split in files if split == "test"]
    if fmt == "karpathy":
        (tmp_path / "dataset_flickr30k.json").write_text(json.dumps({"images": [
            {"filename": f, "split": split, "sentences": [{"raw": f"{f}, a dog"}, {"raw": f"{f} b"}]}
            for f, split in files]}))
    elif fmt == "clip_benchmark":
        (tmp_path / "flickr30k_test_karpathy.txt").write_text(
            "image,caption\n" + "".join(f"{f},{f}, a dog\n{f},{f} b\n" for f in test))
    else:
        (tmp_path / "flickr30k_test.json").write_text(json.dumps(
            [{"image": f"flickr30k-images/{f}", "caption": [f"{f}, a dog", f"{f} b"]} for f in test]))
    ds = _load("flickr30k", "flickr30k", tmp_path, split="karpathy_test")
    assert [s.names[Serials.serial_of(img)] for img, _ in ds.images] == test
    assert ds.captions == [[f"{f}, a dog", f"{f} b"] for f in test]


def test_retrieval_split_is_a_required_config_setting():
    from protoclip.errors import ConfigError
    from protoclip.evaluate.config import EvaluateConfig
    from protoclip.config.strict import build

    with pytest.raises(ConfigError, match=r"evaluate\.datasets\.mscoco\.split must be one of karpathy_test, val2017"):
        build(EvaluateConfig, {"datasets": {"mscoco": {"kind": "coco", "path": "/x"}}}, "cfg.yaml", "evaluate.")
    with pytest.raises(ConfigError, match="split applies to kinds coco / flickr30k only"):
        build(EvaluateConfig, {"datasets": {"dtd": {"kind": "torchvision", "split": "val2017"}}}, "cfg.yaml",
              "evaluate.")
    ok = build(EvaluateConfig, {"datasets": {"f": {"kind": "flickr30k", "split": "karpathy_test"}}}, "c", "evaluate.")
    assert ok.datasets["f"].split == "karpathy_test"
