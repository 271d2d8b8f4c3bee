"""The set types every loader returns (:class:`LabelledSet`, :class:`CaptionSet`, :class:`Skipped`) and the split
readers they share. A split yields ``(PIL RGB image, int label)`` and has a length; map-style splits
(:class:`Indexed`) also index, so feature extraction can spread decoding over DataLoader workers, while
:class:`WdsSplit` streams webdataset shards in order.
"""
from __future__ import annotations

import logging
import re
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from PIL import Image

from protoclip.data.loading.reading import SEP, ImageReadError, TarCache, decode_image, read_image
from protoclip.errors import UserError

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".ppm", ".tif", ".tiff")


class EvalDataError(UserError):
    """An evaluation set's file cannot be read as the layout says (a cut shard, a missing label file, class names
    that do not match the prompts); the message is one line naming the file. The CLI prints it and exits 2."""

    kind = "data error"


# --------------------------------------------------------------------------- sets
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
    """Labelled images: a test split, a train split when asked for and present (probes), names, templates."""
    name: str
    classnames: list[str]
    templates: list[str]  # empty: zero-shot classification does not apply
    test: ImageSplit
    train: ImageSplit | None = None
    captions: CaptionSet | None = None  # heldout_pairs carries its retrieval pairs here
    source: str = ""
    # the probe subsample in use (subsample.subsample_set): max_train / max_test / seed and, per split, n / of /
    # how; None = whole splits (no max configured). Recorded in the metrics files and the feature cache key.
    subsample: dict[str, Any] | None = None
    # why ``train`` is None although a task asked for it (e.g. "no train split: <dir> not found"): the probes
    # are skipped with this line, the set's other tasks run; None: not asked for, or the data has none at all
    train_missing: str | None = None

    def __len__(self) -> int:
        return len(self.test)


@dataclass(frozen=True)
class Skipped:
    """A set whose data is not configured or not there; ``reason`` is the line tables show (never an exception,
    never a 0)."""
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


class Indexed:
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
class ArraySplit(Indexed):
    """Images held in a uint8 array [N,H,W(,C)]."""
    images: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[Image.Image, int]:
        return to_rgb(np.ascontiguousarray(self.images[i])), int(self.labels[i])


@dataclass
class FileSplit(Indexed):
    """Images read lazily from paths (``shard.tar::member`` reads a tar member)."""
    paths: list[str]
    labels: list[int]
    _tars: TarCache = field(default_factory=TarCache, repr=False)  # open shards, per process

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[Image.Image, int]:
        return read_image(str(self.paths[i]), self._tars), int(self.labels[i])


@dataclass
class TorchvisionSplit(Indexed):
    """A torchvision data set built without transform: ``[i] -> (PIL, target)``."""
    dataset: Any

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> tuple[Image.Image, int]:
        try:
            img, y = self.dataset[i]
            return to_rgb(img), int(y)
        # what PIL raises for a cut / foreign image file (torchvision's loader opens it with PIL): one line
        # naming the file, not a traceback
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
class SubsetSplit(Indexed):
    """Items ``indices`` of a map-style split (torchvision or another :class:`Indexed`), in that order."""
    split: Any
    indices: np.ndarray

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> tuple[Image.Image, int]:
        return self.split[int(self.indices[i])]


@dataclass
class WdsSplit:
    """CLIP_benchmark webdataset shards, read in order: each sample's image (webp / png / jpg) and its label.

    ``label="cls"``: a classification sample's ``.cls`` (class id); ``label="index"``: a retrieval sample
    (image + ``.txt`` captions), labelled by its position (the image index of the :class:`CaptionSet`)."""
    shards: list[str]
    label: str = "cls"
    _len: int | None = field(default=None, repr=False)

    image_exts: tuple[str, ...] = ("webp", "png", "jpg", "jpeg")  # CLIP_benchmark's order; first present is used

    def __len__(self) -> int:
        if self._len is None:  # one pass over the tar headers, no decoding
            marker = ".cls" if self.label == "cls" else ".txt"
            n = 0
            for shard in self.shards:
                try:
                    with tarfile.open(shard) as tf:
                        n += sum(1 for m in tf.getmembers() if m.name.endswith(marker))
                except (tarfile.TarError, OSError, EOFError) as err:
                    raise shard_error(shard, err) from None
            self._len = n
        return self._len

    def samples(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """``(shard, sample dict)`` in shard order; one pipeline per shard so that a cut shard is named."""
        import webdataset as wds  # heavy: webdataset (torch), only when shards are read

        for shard in self.shards:
            samples = iter(wds.WebDataset([shard], shardshuffle=False, empty_check=False))
            while True:
                try:
                    sample = next(samples)
                except StopIteration:
                    break
                except (tarfile.TarError, OSError, EOFError, ValueError) as err:
                    raise shard_error(shard, err) from None
                yield shard, sample

    def __iter__(self) -> Iterator[tuple[Image.Image, int]]:
        """Samples in shard order. Bytes are decoded here rather than by webdataset's ``.decode("pil")`` so that a
        bad image is reported as ``shard::member`` (webdataset's decoder error names neither)."""
        for i, (shard, sample) in enumerate(self.samples()):
            yield self._decode(shard, sample, i)

    def _decode(self, shard: str, sample: dict[str, Any], i: int) -> tuple[Image.Image, int]:
        key = sample.get("__key__", "?")
        ext = next((e for e in self.image_exts if e in sample), None)
        tag = "cls" if self.label == "cls" else "txt"
        if ext is None or tag not in sample:
            raise EvalDataError(f"{shard}{SEP}{key}: sample has no {tag if ext else ' / '.join(self.image_exts)} "
                                f"member (has {sorted(k for k in sample if not k.startswith('__'))})")
        if self.label == "cls":
            try:
                y = int(sample["cls"])
            except ValueError:
                raise EvalDataError(f"{shard}{SEP}{key}.cls: not an integer class id "
                                    f"({sample['cls'][:20]!r})") from None
        else:
            y = i
        return decode_image(sample[ext], f"{shard}{SEP}{key}.{ext}"), y


def shard_error(shard: str, err: BaseException) -> EvalDataError:
    # webdataset re-raises tar errors with (message, stream, url) as args: keep the message
    text = err.args[0] if err.args and isinstance(err.args[0], str) else str(err)
    text = text.strip().splitlines()[0] if text.strip() else ""
    return EvalDataError(f"{shard}: cannot read the webdataset shard ({type(err).__name__}: {text}); it is cut or "
                         "not a tar: restore it")


# --------------------------------------------------------------------------- small helpers
def norm(name: str) -> str:
    """Class name key for matching spellings: lower case, letters and digits only (``Apply_Eye_Makeup`` ==
    ``Apply Eye Makeup`` == ``applyeyemakeup``)."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


def read_lines(path: Path) -> list[str]:
    """Non-empty stripped lines of a text file; a file that cannot be read is an :class:`EvalDataError`."""
    try:
        return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as err:
        raise EvalDataError(f"{path}: cannot read ({type(err).__name__}: {err})") from None


def fingerprint(*paths: Path) -> str:
    """``path:size:mtime`` of each file: what the feature cache key records as the set's source."""
    parts = []
    for p in paths:
        st = p.stat()
        parts.append(f"{p}:{st.st_size}:{int(st.st_mtime)}")
    return ";".join(parts)


def images_under(folder: Path) -> list[Path]:
    """Image files under ``folder`` (recursively), sorted."""
    return sorted(q for q in folder.rglob("*") if q.suffix.lower() in IMAGE_SUFFIXES and q.is_file())
