"""ImageNet-1k (ILSVRC2012) from the layouts it is kept in (:func:`_val_split`). An image's label is its wnid's index
in the prompts file's ``wnids`` (CLIP_benchmark's list in label order: the sorted WordNet ids), so class folders,
the devkit, LOC_val_solution.csv and CLIP_benchmark's shards (labels = torchvision's ImageNet targets) give the same
label to the same image.
"""
from __future__ import annotations

import csv
import io
import re
import tarfile
from pathlib import Path

from protoclip.evaluate.datasets.classes import ClassNamesError
from protoclip.evaluate.datasets.sets import IMAGE_SUFFIXES, EvalDataError, FileSplit, LabelledSet, images_under
from protoclip.evaluate.prompts import load_prompts

WNID = re.compile(r"n\d{8}")
VAL_DIRS = ("val", "ILSVRC2012_img_val", "ILSVRC/Data/CLS-LOC/val")
TRAIN_DIRS = ("train", "ILSVRC2012_img_train", "ILSVRC/Data/CLS-LOC/train")
DEVKIT = "ILSVRC2012_devkit_t12"
GT_FILE = f"{DEVKIT}/data/ILSVRC2012_validation_ground_truth.txt"
META_FILE = f"{DEVKIT}/data/meta.mat"


def _flat_images(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


def _class_folders(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir() and WNID.fullmatch(p.name))


def _devkit_members(root: Path) -> tuple[bytes, bytes, str] | None:
    """(ground-truth txt, meta.mat) bytes of the devkit, extracted under ``root`` or in its tar.gz; None: none."""
    gt, meta = root / GT_FILE, root / META_FILE
    if gt.is_file() and meta.is_file():
        return gt.read_bytes(), meta.read_bytes(), str(gt)
    tar = root / f"{DEVKIT}.tar.gz"
    if tar.is_file():
        try:
            with tarfile.open(tar) as tf:
                read = lambda n: tf.extractfile(n).read()  # noqa: E731
                return read(GT_FILE), read(META_FILE), f"{tar}::{GT_FILE}"
        except (tarfile.TarError, KeyError, OSError, EOFError, AttributeError) as err:
            raise EvalDataError(f"{tar}: cannot read {GT_FILE} / {META_FILE} ({type(err).__name__}: {err})") from None
    return None


def _devkit_wnids(gt: bytes, meta: bytes, source: str, n_images: int) -> list[str]:
    """The wnid of each validation image (file-name order) from the devkit's ground truth and meta.mat."""
    from scipy.io import loadmat  # heavy: scipy, only when ImageNet's devkit is read

    try:
        synsets = loadmat(io.BytesIO(meta), squeeze_me=True)["synsets"]
        id_to_wnid = {int(i): str(w) for i, w, c in zip(synsets["ILSVRC2012_ID"], synsets["WNID"],
                                                        synsets["num_children"]) if int(c) == 0}
        ids = [int(line) for line in gt.decode().split()]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as err:
        raise EvalDataError(f"{source}: not the devkit's ground truth / meta.mat ({type(err).__name__}: "
                            f"{err})") from None
    if len(ids) != n_images:
        raise EvalDataError(f"{source}: {len(ids)} labels for {n_images} validation images; the images and the "
                            "ground truth must be the whole ILSVRC2012 validation set")
    try:
        return [id_to_wnid[i] for i in ids]
    except KeyError as err:
        raise EvalDataError(f"{source}: ILSVRC2012_ID {err} is not a leaf synset of meta.mat") from None


def _loc_solution_wnids(csv_path: Path, images: list[Path]) -> list[str]:
    """Kaggle's ``LOC_val_solution.csv``: ``ImageId`` -> the first wnid of ``PredictionString``."""
    try:
        with open(csv_path, newline="") as f:
            rows = {r["ImageId"]: r["PredictionString"].split()[0] for r in csv.DictReader(f)}
    except (KeyError, IndexError, OSError, csv.Error) as err:
        raise EvalDataError(f"{csv_path}: not Kaggle's LOC_val_solution.csv (ImageId,PredictionString; "
                            f"{type(err).__name__}: {err})") from None
    missing = [p.name for p in images if p.stem not in rows]
    if missing:
        raise EvalDataError(f"{csv_path}: no label for {len(missing)} validation image(s), e.g. {missing[0]}")
    return [rows[p.stem] for p in images]


def _meta_bin_wnids(meta_bin: Path, n_images: int) -> list[str]:
    import torch  # heavy: torch, only when ImageNet is read

    try:
        _, val_wnids = torch.load(meta_bin, weights_only=False)
    except Exception as err:  # noqa: BLE001  torch.load raises many types for a foreign file
        raise EvalDataError(f"{meta_bin}: not torchvision's ImageNet meta.bin ({type(err).__name__}: {err})") from None
    if len(val_wnids) != n_images:
        raise EvalDataError(f"{meta_bin}: {len(val_wnids)} labels for {n_images} flat validation images")
    return list(val_wnids)


def _labels(wnids: list[str], known: dict[str, int], source: str) -> list[int]:
    """Each wnid's label: its index in the prompts file's 1000 ``wnids`` (``known``); a wnid not among them stops."""
    unknown = sorted({w for w in wnids if w not in known})
    if unknown:
        raise ClassNamesError(f"{source}: wnid {unknown[0]} is not one of ImageNet-1k's 1000 classes "
                              f"({len(unknown)} unknown); refusing to score images against other classes' names")
    return [known[w] for w in wnids]


def _folder_split(folder: Path, known: dict[str, int]) -> FileSplit | None:
    paths, wnids = [], []
    for d in _class_folders(folder):
        for img in images_under(d):
            paths.append(str(img))
            wnids.append(d.name)
    return FileSplit(paths, _labels(wnids, known, str(folder))) if paths else None


def _val_split(root: Path, known: dict[str, int]) -> FileSplit:
    """The validation split (the paper's test set), from the first of, under ``root``:

    * ``val/<wnid>/*.JPEG``: class folders (the usual ``valprep.sh`` result, torchvision's prepared ``val/``);
    * flat validation images (``val/``, ``ILSVRC2012_img_val/`` or Kaggle's ``ILSVRC/Data/CLS-LOC/val/``) with their
      ground truth from the devkit (``ILSVRC2012_devkit_t12/data/ILSVRC2012_validation_ground_truth.txt`` and
      ``meta.mat``, extracted or inside ``ILSVRC2012_devkit_t12.tar.gz``: the i-th line is the ILSVRC2012_ID of the
      i-th image in file-name order, mapped to its wnid by ``meta.mat``), from Kaggle's ``LOC_val_solution.csv``
      (``ImageId,PredictionString``: the wnid is the first word), or from torchvision's ``meta.bin``
      (``(wnid_to_classes, val_wnids)``, val_wnids in file-name order).

    A ``test/`` folder (the unlabelled ILSVRC test images) is never read."""
    for rel in VAL_DIRS:
        folder = root / rel
        if not folder.is_dir():
            continue
        if _class_folders(folder):
            split = _folder_split(folder, known)
            if split is None:
                raise EvalDataError(f"{folder}: class folders without images")
            return split
        images = _flat_images(folder)
        if not images:
            continue
        if (devkit := _devkit_members(root)) is not None:
            wnids, source = _devkit_wnids(devkit[0], devkit[1], devkit[2], len(images)), devkit[2]
        elif (root / "LOC_val_solution.csv").is_file():
            source = str(root / "LOC_val_solution.csv")
            wnids = _loc_solution_wnids(root / "LOC_val_solution.csv", images)
        elif (root / "meta.bin").is_file():
            wnids, source = _meta_bin_wnids(root / "meta.bin", len(images)), str(root / "meta.bin")
        else:
            raise EvalDataError(f"{folder}: {len(images)} flat validation images but no labels: add the devkit "
                                f"({DEVKIT}/ or {DEVKIT}.tar.gz), LOC_val_solution.csv or torchvision's meta.bin "
                                f"to {root}, or sort the images into val/<wnid>/ folders")
        return FileSplit([str(p) for p in images], _labels(wnids, known, source))
    raise FileNotFoundError(f"no validation images under {root} (looked for {', '.join(VAL_DIRS)}; a test/ folder "
                            "holds the unlabelled ILSVRC test images and is not read)")


def load_imagenet(name: str, root: Path, need_train: bool = True) -> LabelledSet:
    """ImageNet's validation split (:func:`_val_split`) and, only when a task needs it, its train split
    (``train/<wnid>/`` or ``ILSVRC/Data/CLS-LOC/train/<wnid>/``)."""
    prompts = load_prompts("imagenet")
    known = {w: i for i, w in enumerate(prompts.wnids)}
    test = _val_split(root, known)
    train, train_missing = None, None
    if need_train:
        folder = next((root / rel for rel in TRAIN_DIRS if (root / rel).is_dir()), None)
        train = _folder_split(folder, known) if folder is not None else None
        if train is None:
            train_missing = f"no train split (train/<wnid>/ folders) under {root}"
    return LabelledSet(name=name, classnames=list(prompts.classnames), templates=list(prompts.templates),
                       test=test, train=train, train_missing=train_missing, source=f"imagenet:{root}:{len(test)}")


__all__ = ["load_imagenet"]
