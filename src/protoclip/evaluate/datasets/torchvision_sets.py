"""The paper's sets in the layouts torchvision 0.29 reads (``download=False``: the data is the user's). ``path`` is the
folder that holds torchvision's folder of the set (the one its archive extracts to, e.g. ``food-101/``), or that
folder itself; the files read per set: docs/evaluation-sets.md#protoclipevaluatedatasetstorchvision_sets.
"""
from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from protoclip.evaluate.datasets.classes import prompt_classes
from protoclip.evaluate.datasets.imagenet import load_imagenet
from protoclip.evaluate.datasets.sets import EvalDataError, LabelledSet, TorchvisionSplit
from protoclip.evaluate.prompts import canonical


class SplitNotFound(Exception):
    """torchvision found no data for one split (its RuntimeError / FileNotFoundError, as one line)."""


@dataclass(frozen=True)
class TvSet:
    folder: str  # torchvision's folder under the root
    splits: tuple[str, str]  # torchvision's (train, test) split names
    build: Callable[[str, str], Any]  # (root, torchvision split) -> data set
    names: Callable[[Any], list[str] | None]  # the data's own class names in label order (None: ids only)


def _split_files_only(cls, train_files: list[str], test_files: list[str]):
    """A CIFAR / STL-10 class that checks the presence of the requested split's files only (no md5: checksums
    guard downloads, and STL-10's would also require the 2.6 GB unlabeled file, which no task reads; a test-only
    copy is a valid test set)."""
    def _check_integrity(self) -> bool:
        train = getattr(self, "train", getattr(self, "split", "") == "train")
        files = train_files if train is True else test_files
        base = Path(self.root) / self.base_folder
        return all((base / f).is_file() for f in files)

    attrs: dict[str, Any] = {"train_list": [[f, None] for f in train_files],
                             "test_list": [[f, None] for f in test_files], "_check_integrity": _check_integrity}
    if hasattr(cls, "meta"):
        attrs["meta"] = {**cls.meta, "md5": None}
    return type(cls.__name__, (cls,), attrs)


