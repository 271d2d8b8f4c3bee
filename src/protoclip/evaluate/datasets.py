"""Evaluation data sets behind one interface: labelled image sets and image-caption sets.

Every configured set (``evaluate.datasets`` in the config) is opened by :func:`load_eval_set` into

* :class:`LabelledSet`: ``classnames``, ``templates`` (empty = no zero-shot), ``train`` / ``test``
  splits that yield ``(PIL RGB image, int label)`` and have ``len``; optionally ``captions``;
* :class:`CaptionSet`: images (yielding ``(PIL image, image index)``) and a list of captions per image,
  for image-text retrieval;
* :class:`Skipped`: the set's path is not configured (``null``) or not found. Its ``reason`` is the line
  tables show (``skipped: cifar10 not found at /x``); a missing set is never an exception and never a 0.

Kinds (``EvalDatasetConfig.kind``):

* ``offline``: ``data/prepared/eval/<name>.npz`` from ``protoclip prepare`` (images uint8 [N,H,W,3],
  labels, split train/test, classnames); the name ``heldout_pairs`` reads the manifest instead
  (held-out caption pairs: retrieval + coarse-label probes, see :func:`load_heldout_pairs`).
* ``torchvision``: torchvision's on-disk layouts, never downloading (CIFAR10/100, STL10, DTD, Food101,
  OxfordIIITPet, RenderedSST2, Country211, Flowers102, GTSRB, StanfordCars, ImageNet; ImageNet also as
  an ImageFolder ``train/`` + ``val/`` tree when the devkit is absent).
* ``folder``: ``root/<split>/<class>/*.jpg`` (Birdsnap, UCF101 middle frames, ...).
* ``wds``: clip_benchmark webdataset shards ``root/{train,test}/*.tar`` with ``classnames.txt`` and
  ``zeroshot_classification_templates.txt``; samples hold ``cls`` and ``webp``/``jpg``/``png``.
* ``coco``: COCO captions (Karpathy 5k test split from ``dataset_coco.json`` when present, else
  ``annotations/captions_val2017.json`` with ``val2017/``).

Broken data stops evaluation (our choice, the project's rule for evaluation inputs): an image that does not
decode (a file of a folder / COCO / torchvision set, a member of a webdataset shard), a shard cut in the
middle, or an offline ``.npz`` that is cut or not an npz raises a :class:`~protoclip.errors.UserError`
naming the file (``shard.tar::member`` for a shard member): the CLI prints one line and exits 2. Skipping
would silently score the model on a smaller test set, which changes the numbers.

``max_train`` / ``max_test`` of a set's config cut a labelled set's splits to a fixed seeded subsample
(:func:`subsample_set`: class-stratified when the labels are known without decoding, uniform otherwise, the
same images for every run; webdataset splits stay whole); caption sets are never cut.

    from protoclip.evaluate.datasets import load_eval_set
    ds = load_eval_set("cifar10", cfg.evaluate.datasets["cifar10"], Layout.from_config(cfg), seed=cfg.evaluate.seed)
"""
from __future__ import annotations

import json
import logging
import re
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from PIL import Image

from protoclip.data.reading import SEP, ImageReadError, TarCache, decode_image, read_image
from protoclip.errors import UserError
from protoclip.evaluate.config import EvalDatasetConfig
from protoclip.evaluate.prompts import canonical, has_prompts, load_prompts
from protoclip.layout import Layout

log = logging.getLogger(__name__)

HELDOUT = "heldout_pairs"
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".ppm", ".tif", ".tiff")
# split directory names accepted for the folder kind (UCF101 splits are often trainlist01 / testlist01)
SPLIT_DIRS = {"train": ("train", "trainlist01", "training"), "test": ("test", "testlist01", "val", "validation")}


class EvalDataError(UserError):
    """An evaluation set's file (an offline ``.npz``, a webdataset shard) cannot be read; the message names it."""

    kind = "data error"


