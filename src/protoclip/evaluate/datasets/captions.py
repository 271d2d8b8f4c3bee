"""Image-text retrieval sets (Table VIII): MS-COCO and Flickr30k, with the split named in the config
(``EvalDatasetConfig.split``), required for these kinds because the two common COCO protocols score different
images (:func:`load_captions`).
"""
from __future__ import annotations

import json
from pathlib import Path

from protoclip.evaluate.datasets.sets import CaptionSet, EvalDataError, FileSplit, fingerprint

SPLITS = {"coco": ("karpathy_test", "val2017"), "flickr30k": ("karpathy_test",)}
KARPATHY_FILES = {
    "coco": ("dataset_coco.json", "coco_test_karpathy.json", "coco_karpathy_test.json"),
    "flickr30k": ("dataset_flickr30k.json", "flickr30k_test_karpathy.txt", "flickr30k_test.json"),
}
IMAGE_DIRS = {"coco": ("val2014", "."), "flickr30k": ("flickr30k-images", "flickr30k_images", "Images", ".")}


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise EvalDataError(f"{path}: not readable JSON ({type(err).__name__}: {err})") from None


def _find(root: Path, names: tuple[str, ...]) -> Path | None:
    for name in names:
        for folder in (root, root / "annotations"):
            if (folder / name).is_file():
                return folder / name
    return None


def _image(root: Path, kind: str, rel: str) -> Path:
    """Where image ``rel`` is: a path with a folder is relative to the root; a bare file name is looked for in the
    set's image folders (the first that has it; the first folder when none has it, for the error line)."""
    candidates = [root / rel] if "/" in rel else [root / d / rel for d in IMAGE_DIRS[kind]]
    return next((p for p in candidates if p.is_file()), candidates[0])


def karpathy_test(kind: str, root: Path) -> tuple[list[tuple[str, list[str]]], Path]:
    """``[(image path relative to root or a file name, captions)]`` of the Karpathy test split, and its file.

    The first file found under ``root`` (or ``root/annotations``) of :data:`KARPATHY_FILES`. COCO (images in
    ``val2014/``): Karpathy's ``dataset_coco.json`` (images with ``split == "test"``), CLIP_benchmark's
    ``coco_test_karpathy.json`` (COCO captions format, file names under ``val2014/``) or BLIP's
    ``coco_karpathy_test.json`` (a list of ``{"image": "val2014/...", "caption": [...]}``). Flickr30k the same way:
    ``dataset_flickr30k.json``, CLIP_benchmark's ``flickr30k_test_karpathy.txt`` (``image.jpg,caption`` lines) or
    BLIP's ``flickr30k_test.json``; images under ``flickr30k-images/``, ``flickr30k_images/``, ``Images/`` or
    ``root`` itself (:data:`IMAGE_DIRS`)."""
    path = _find(root, KARPATHY_FILES[kind])
    if path is None:
        raise FileNotFoundError(f"no Karpathy test split file ({', '.join(KARPATHY_FILES[kind])}) under {root} or "
                                f"{root / 'annotations'}")
    items: list[tuple[str, list[str]]] = []
    try:
        if path.suffix == ".txt":  # CLIP_benchmark's Flickr file: a header, then "<image>.jpg,<caption>" lines
            by_image: dict[str, list[str]] = {}
            for line in path.read_text(encoding="utf-8").splitlines()[1:]:
                if line.strip():
                    image, caption = line.strip().split(".jpg,", 1)
                    by_image.setdefault(image + ".jpg", []).append(caption.strip())
            items = list(by_image.items())
        else:
            data = _read_json(path)
            if isinstance(data, list):  # BLIP: [{"image": "val2014/x.jpg", "caption": [...]}, ...]
                items = [(d["image"], [c.strip() for c in d["caption"]]) for d in data]
            elif "annotations" in data:  # CLIP_benchmark's COCO file: COCO captions format
                items = _coco_format(data)
            else:  # Karpathy: {"images": [{"split", "filepath"?, "filename", "sentences": [{"raw"}]}]}
                items = [((f"{img['filepath']}/" if img.get("filepath") else "") + img["filename"],
                          [s["raw"].strip() for s in img["sentences"]])
                         for img in data["images"] if img.get("split") == "test"]
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise EvalDataError(f"{path}: not a Karpathy split file of a known format ({type(err).__name__}: "
                            f"{err})") from None
    return items, path


def _coco_format(data: dict) -> list[tuple[str, list[str]]]:
    by_image: dict[int, list[str]] = {}
    for a in data["annotations"]:
        by_image.setdefault(a["image_id"], []).append(a["caption"].strip())
    return [(img["file_name"], by_image[img["id"]]) for img in sorted(data["images"], key=lambda im: im["id"])
            if img["id"] in by_image]


def coco_val2017(root: Path) -> tuple[list[tuple[str, list[str]]], Path]:
    """Every image of ``annotations/captions_val2017.json`` with all its captions, images in ``val2017/``, in
    image-id order: what the official ProtoCLIP code evaluates (megvii-research/protoclip,
    ``src/training/evaluations/coco_retrieval.py``: ``CocoCaptions`` on ``coco2017/val2017`` with
    ``coco2017/annotations/captions_val2017.json``), also 5,000 images."""
    ann = root / "annotations" / "captions_val2017.json"
    if not ann.is_file():
        raise FileNotFoundError(f"no {ann} (split val2017: COCO 2017's caption annotations, images in val2017/)")
    try:
        items = _coco_format(_read_json(ann))
    except (KeyError, TypeError, AttributeError) as err:
        raise EvalDataError(f"{ann}: not COCO's captions format ({type(err).__name__}: {err})") from None
    return [(f"val2017/{name}", caps) for name, caps in items], ann


def load_captions(kind: str, name: str, root: Path, split: str | None) -> CaptionSet:
    """Retrieval set ``name`` of ``kind`` (coco / flickr30k), split ``split``: ``karpathy_test``, the 5,000 test
    images of Karpathy's split (the retrieval literature's, CLIP_benchmark's; :func:`karpathy_test`), or, COCO only,
    ``val2017`` (the official ProtoCLIP code's, :func:`coco_val2017`). Every image the split names must be on disk
    (checked here, one line naming the first missing file), so a partial copy is never scored as the whole split."""
    if split not in SPLITS[kind]:
        raise EvalDataError(f"{root}: split {split!r} of a {kind} set is not one of {', '.join(SPLITS[kind])}")
    items, source = coco_val2017(root) if split == "val2017" else karpathy_test(kind, root)
    if not items:
        raise EvalDataError(f"{source}: no {split} images with captions")
    paths = [_image(root, kind, rel) for rel, _ in items]
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise EvalDataError(f"{missing[0]}: missing ({len(missing)} of the {len(paths)} images of {source.name}'s "
                            f"{split} split are not on disk); complete the copy or point `path` at it")
    return CaptionSet(name, FileSplit([str(p) for p in paths], list(range(len(paths)))), [c for _, c in items],
                      source=f"{split}:{fingerprint(source)}")
