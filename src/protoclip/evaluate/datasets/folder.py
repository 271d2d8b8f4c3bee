"""Class-per-folder image trees, ``root/<split>/<class>/<image>`` (torchvision's ImageFolder layout): CLOOB's processed
test sets, which the official ProtoCLIP code reads (``ImageFolder`` on ``<set>/test``, UCF101 ``<set>/testlist01``:
megvii-research/protoclip ``src/training/evaluations/zero_shot.py``), and what ``protoclip birdsnap`` /
``protoclip ucf101`` write.
"""
from __future__ import annotations

import logging
import re
from pathlib import Path

from protoclip.evaluate.datasets.classes import ClassNamesError, prompt_classes, prompt_templates, templates_from_file
from protoclip.evaluate.datasets.imagenet import load_imagenet
from protoclip.evaluate.datasets.sets import (IMAGE_SUFFIXES, EvalDataError, FileSplit, LabelledSet, images_under,
                                              norm, read_lines)
from protoclip.evaluate.prompts import canonical, has_prompts, load_prompts

log = logging.getLogger(__name__)

# split directory names accepted (UCF101's splits are trainlist01 / testlist01)
SPLIT_DIRS = {"train": ("train", "trainlist01", "training"), "test": ("test", "testlist01", "val", "validation")}


def split_dir(root: Path, split: str) -> Path | None:
    for d in SPLIT_DIRS[split]:
        if (root / d).is_dir():
            return root / d
    return None


def folder_classes(name: str, root: Path, folders: list[str]) -> tuple[list[str], dict[str, int]]:
    """Class names (label order) and folder -> label.

    Names: ``classnames.txt`` (one per line, in sorted folder order), else the folder names. Folders named by class
    id (numbers, or Country211's ISO codes) take the prompts' list, which is in id order, when they are all of its
    classes (:func:`_classes_by_id`). For a set with prompts every other name must be one of its prompt class names
    (matched up to case and punctuation: ``ApplyEyeMakeup`` == ``Apply Eye Makeup``), else the set is refused
    (:class:`~.classes.ClassNamesError`); prompt classes without a folder are left out with a warning (Birdsnap:
    images that are no longer online leave classes empty, and the ProtoCLIP code drops those classes too) and the
    labels follow the prompts' order of the classes present."""
    names_file = root / "classnames.txt"
    names = read_lines(names_file) if names_file.exists() else list(folders)
    source = str(names_file if names_file.exists() else root)
    if len(names) != len(folders):
        raise EvalDataError(f"{names_file}: {len(names)} names but {len(folders)} class folders (one name per "
                            "folder, in sorted folder order)")
    if has_prompts(name) and not names_file.exists() and _id_folders(folders):
        return _classes_by_id(name, root, folders)
    if not has_prompts(name):
        if all(f.isdigit() for f in names):
            raise EvalDataError(f"{root}: class folders are numbered; add a classnames.txt (one name per line, in "
                                "sorted folder order)")
        return [n.replace("_", " ") for n in names], {f: i for i, f in enumerate(folders)}
    known = load_prompts(name).classnames
    by_key = {norm(c): i for i, c in enumerate(known)}
    hits = {f: by_key.get(norm(n)) for f, n in zip(folders, names)}
    unknown = [n for (f, v), n in zip(hits.items(), names) if v is None]
    if unknown:
        raise ClassNamesError(f"{source}: class '{unknown[0]}' is not one of the {len(known)} prompt class names of "
                              f"{name} ({len(unknown)} unknown); refusing to score images against other classes' "
                              "names: name the folders after the classes (or add a classnames.txt)")
    order = sorted(set(hits.values()))  # classes present on disk, in the prompts' order
    if len(order) != len(hits):
        raise ClassNamesError(f"{source}: two folders name the same class of {name}")
    absent = [known[i] for i in range(len(known)) if i not in set(order)]
    if absent:
        log.warning("%s: %d classes of the prompts have no folder and are left out: %s", name, len(absent),
                    ", ".join(absent[:10]) + (" ..." if len(absent) > 10 else ""))
    relabel = {j: k for k, j in enumerate(order)}
    return [known[i] for i in order], {f: relabel[v] for f, v in hits.items()}


def _id_folders(folders: list[str]) -> bool:
    """Folders named by class id (GTSRB's 00000.., Flowers' 1..102) or ISO code (Country211), not by name."""
    return all(f.isdigit() for f in folders) or all(re.fullmatch(r"[A-Z]{2}", f) for f in folders)


def _classes_by_id(name: str, root: Path, folders: list[str]) -> tuple[list[str], dict[str, int]]:
    """Id folders of a set with prompts: CLIP's list is in id order (numbers: 0..n-1 or 1..n, compared as numbers;
    ISO codes: sorted), so the folders must be all n classes of the prompts (checked by count)."""
    known = load_prompts(name).classnames
    if len(folders) != len(known):
        raise ClassNamesError(f"{root}: {len(folders)} class folders named by id, but {name} has {len(known)} "
                              "prompt classes; add a classnames.txt (one name per line, in sorted folder order)")
    classnames, _ = prompt_classes(name, None, str(root), by_count=len(folders))
    if all(f.isdigit() for f in folders):
        ids = sorted(int(f) for f in folders)
        first = ids[0]
        if ids != list(range(first, first + len(ids))) or first not in (0, 1):
            raise ClassNamesError(f"{root}: numbered class folders must run 0..{len(ids) - 1} or 1..{len(ids)}; add a "
                                  "classnames.txt (one name per line, in sorted folder order)")
        return classnames, {f: int(f) - first for f in folders}
    return classnames, {f: i for i, f in enumerate(folders)}


def load_folder(name: str, root: Path, need_train: bool = True) -> LabelledSet:
    """``root/<split>/<class>/<image>`` with splits train (optional) and test (ImageNet: by wnid, :mod:`.imagenet`);
    the split folders are :data:`SPLIT_DIRS`, and the train split is read only when a task needs it."""
    if canonical(name) == "imagenet":
        return load_imagenet(name, root, need_train)
    dirs = {s: split_dir(root, s) for s in SPLIT_DIRS}
    if dirs["test"] is None:
        raise FileNotFoundError(f"no test split folder ({' / '.join(SPLIT_DIRS['test'])}) under {root}")
    if not need_train:
        dirs["train"] = None
    folders = sorted({p.name for d in dirs.values() if d for p in d.iterdir() if p.is_dir()})
    if not folders:
        raise EvalDataError(f"{dirs['test']}: no class folders")
    classnames, label_of = folder_classes(name, root, folders)
    splits: dict[str, FileSplit | None] = {}
    for s, d in dirs.items():
        paths, labels = [], []
        for f in sorted(p.name for p in d.iterdir() if p.is_dir()) if d else []:
            for img in images_under(d / f):
                paths.append(str(img))
                labels.append(label_of[f])
        splits[s] = FileSplit(paths, labels) if paths else None
    if splits["test"] is None:
        raise EvalDataError(f"{dirs['test']}: no images ({', '.join(IMAGE_SUFFIXES)})")
    train_missing = None
    if need_train and splits["train"] is None:
        train_missing = f"no train split ({' / '.join(SPLIT_DIRS['train'])} with images) under {root}"
    tpl = root / "zeroshot_classification_templates.txt"
    templates = templates_from_file(tpl) if tpl.exists() else prompt_templates(name)
    return LabelledSet(name=name, classnames=classnames, templates=templates, test=splits["test"],
                       train=splits["train"], train_missing=train_missing,
                       source=f"folder:{root}:{len(splits['test'])}")
