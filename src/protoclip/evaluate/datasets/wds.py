"""CLIP_benchmark's webdataset layout (``clip_benchmark_export_wds``, CLIP_benchmark 1.6.2's ``build_wds_dataset``)::

    root/{train,test}/nshards.txt, 0.tar, 1.tar, ...     samples: an image (webp / png / jpg) and .cls (or .txt)
    root/classnames.txt                                  label order (classification)
    root/zeroshot_classification_templates.txt           templates with {c} (read for sets without prompts)
    root/dataset_type.txt                                "retrieval" for caption sets (wds_mscoco_captions, ...)
"""
from __future__ import annotations

import tarfile
from pathlib import Path

from protoclip.evaluate.datasets.classes import prompt_templates, reorder, templates_from_file
from protoclip.evaluate.datasets.sets import CaptionSet, EvalDataError, LabelledSet, WdsSplit, read_lines, shard_error
from protoclip.evaluate.prompts import has_prompts, load_prompts


def shards(split_dir: Path) -> list[str]:
    """The shards of one split folder, in order; [] when the folder has none. ``nshards.txt`` says how many shards
    the split has (``0.tar`` .. ``N-1.tar``): a missing one is an error naming it, so a partial download is never
    scored as the whole set; without it every ``*.tar`` is read, in numeric order."""
    if not split_dir.is_dir():
        return []
    count = split_dir / "nshards.txt"
    if count.exists():
        text = count.read_text().strip()
        if not text.isdigit() or int(text) < 1:
            raise EvalDataError(f"{count}: not a shard count ({text[:20]!r})")
        out = [split_dir / f"{i}.tar" for i in range(int(text))]
        missing = [p for p in out if not p.is_file()]
        if missing:
            raise EvalDataError(f"{missing[0]}: missing ({len(missing)} of the {len(out)} shards that {count} "
                                "announces are absent); complete the download")
        return [str(p) for p in out]
    found = [p for p in split_dir.glob("*.tar") if p.is_file()]
    return [str(p) for p in sorted(found, key=lambda p: (not p.stem.isdigit(), int(p.stem) if p.stem.isdigit()
                                                         else 0, p.name))]


def dataset_type(root: Path) -> str:
    path = root / "dataset_type.txt"
    return path.read_text().strip().lower() if path.exists() else "classification"


def load_wds(name: str, root: Path, need_train: bool = True) -> LabelledSet | CaptionSet:
    """A classification export as a :class:`~.sets.LabelledSet` (its ``classnames.txt`` checked against the prompts
    file when the set has prompts, :mod:`.classes`), a retrieval export as a :class:`~.sets.CaptionSet`
    (:func:`load_wds_captions`). A set that has prompts takes CLIP's templates from the prompts file (the paper's
    protocol), not the export's. The train split is read only when a task needs it (``need_train``)."""
    test = shards(root / "test")
    if not test:
        raise FileNotFoundError(f"no test shards at {root / 'test'} (nshards.txt / *.tar)")
    kind = dataset_type(root)
    if kind == "retrieval":
        return load_wds_captions(name, test, root)
    if kind != "classification":
        raise EvalDataError(f"{root / 'dataset_type.txt'}: {kind!r} sets are not read (classification / retrieval)")
    names_file = root / "classnames.txt"
    if names_file.exists():
        data_names = read_lines(names_file)
        classnames = (reorder(name, load_prompts(name).classnames, data_names, str(names_file))
                      if has_prompts(name) else data_names)
    elif has_prompts(name):
        raise EvalDataError(f"{names_file}: missing; CLIP_benchmark's export writes it (the label order of the "
                            "shards' .cls ids)")
    else:
        raise EvalDataError(f"{names_file}: missing, and {name!r} has no prompts to name its classes")
    tpl = root / "zeroshot_classification_templates.txt"
    templates = prompt_templates(name) if has_prompts(name) else (templates_from_file(tpl) if tpl.exists() else [])
    train = shards(root / "train") if need_train else []
    return LabelledSet(name=name, classnames=classnames, templates=templates, test=WdsSplit(test),
                       train=WdsSplit(train) if train else None,
                       train_missing=None if train or not need_train else f"no train shards at {root / 'train'}",
                       source=f"wds:{root}:{len(train)}+{len(test)} shards")


def load_wds_captions(name: str, test: list[str], root: Path) -> CaptionSet:
    """A retrieval export: every test sample's image and the lines of its ``.txt`` (read here, one header pass)."""
    captions: list[list[str]] = []
    for shard in test:
        try:
            with tarfile.open(shard) as tf:
                for member in tf:
                    if member.isfile() and member.name.endswith(".txt"):
                        text = tf.extractfile(member).read().decode("utf-8")
                        captions.append([c.replace(r"\n", "\n").strip() for c in text.splitlines() if c.strip()])
        except (tarfile.TarError, OSError, EOFError, UnicodeDecodeError) as err:
            raise shard_error(shard, err) from None
    empty = [i for i, c in enumerate(captions) if not c]
    if not captions or empty:
        raise EvalDataError(f"{root}: {'no' if not captions else 'an empty'} .txt caption member in the test shards")
    return CaptionSet(name, WdsSplit(test, label="index"), captions, source=f"wds:{root}:{len(test)} shards")