def _table() -> dict[str, TvSet]:
    from torchvision import datasets as tvd  # heavy: torchvision, only when a set is read

    cifar10 = _split_files_only(tvd.CIFAR10, [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"])
    cifar100 = _split_files_only(tvd.CIFAR100, ["train"], ["test"])
    stl10 = _split_files_only(tvd.STL10, ["train_X.bin", "train_y.bin"], ["test_X.bin", "test_y.bin"])
    flowers = type("Flowers102", (tvd.Flowers102,),  # presence, not the download md5s, of the .mat files
                   {"_file_dict": {k: (f, None) for k, (f, _) in tvd.Flowers102._file_dict.items()}})

    def by_split(cls, **kw) -> Callable[[str, str], Any]:
        return lambda root, split: cls(root, split=split, download=False, **kw)

    classes = lambda ds: list(ds.classes)  # noqa: E731
    return {
        "cifar10": TvSet("cifar-10-batches-py", ("train", "test"),
                         lambda root, s: cifar10(root, train=s == "train", download=False), classes),
        "cifar100": TvSet("cifar-100-python", ("train", "test"),
                          lambda root, s: cifar100(root, train=s == "train", download=False), classes),
        "stl10": TvSet("stl10_binary", ("train", "test"), lambda root, s: stl10(root, split=s),
                       lambda ds: list(ds.classes) if hasattr(ds, "classes") else None),
        "dtd": TvSet("dtd", ("train", "test"), by_split(tvd.DTD), classes),  # partition 1 (torchvision default)
        "food101": TvSet("food-101", ("train", "test"), by_split(tvd.Food101), classes),
        "oxford_pets": TvSet("oxford-iiit-pet", ("trainval", "test"),
                             by_split(tvd.OxfordIIITPet, target_types="category"), classes),
        "rendered_sst2": TvSet("rendered-sst2", ("train", "test"), by_split(tvd.RenderedSST2), classes),
        # ISO 3166 codes, in whose sorted order CLIP lists the countries: checked by count
        "country211": TvSet("country211", ("train", "test"), by_split(tvd.Country211), lambda ds: None),
        # labels are ids 1..102 of imagelabels.mat (torchvision's own `classes` is a constant, not the data's)
        "flowers102": TvSet("flowers-102", ("train", "test"), by_split(flowers), lambda ds: None),
        "gtsrb": TvSet("gtsrb", ("train", "test"), by_split(tvd.GTSRB), lambda ds: None),  # ClassId 0..42
        "stanford_cars": TvSet("stanford_cars", ("train", "test"), by_split(tvd.StanfordCars), classes),
    }


KNOWN = ("cifar10", "cifar100", "stl10", "dtd", "food101", "oxford_pets", "rendered_sst2", "country211",
         "flowers102", "gtsrb", "stanford_cars", "imagenet")


def tv_root(name: str, path: Path, folder: str) -> Path:
    """The root to give torchvision: ``path`` when it holds ``folder``, its parent when it is ``folder``."""
    if (path / folder).is_dir():
        return path
    if path.name == folder:
        return path.parent
    raise FileNotFoundError(f"no {folder}/ in it (torchvision's layout of {name}: `path` is the folder that "
                            f"holds {folder}/, or {folder}/ itself)")


def _labels_max(ds: Any) -> int:
    for attr in ("targets", "_labels", "labels"):
        labels = getattr(ds, attr, None)
        if labels is not None and len(labels):
            return int(max(labels)) + 1
    samples = getattr(ds, "_samples", None) or getattr(ds, "samples", None)
    return int(max(y for _, y in samples)) + 1 if samples else 0


def build_split(spec: TvSet, root: Path, split: str) -> Any:
    try:
        return spec.build(str(root), split)
    except (RuntimeError, FileNotFoundError) as err:  # "Dataset not found ...", or a split's list file
        raise SplitNotFound(f"{type(err).__name__}: {err}") from None
    # a list, label or pickle file that is there but cut or foreign (pickle, json, scipy.io, csv parsing)
    except (ValueError, KeyError, IndexError, TypeError, EOFError, OSError, pickle.UnpicklingError) as err:
        text = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise EvalDataError(f"{root / spec.folder}: torchvision cannot read the {split} split ({type(err).__name__}: "
                            f"{text}); the files are cut or not {spec.folder}'s") from None


def load_torchvision(name: str, path: Path, need_train: bool = True) -> LabelledSet:
    """Set ``name`` in torchvision's layout under ``path``; the train split only when ``need_train``.

    A test split that torchvision cannot find raises FileNotFoundError (the set is skipped as not found); a set
    whose train split is absent keeps its test tasks (``LabelledSet.train_missing``). The prompt class names are
    put in the data's label order and checked against the data's own names (:mod:`.classes`)."""
    key = canonical(name)
    if key == "imagenet":
        return load_imagenet(name, path, need_train)
    table = _table()
    if key not in table:
        raise EvalDataError(f"{path}: no torchvision reader for data set {name!r} (known: {', '.join(KNOWN)}); "
                            "use kind folder / wds for other sets")
    spec = table[key]
    root = tv_root(name, path, spec.folder)
    train_split, test_split = spec.splits
    try:
        test = build_split(spec, root, test_split)
    except SplitNotFound as err:
        raise FileNotFoundError(f"no {test_split} split in {root / spec.folder}: {err}") from None
    train, train_missing = None, None
    if need_train:
        try:
            train = build_split(spec, root, train_split)
        except SplitNotFound as err:
            train_missing = f"no {train_split} split in {root / spec.folder} ({err})"
    data_names = spec.names(test)
    classnames, templates = prompt_classes(key, data_names, str(root / spec.folder),
                                           by_count=_labels_max(test) if data_names is None else None)
    if train is not None and spec.names(train) is not None and spec.names(train) != data_names:
        raise EvalDataError(f"{root / spec.folder}: the {train_split} and {test_split} splits name their classes "
                            "differently; refusing to probe with mismatched labels")
    return LabelledSet(name=name, classnames=classnames, templates=templates, test=TorchvisionSplit(test),
                       train=TorchvisionSplit(train) if train is not None else None, train_missing=train_missing,
                       source=f"torchvision:{root / spec.folder}")
