"""The offline default's sets: ``data/prepared/eval/<name>.npz`` from ``protoclip prepare``, and the held-out
caption pairs of the manifest (``heldout_pairs``: retrieval + coarse-label probes and zero-shot).
"""
from __future__ import annotations

import logging
import re
import zipfile
import zlib
from pathlib import Path

import numpy as np

from protoclip.data.loading.manifest import absolute_paths, read_manifest
from protoclip.evaluate.datasets.sets import (ArraySplit, CaptionSet, EvalDataError, FileSplit, LabelledSet,
                                              fingerprint, norm)
from protoclip.evaluate.prompts import has_prompts, load_prompts
from protoclip.files.layout import Layout

log = logging.getLogger(__name__)

HELDOUT = "heldout_pairs"


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
        if [norm(c) for c in prompts.classnames] == [norm(c) for c in classnames]:
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
        test=ArraySplit(images[test], labels[test]), source=fingerprint(path))


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
    manifest = manifest or layout.manifest
    df = read_manifest(manifest, columns=["id", "path", "caption", "label", "split"])
    df["path"] = absolute_paths(df["path"].astype(str), manifest.parent)  # data.loading.manifest's rule
    df["label"] = df["label"].fillna("").astype(str)
    held = df[df["split"] == "heldout"].reset_index(drop=True)
    if held.empty:
        raise EvalDataError(f"{manifest}: no rows with split == 'heldout'; rerun `protoclip prepare`")
    captions = CaptionSet(HELDOUT, FileSplit(list(held["path"]), list(range(len(held)))),
                          [[str(c)] for c in held["caption"]], source=fingerprint(manifest))
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
                       source=fingerprint(manifest))