# --------------------------------------------------------------------------- interface
class ImageSplit(Protocol):
    """Iterable of ``(PIL RGB image, int label)`` with a length; labels are class ids (or image ids)."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[tuple[Image.Image, int]]: ...


@dataclass
class CaptionSet:
    """Images and their captions (``captions[i]`` belong to image ``i``), for retrieval."""
    name: str
    images: ImageSplit  # yields (image, image index)
    captions: list[list[str]]
    source: str = ""  # what was read (for the feature cache key and the metrics file)

    def __post_init__(self) -> None:
        if len(self.images) != len(self.captions):
            raise ValueError(f"{self.name}: {len(self.images)} images but {len(self.captions)} caption lists")

    @property
    def texts(self) -> list[str]:
        return [c for caps in self.captions for c in caps]

    @property
    def text_to_image(self) -> np.ndarray:
        return np.asarray([i for i, caps in enumerate(self.captions) for _ in caps], dtype=np.int64)


@dataclass
class LabelledSet:
    """Labelled images: a test split, usually a train split (linear / k-NN probes), names, templates."""
    name: str
    classnames: list[str]
    templates: list[str]  # empty: zero-shot classification does not apply
    test: ImageSplit
    train: ImageSplit | None = None
    captions: CaptionSet | None = None  # heldout_pairs carries its retrieval pairs here
    source: str = ""
    # the probe subsample in use (subsample_set): max_train / max_test / seed and, per split, n / of / how;
    # None = whole splits (no max configured). Recorded in the metrics files and the feature cache key.
    subsample: dict[str, Any] | None = None

    def __len__(self) -> int:
        return len(self.test)


@dataclass(frozen=True)
class Skipped:
    name: str
    reason: str  # "skipped: <name> not found at <path>" / "skipped: <name> path not configured"


EvalSet = LabelledSet | CaptionSet


# --------------------------------------------------------------------------- splits
def to_rgb(img: Any) -> Image.Image:
    """PIL image (any mode) or HxW / HxWx{1,3,4} uint8 array -> RGB PIL image."""
    if isinstance(img, np.ndarray):
        img = Image.fromarray(img[..., 0] if img.ndim == 3 and img.shape[-1] == 1 else img)
    if not isinstance(img, Image.Image):
        raise TypeError(f"expected a PIL image or an array, got {type(img).__name__}")
    return img if img.mode == "RGB" else img.convert("RGB")


class _Indexed:
    """Map-style splits: ``split[i] -> (PIL RGB image, label)``; iteration goes through the indices, and
    feature extraction can spread ``__getitem__`` over DataLoader workers."""

    def __len__(self) -> int:
        raise NotImplementedError

    def __getitem__(self, i: int) -> tuple[Image.Image, int]:
        raise NotImplementedError

    def __iter__(self) -> Iterator[tuple[Image.Image, int]]:
        for i in range(len(self)):
            yield self[i]


@dataclass
class ArraySplit(_Indexed):
    """Images held in a uint8 array [N,H,W(,C)]."""
    images: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[Image.Image, int]:
        return to_rgb(np.ascontiguousarray(self.images[i])), int(self.labels[i])


@dataclass
class FileSplit(_Indexed):
    """Images read lazily from paths (``shard.tar::member`` reads a tar member)."""
    paths: list[str]
    labels: list[int]
    _tars: TarCache = field(default_factory=TarCache, repr=False)  # open shards, per process

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[Image.Image, int]:
        return read_image(str(self.paths[i]), self._tars), int(self.labels[i])


@dataclass
class TorchvisionSplit(_Indexed):
    """A torchvision data set built without transform: ``[i] -> (PIL, target)``."""
    dataset: Any

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> tuple[Image.Image, int]:
        try:
            img, y = self.dataset[i]
            return to_rgb(img), int(y)
        # what PIL raises for a cut / foreign image file (torchvision's loader opens it with PIL): one line
        # naming the file, not a traceback (module docstring)
        except (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError) as err:
            raise ImageReadError(f"{_torchvision_item(self.dataset, i)}: cannot decode the image "
                                 f"({type(err).__name__}: {err})") from None


def _torchvision_item(dataset: Any, i: int) -> str:
    """The file of item ``i`` of a torchvision set (the attribute differs by class), else the set and index."""
    for attr in ("samples", "_samples", "imgs", "_image_files", "_images"):
        files = getattr(dataset, attr, None)
        if isinstance(files, (list, tuple)) and len(files) == len(dataset):
            item = files[i]
            return str(item[0] if isinstance(item, (list, tuple)) else item)
    return f"{type(dataset).__name__} at {getattr(dataset, 'root', '?')}, item {i}"


@dataclass
class WdsSplit:
    """clip_benchmark-style webdataset shards: samples with ``cls`` and an image (webp / jpg / png)."""
    shards: list[str]
    _len: int | None = field(default=None, repr=False)

    image_exts: tuple[str, ...] = ("webp", "jpg", "jpeg", "png")  # first present is the sample's image

    def __len__(self) -> int:
        if self._len is None:  # one pass over the tar headers, no decoding
            n = 0
            for shard in self.shards:
                try:
                    with tarfile.open(shard) as tf:
                        n += sum(1 for m in tf.getmembers() if m.name.endswith(".cls"))
                except (tarfile.TarError, OSError, EOFError) as err:
                    raise _shard_error(shard, err) from None
            self._len = n
        return self._len

    def __iter__(self) -> Iterator[tuple[Image.Image, int]]:
        """Samples in shard order. Bytes are decoded here rather than by webdataset's ``.decode("pil")`` so
        that a bad image is reported as ``shard::member`` (webdataset's decoder error names neither); one
        pipeline per shard so that a cut shard is named."""
        import webdataset as wds

        for shard in self.shards:
            samples = iter(wds.WebDataset([shard], shardshuffle=False, empty_check=False))
            while True:
                try:
                    sample = next(samples)
                except StopIteration:
                    break
                except (tarfile.TarError, OSError, EOFError, ValueError) as err:
                    raise _shard_error(shard, err) from None
                yield self._decode(shard, sample)

    def _decode(self, shard: str, sample: dict[str, Any]) -> tuple[Image.Image, int]:
        key = sample.get("__key__", "?")
        ext = next((e for e in self.image_exts if e in sample), None)
        if ext is None or "cls" not in sample:
            raise EvalDataError(f"{shard}{SEP}{key}: sample has no {'cls' if ext else ' / '.join(self.image_exts)} "
                                f"member (has {sorted(k for k in sample if not k.startswith('__'))})")
        try:
            y = int(sample["cls"])
        except ValueError:
            raise EvalDataError(f"{shard}{SEP}{key}.cls: not an integer class id ({sample['cls'][:20]!r})") from None
        return decode_image(sample[ext], f"{shard}{SEP}{key}.{ext}"), y


def _shard_error(shard: str, err: BaseException) -> EvalDataError:
    # webdataset re-raises tar errors with (message, stream, url) as args: keep the message
    text = err.args[0] if err.args and isinstance(err.args[0], str) else str(err)
    text = text.strip().splitlines()[0] if text.strip() else ""
    return EvalDataError(f"{shard}: cannot read the webdataset shard ({type(err).__name__}: {text}); it is cut or "
                         "not a tar: restore it")


@dataclass
class SubsetSplit(_Indexed):
    """Items ``indices`` of a map-style split (torchvision or another :class:`_Indexed`), in that order."""
    split: Any
    indices: np.ndarray

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> tuple[Image.Image, int]:
        return self.split[int(self.indices[i])]


# --------------------------------------------------------------------------- probe subsample
# A fixed, documented subsample of a labelled set's splits (EvalDatasetConfig.max_train / max_test). Our
# choice for the offline budget (issue: budget), not a paper protocol: the paper probes whole sets. The
# indices depend only on (evaluate.seed, the set's name, the split, the split's labels / size, the max), never
# on the run or the model, so every run is probed on the same images and runs stay comparable.
def cheap_labels(split: Any) -> np.ndarray | None:
    """The labels of a split when known without decoding an image (arrays, file lists, torchvision sets that
    keep ``targets`` / ``_labels`` / ``labels``), else None."""
    if isinstance(split, (ArraySplit, FileSplit)):
        return np.asarray(split.labels, dtype=np.int64)
    if isinstance(split, TorchvisionSplit):
        for attr in ("targets", "_labels", "labels"):
            labels = getattr(split.dataset, attr, None)
            if labels is not None and len(labels) == len(split.dataset):
                try:
                    return np.asarray(labels, dtype=np.int64).reshape(len(split.dataset))
                except (TypeError, ValueError):  # e.g. non-integer targets: fall back to uniform
                    return None
    return None


def stratified_indices(labels: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` indices into ``labels``, per class in proportion to its count, sorted (original order).

    Per-class quotas by the largest-remainder method (floor of ``n * n_c / N``, the images left over go to the
    classes with the largest fractional parts, ties to the lower class id), so each class's count is within 1
    of proportional; the images of each class are a seeded draw without replacement.
    """
    labels = np.asarray(labels)
    classes, counts = np.unique(labels, return_counts=True)
    exact = n * counts / counts.sum()
    quota = np.floor(exact).astype(np.int64)
    left = n - int(quota.sum())
    order = np.lexsort((np.arange(len(classes)), -(exact - quota)))  # largest remainder first, stable
    quota[order[:left]] += 1
    picked = [rng.choice(np.flatnonzero(labels == c), size=int(q), replace=False)
              for c, q in zip(classes, quota) if q > 0]
    return np.sort(np.concatenate(picked)) if picked else np.zeros(0, dtype=np.int64)


def subsample_indices(name: str, which: str, n_total: int, n: int, seed: int,
                      labels: np.ndarray | None = None) -> np.ndarray:
    """The fixed subsample of split ``which`` ("train" / "test") of set ``name``: class-stratified when
    ``labels`` are given, else uniform; sorted; seeded by ``[seed, crc32(name), crc32(which)]`` only."""
    rng = np.random.default_rng([int(seed), zlib.crc32(name.encode()), zlib.crc32(which.encode())])
    if labels is not None:
        return stratified_indices(labels, n, rng)
    return np.sort(rng.choice(n_total, size=n, replace=False))


def _subsample_split(name: str, which: str, split: ImageSplit, n: int | None,
                     seed: int) -> tuple[ImageSplit, dict[str, Any]]:
    total = len(split)
    if n is None or total <= n:
        return split, {"n": total, "of": total, "how": "whole"}
    if isinstance(split, WdsSplit):  # iterable shards: no random access, and the first N may be class-sorted
        log.warning("%s: max_%s = %d is not supported for webdataset shards; the whole %s split (%d images) "
                    "is used", name, which, n, which, total)
        return split, {"n": total, "of": total, "how": "whole (webdataset: subsample unsupported)"}
    labels = cheap_labels(split)
    idx = subsample_indices(name, which, total, n, seed, labels)
    how = "class-stratified" if labels is not None else "uniform"
    if isinstance(split, ArraySplit):
        out: ImageSplit = ArraySplit(split.images[idx], split.labels[idx])
    elif isinstance(split, FileSplit):
        out = FileSplit([split.paths[i] for i in idx], [split.labels[i] for i in idx])
    else:
        out = SubsetSplit(split, idx)
    return out, {"n": len(idx), "of": total, "how": how}


def subsample_set(ds: LabelledSet, max_train: int | None, max_test: int | None, seed: int) -> LabelledSet:
    """``ds`` with its train / test splits cut to the fixed subsample (captions untouched); ``ds.subsample``
    records what was used. Without a max it is returned as is (``subsample`` None)."""
    if max_train is None and max_test is None:
        return ds
    info: dict[str, Any] = {"max_train": max_train, "max_test": max_test, "seed": int(seed)}
    test, info["test"] = _subsample_split(ds.name, "test", ds.test, max_test, seed)
    train = None
    if ds.train is not None:
        train, info["train"] = _subsample_split(ds.name, "train", ds.train, max_train, seed)
    return replace(ds, train=train, test=test, subsample=info)


# --------------------------------------------------------------------------- helpers
def _norm(name: str) -> str:
    """Folder / class name key for matching: lower case, letters and digits only."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _read_lines(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _templates_from_file(path: Path) -> list[str]:
    # clip_benchmark writes templates with a "{c}" placeholder; ours use "{}"
    return [t.replace("{c}", "{}") for t in _read_lines(path)]


def _prompt_templates(name: str) -> list[str]:
    return load_prompts(name).templates if has_prompts(name) else []


def _fingerprint(*paths: Path) -> str:
    parts = []
    for p in paths:
        st = p.stat()
        parts.append(f"{p}:{st.st_size}:{int(st.st_mtime)}")
    return ";".join(parts)


# --------------------------------------------------------------------------- offline
def load_offline_npz(name: str, path: Path) -> LabelledSet:
    """``data/prepared/eval/<name>.npz`` -> LabelledSet; templates from the prompts JSON when it has the set.

    A file that is cut, not an npz, or lacks / misshapes the arrays raises :class:`EvalDataError` naming it."""
    redo = "rerun `protoclip prepare` (it writes this file) or, if the file is your own, replace it"
    try:
        with np.load(path, allow_pickle=False) as z:
            missing = {"images", "labels", "split", "classnames"} - set(z.files)
            if missing:
                raise EvalDataError(f"{path}: missing arrays {sorted(missing)} (has {z.files}); {redo}")
            images, labels = z["images"], z["labels"].astype(np.int64)
            split, classnames = z["split"].astype(str), [str(c) for c in z["classnames"]]
    except EvalDataError:
        raise
    # np.load / the lazy array reads of a cut or foreign file: BadZipFile, ValueError (pickled or bad
    # header), EOFError / OSError (cut), zlib.error (damaged deflate stream)
    except (zipfile.BadZipFile, ValueError, EOFError, OSError, KeyError, zlib.error) as err:
        raise EvalDataError(f"{path}: cannot read the offline evaluation set ({type(err).__name__}: "
                            f"{str(err).strip().splitlines()[0] if str(err).strip() else ''}); {redo}") from None
    if images.dtype != np.uint8 or images.ndim not in (3, 4) or not len(images) == len(labels) == len(split):
        raise EvalDataError(f"{path}: images must be uint8 [N,H,W(,3)] with one label and split per image, "
                         f"got {images.dtype} {images.shape}, {labels.shape} labels, {split.shape} splits")
    templates: list[str] = []
    if has_prompts(name):
        prompts = load_prompts(name)
        templates = prompts.templates
        if [_norm(c) for c in prompts.classnames] == [_norm(c) for c in classnames]:
            classnames = prompts.classnames  # prompt-friendly spellings of the same classes, same order
        else:
            log.warning("%s: the npz class names differ from the prompts JSON's (%s vs %s); using the npz names",
                        name, classnames[:3], prompts.classnames[:3])
    train, test = split == "train", split == "test"
    if not test.any():
        raise EvalDataError(f"{path}: no rows with split == 'test'")
    return LabelledSet(
        name=name, classnames=classnames, templates=templates,
        train=ArraySplit(images[train], labels[train]) if train.any() else None,
        test=ArraySplit(images[test], labels[test]), source=_fingerprint(path))


def _resolve_manifest_path(p: str, root: Path) -> str:
    """Relative manifest paths are relative to the prepared-data folder (protoclip.data.pairs' rule)."""
    return p if Path(p.split(SEP, 1)[0]).is_absolute() else str(root / p)


# Zero-shot prompts of the held-out coarse labels (our choice: no paper protocol exists for these data). The
# images are clip art, cut-out photos and emoji, so the templates name those media, CLIP-style.
HELDOUT_TEMPLATES = ["a picture of {}.", "a drawing of {}.", "a clip art of {}.", "an emoji of {}.",
                     "an icon of {}.", "{}."]


def label_words(labels: list[str]) -> list[str]:
    """Coarse labels in words, for zero-shot prompts: the last folder / subgroup, '-' and '_' as spaces.

    ``Travel & Places/transport-ground`` -> ``transport ground`` (emoji subgroup), ``animals/mammals`` ->
    ``mammals`` (Tux Paint), ``food`` -> ``food`` (Openclipart). Labels whose short forms collide keep every
    level (``food fruit`` vs ``fruit``), so class names stay distinct.
    """
    def words(parts: list[str]) -> str:
        return " ".join(re.sub(r"[-_]+", " ", p).replace("&", "and").strip().lower() for p in parts).strip()

    short = [words(label.split("/")[-1:]) for label in labels]
    counts = {w: short.count(w) for w in short}
    return [w if counts[w] == 1 else words(label.split("/")) for w, label in zip(short, labels)]


def load_heldout_pairs(layout: Layout, manifest: Path | None = None) -> LabelledSet:
    """Held-out caption pairs of the manifest as retrieval pairs + coarse-label probe set.

    Retrieval: every ``split == heldout`` row (one caption per image). Coarse-label probes: test = held-out
    rows with a non-empty ``label``; train = ``split == train`` rows with a label. Choice (no paper
    protocol exists for these data): the probes are fit on the pretraining images, whose labels the model
    never saw, and tested on images it never saw. Zero-shot: the labels in words (:func:`label_words`) with
    :data:`HELDOUT_TEMPLATES`.
    """
    import pandas as pd

    manifest = manifest or layout.manifest
    df = pd.read_parquet(manifest, columns=["id", "path", "caption", "label", "split"])
    root = manifest.resolve().parent  # = layout.prepared for the default manifest
    df["path"] = [_resolve_manifest_path(p, root) for p in df["path"].astype(str)]
    df["label"] = df["label"].fillna("").astype(str)
    held = df[df["split"] == "heldout"].reset_index(drop=True)
    if held.empty:
        raise ValueError(f"{manifest}: no rows with split == 'heldout'")
    captions = CaptionSet(HELDOUT, FileSplit(list(held["path"]), list(range(len(held)))),
                          [[str(c)] for c in held["caption"]], source=_fingerprint(manifest))
    lab_test = held[held["label"] != ""]
    lab_train = df[(df["split"] == "train") & (df["label"] != "")]
    classnames = sorted(set(lab_test["label"]) | set(lab_train["label"]))
    index = {c: i for i, c in enumerate(classnames)}

    def split(rows) -> FileSplit:
        return FileSplit(list(rows["path"]), [index[c] for c in rows["label"]])

    # no coarse labels (e.g. user pairs): no class names, so no zero-shot (retrieval still runs)
    return LabelledSet(name=HELDOUT, classnames=label_words(classnames),
                       templates=list(HELDOUT_TEMPLATES) if classnames else [],
                       test=split(lab_test),
                       train=split(lab_train) if len(lab_train) else None, captions=captions,
                       source=_fingerprint(manifest))


# --------------------------------------------------------------------------- torchvision
def _no_md5(cls):
    """A CIFAR subclass that checks file presence only: md5 sums guard downloads, and we never download
    (the data is the user's; DVC / the caller fingerprints it). Also lets tests build tiny pickle folders."""
    return type(cls.__name__, (cls,), {
        "train_list": [[f, None] for f, _ in cls.train_list],
        "test_list": [[f, None] for f, _ in cls.test_list],
        "meta": {**cls.meta, "md5": None},
    })


def _torchvision_splits(name: str, root: Path) -> tuple[Any, Any]:
    """(train, test) torchvision data sets of ``name`` under ``root``, ``download=False``."""
    from torchvision import datasets as tvd

    def by_split(cls, train: str, test: str, **kw):
        return cls(str(root), split=train, download=False, **kw), cls(str(root), split=test, download=False, **kw)

    if name in ("cifar10", "cifar100"):
        cls = _no_md5(tvd.CIFAR10 if name == "cifar10" else tvd.CIFAR100)
        return cls(str(root), train=True, download=False), cls(str(root), train=False, download=False)
    table: dict[str, Callable[[], tuple[Any, Any]]] = {
        "stl10": lambda: by_split(tvd.STL10, "train", "test"),
        "dtd": lambda: by_split(tvd.DTD, "train", "test"),  # partition 1 (torchvision default)
        "food101": lambda: by_split(tvd.Food101, "train", "test"),
        "oxford_pets": lambda: by_split(tvd.OxfordIIITPet, "trainval", "test", target_types="category"),
        "rendered_sst2": lambda: by_split(tvd.RenderedSST2, "train", "test"),
        "country211": lambda: by_split(tvd.Country211, "train", "test"),
        "flowers102": lambda: by_split(tvd.Flowers102, "train", "test"),
        "gtsrb": lambda: by_split(tvd.GTSRB, "train", "test"),
        "stanford_cars": lambda: by_split(tvd.StanfordCars, "train", "test"),
        "imagenet": lambda: (tvd.ImageNet(str(root), split="train"), tvd.ImageNet(str(root), split="val")),
    }
    if name not in table:
        raise ValueError(f"no torchvision loader for data set {name!r} (known: cifar10, cifar100, "
                         f"{', '.join(table)}); use kind folder / wds for other sets")
    return table[name]()


def load_torchvision(name: str, root: Path) -> LabelledSet:
    key = canonical(name)
    if key == "imagenet" and not (root / "meta.bin").exists() and (root / "val").is_dir():
        # torchvision.datasets.ImageNet needs the devkit (meta.bin); a plain train/ + val/ tree is read as folders
        return load_folder(name, root)
    train, test = _torchvision_splits(key, root)
    prompts = load_prompts(key)
    n = len(getattr(test, "classes", prompts.classnames))
    if n != len(prompts.classnames):
        raise ValueError(f"{name}: torchvision has {n} classes, the prompts JSON {len(prompts.classnames)}")
    return LabelledSet(name=name, classnames=prompts.classnames, templates=prompts.templates,
                       train=TorchvisionSplit(train), test=TorchvisionSplit(test), source=f"torchvision:{root}")


# --------------------------------------------------------------------------- folder tree
def _split_dir(root: Path, split: str) -> Path | None:
    for d in SPLIT_DIRS[split]:
        if (root / d).is_dir():
            return root / d
    return None


def _folder_classes(name: str, root: Path, folders: list[str]) -> tuple[list[str], dict[str, int]]:
    """Class names (label order) and folder -> label, from classnames.txt, the prompts JSON, or the folders."""
    if (root / "classnames.txt").exists():  # label order = sorted folder order (as ImageFolder)
        names = _read_lines(root / "classnames.txt")
        if len(names) != len(folders):
            raise ValueError(f"{root}/classnames.txt has {len(names)} names but there are {len(folders)} "
                             "class folders")
        return names, {f: i for i, f in enumerate(folders)}
    if has_prompts(name):
        known = load_prompts(name).classnames
        if len(folders) == len(known) and all(re.fullmatch(r"n\d{8}", f) for f in folders):
            return known, {f: i for i, f in enumerate(folders)}  # ImageNet wnids: sorted = label order
        by_key = {_norm(c): i for i, c in enumerate(known)}
        hits = {f: by_key.get(_norm(f)) for f in folders}
        if all(v is not None for v in hits.values()):
            order = sorted(set(hits.values()))  # classes present on disk, in the JSON's order
            absent = [known[i] for i in range(len(known)) if i not in set(order)]
            if absent:  # e.g. Birdsnap classes whose images are gone (ProtoCLIP drops them too)
                log.warning("%s: %d classes of the prompts JSON have no folder and are left out: %s", name,
                            len(absent), ", ".join(absent[:10]) + (" ..." if len(absent) > 10 else ""))
            relabel = {j: k for k, j in enumerate(order)}
            return [known[i] for i in order], {f: relabel[v] for f, v in hits.items()}
        log.warning("%s: folder names do not all match the prompts JSON (e.g. %s); using folder names",
                    name, next(f for f, v in hits.items() if v is None))
    if all(f.isdigit() for f in folders):
        raise ValueError(f"{root}: class folders are numbered; add a classnames.txt (one name per line, in "
                         "sorted folder order)")
    return [f.replace("_", " ") for f in folders], {f: i for i, f in enumerate(folders)}


def load_folder(name: str, root: Path) -> LabelledSet:
    """``root/<split>/<class>/<image>`` (ImageFolder layout) with splits train (optional) and test."""
    dirs = {s: _split_dir(root, s) for s in SPLIT_DIRS}
    if dirs["test"] is None:
        raise FileNotFoundError(f"no test split folder ({' / '.join(SPLIT_DIRS['test'])}) under {root}")
    folders = sorted({p.name for d in dirs.values() if d for p in d.iterdir() if p.is_dir()})
    if not folders:
        raise ValueError(f"{root}: no class folders under {dirs['test']}")
    classnames, label_of = _folder_classes(name, root, folders)
    splits: dict[str, FileSplit | None] = {}
    for s, d in dirs.items():
        if d is None:
            splits[s] = None
            continue
        paths, labels = [], []
        for f in sorted(p.name for p in d.iterdir() if p.is_dir()):
            for img in sorted(q for q in (d / f).rglob("*") if q.suffix.lower() in IMAGE_SUFFIXES):
                paths.append(str(img))
                labels.append(label_of[f])
        splits[s] = FileSplit(paths, labels) if paths else None
    if splits["test"] is None:
        raise ValueError(f"{dirs['test']}: no images ({', '.join(IMAGE_SUFFIXES)})")
    templates = (_templates_from_file(root / "zeroshot_classification_templates.txt")
                 if (root / "zeroshot_classification_templates.txt").exists() else _prompt_templates(name))
    return LabelledSet(name=name, classnames=classnames, templates=templates, test=splits["test"],
                       train=splits["train"], source=f"folder:{root}:{len(splits['test'])}")


# --------------------------------------------------------------------------- webdataset shards
def load_wds(name: str, root: Path) -> LabelledSet:
    """clip_benchmark webdataset layout: ``root/{train,test}/*.tar`` + ``classnames.txt`` (+ templates)."""
    shards = {s: sorted(str(p) for p in (root / s).glob("*.tar")) if (root / s).is_dir() else []
              for s in ("train", "test")}
    if not shards["test"]:
        raise FileNotFoundError(f"no test shards at {root / 'test'}/*.tar")
    if (root / "classnames.txt").exists():
        classnames = _read_lines(root / "classnames.txt")
    elif has_prompts(name):
        classnames = load_prompts(name).classnames
    else:
        raise ValueError(f"{root}: no classnames.txt and no prompts for {name!r}")
    tpl = root / "zeroshot_classification_templates.txt"
    templates = _templates_from_file(tpl) if tpl.exists() else _prompt_templates(name)
    return LabelledSet(name=name, classnames=classnames, templates=templates, test=WdsSplit(shards["test"]),
                       train=WdsSplit(shards["train"]) if shards["train"] else None,
                       source=f"wds:{root}:{len(shards['train'])}+{len(shards['test'])} shards")


# --------------------------------------------------------------------------- COCO captions
def load_coco(name: str, root: Path) -> CaptionSet:
    """COCO captions: Karpathy test split (5k images, ~5 captions each) if ``dataset_coco.json`` is under
    ``root`` (or ``root/annotations``), else every image of ``annotations/captions_val2017.json``."""
    karpathy = next((p for p in (root / "dataset_coco.json", root / "annotations" / "dataset_coco.json")
                     if p.exists()), None)
    paths: list[str] = []
    captions: list[list[str]] = []
    if karpathy is not None:
        data = json.loads(karpathy.read_text())
        for img in data["images"]:
            if img.get("split") != "test":
                continue
            folder = root / img["filepath"] if "filepath" in img else root
            paths.append(str(folder / img["filename"]))
            captions.append([s["raw"].strip() for s in img["sentences"]])
        source = karpathy
    else:
        ann = root / "annotations" / "captions_val2017.json"
        if not ann.exists():
            raise FileNotFoundError(f"neither dataset_coco.json nor {ann} under {root}")
        data = json.loads(ann.read_text())
        by_image: dict[int, list[str]] = {}
        for a in data["annotations"]:
            by_image.setdefault(a["image_id"], []).append(a["caption"].strip())
        for img in sorted(data["images"], key=lambda im: im["id"]):
            if img["id"] in by_image:
                paths.append(str(root / "val2017" / img["file_name"]))
                captions.append(by_image[img["id"]])
        source = ann
    if not paths:
        raise ValueError(f"{source}: no test images with captions")
    return CaptionSet(name, FileSplit(paths, list(range(len(paths)))), captions, source=_fingerprint(source))


# --------------------------------------------------------------------------- entry point
LOADERS: dict[str, Callable[[str, Path], EvalSet]] = {
    "torchvision": load_torchvision, "folder": load_folder, "wds": load_wds, "coco": load_coco,
}


def load_eval_set(name: str, cfg: EvalDatasetConfig, layout: Layout, seed: int = 0) -> EvalSet | Skipped:
    """Open data set ``name``; a path that is not configured or not found gives :class:`Skipped`.

    A path that exists but whose files torchvision cannot find (``RuntimeError: Dataset not found``) is
    also reported as not found; malformed data (wrong class counts, missing arrays) raises ``ValueError``.
    A labelled set's splits are cut to ``cfg.max_train`` / ``cfg.max_test`` (:func:`subsample_set`, seeded by
    ``seed`` = ``evaluate.seed`` and the set's name).
    """
    ds = _open_eval_set(name, cfg, layout)
    if isinstance(ds, LabelledSet):
        return subsample_set(ds, cfg.max_train, cfg.max_test, seed)
    return ds


def eval_data_path(name: str, cfg: EvalDatasetConfig, layout: Layout) -> Path | None:
    """Where set ``name`` is read from: its configured path, or for an offline set without one what `prepare`
    writes (the manifest for ``heldout_pairs``, ``data/prepared/eval/<name>.npz`` else); None: not configured."""
    if cfg.path:
        return Path(cfg.path).expanduser()
    if cfg.kind == "offline":
        return layout.manifest if name == HELDOUT else layout.eval_set(name)
    return None


def missing_reason(name: str, cfg: EvalDatasetConfig, layout: Layout) -> str | None:
    """Why set ``name``'s data is absent (the skip line tables show), None when it is present: the one check
    of "is this set's data here" that loading, `collect` and the workflow's DAG share."""
    path = eval_data_path(name, cfg, layout)
    if path is None:
        return f"skipped: {name} path not configured"
    return None if path.exists() else f"skipped: {name} not found at {path}"


def _open_eval_set(name: str, cfg: EvalDatasetConfig, layout: Layout) -> EvalSet | Skipped:
    if (reason := missing_reason(name, cfg, layout)) is not None:
        return Skipped(name, reason)
    root = eval_data_path(name, cfg, layout)
    if cfg.kind == "offline":
        return load_heldout_pairs(layout, root) if name == HELDOUT else load_offline_npz(name, root)
    try:
        return LOADERS[cfg.kind](name, root)
    except (FileNotFoundError, RuntimeError) as err:  # torchvision: "Dataset not found or corrupted"
        return Skipped(name, f"skipped: {name} not found at {root} ({err})")
