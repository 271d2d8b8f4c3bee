"""Build ``zeroshot_prompts.json``: class names and prompt templates of every zero-shot evaluation set.

The JSON is package data and is committed; this script documents (and re-does) how it was made from CLIP's
prompt file and open_clip's ImageNet metadata (the sources: :func:`build`):

    python -m protoclip.evaluate.prompts.build_prompts --reference <CLIP's clip-prompts.md> --out <the JSON>
"""
from __future__ import annotations

import argparse
import ast
import json
import re
from pathlib import Path

from protoclip.errors import MissingExtraError, import_extra
from protoclip.files.atomic import write_text

# our key -> section title in clip-prompts.md; expected number of classes (ProtoCLIP Table II)
CLIP_SECTIONS: dict[str, tuple[str, int]] = {
    "dtd": ("DescribableTextures", 47),
    "food101": ("Food101", 101),
    "oxford_pets": ("OxfordPets", 37),
    "rendered_sst2": ("SST2", 2),
    "birdsnap": ("Birdsnap", 500),
    "country211": ("Country211", 211),
    "flowers102": ("Flowers102", 102),
    "gtsrb": ("GTSRB", 43),
    "ucf101": ("UCF101", 101),
    "stanford_cars": ("StanfordCars", 196),
    "cifar10": ("CIFAR10", 10),
    "cifar100": ("CIFAR100", 100),
    "stl10": ("STL10", 10),
}

# CLOOB-style disambiguations (ProtoCLIP Sec. IV-C1): dataset -> [(class index, CLIP notebook name, fixed name)].
# open_clip's IMAGENET_CLASSNAMES already carries them; build() applies them when the source still has the
# ambiguous name and fails if the index holds something else (a reordered source list).
FIXES: dict[str, list[tuple[int, str, str]]] = {
    "imagenet": [
        (21, "kite", "kite (bird of prey)"),  # the bird (n01608432), not the toy; the paper's example
    ],
}

# Sets whose CLIP list is not in the label order of the data: the order is taken from CLIP_benchmark's
# en_classnames.json (label order; its key here), CLIP's spellings kept. Oxford-IIIT Pets: CLIP sorted the breeds
# case-sensitively (the capitalised cat breeds first), while the data's ids (annotations/list.txt, torchvision's
# labels) follow the case-insensitive order; scored in CLIP's order, 33 of the 37 breeds get another's name.
LABEL_ORDER: dict[str, str] = {"oxford_pets": "pets"}

FASHION_MNIST_CLASSES = ["T-shirt/top", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker",
                         "bag", "ankle boot"]  # label order 0..9 of the idx files
# A subset of CLIP's generic photo templates (those of its CIFAR entry) that suits small grey product shots.
FASHION_MNIST_TEMPLATES = [
    "a photo of a {}.",
    "a black and white photo of a {}.",
    "a low resolution photo of a {}.",
    "a blurry photo of a {}.",
    "a photo of the {}.",
    "a photo of a {}, a type of clothing.",
]
DIGITS_CLASSES = [str(i) for i in range(10)]  # CLIP's MNIST entry
DIGITS_TEMPLATES = ['a photo of the number: "{}".']


def parse_clip_prompts(text: str) -> dict[str, dict[str, list[str]]]:
    """``## Title`` sections of clip-prompts.md -> {title: {"classnames": [...], "templates": [...]}}."""
    out: dict[str, dict[str, list[str]]] = {}
    for block in re.split(r"^## ", text, flags=re.M)[1:]:
        title, _, body = block.partition("\n")
        lists = dict(re.findall(r"^(classes|templates) = (\[.*?^\])", body, flags=re.M | re.S))
        if "classes" not in lists or "templates" not in lists:
            continue
        classes = ast.literal_eval(lists["classes"])
        # FER2013 lists several names per class; keep the first (it is not one of the paper's 14 sets)
        classes = [c[0] if isinstance(c, list) else c for c in classes]
        out[title.strip()] = {"classnames": classes, "templates": ast.literal_eval(lists["templates"])}
    return out


def imagenet_entry() -> dict[str, list[str]]:
    from clip_benchmark.datasets.builder import all_imagenet_wordnet_ids  # optional: clip_benchmark, the prompts extra
    from open_clip.zero_shot_metadata import (IMAGENET_CLASSNAMES,
                                              OPENAI_IMAGENET_TEMPLATES)  # heavy: open_clip, only for ImageNet

    templates = [t("{}") for t in OPENAI_IMAGENET_TEMPLATES]  # the lambdas, rendered with a placeholder
    wnids = list(all_imagenet_wordnet_ids)  # label order: the sorted WordNet ids (torchvision's ImageNet targets)
    if wnids != sorted(wnids) or len(wnids) != len(IMAGENET_CLASSNAMES):
        raise ValueError("CLIP_benchmark's ImageNet wnids are not the 1000 sorted ids of the class names")
    return {"classnames": list(IMAGENET_CLASSNAMES), "templates": templates, "wnids": wnids}


def apply_fixes(name: str, classnames: list[str]) -> tuple[list[str], list[dict]]:
    """Apply :data:`FIXES` for ``name``; returns the names and a record of each fix."""
    classnames = list(classnames)
    record = []
    for index, before, after in FIXES.get(name, []):
        if classnames[index] == before:
            classnames[index] = after
            record.append({"index": index, "from": before, "to": after, "status": "applied"})
        elif classnames[index] == after:
            record.append({"index": index, "from": before, "to": after, "status": "already in source"})
        else:
            raise ValueError(f"{name}[{index}] is {classnames[index]!r}, expected {before!r} or {after!r}")
    return classnames, record


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def label_order(key: str, names: list[str]) -> list[str]:
    """``names`` (CLIP's spellings) in the label order of CLIP_benchmark's list for ``key``; fails unless both
    name the same classes."""
    from clip_benchmark.datasets import builder  # optional: clip_benchmark, the prompts extra

    order = json.loads(Path(builder.__file__).with_name("en_classnames.json").read_text())[LABEL_ORDER[key]]
    by_key = {_norm(n): n for n in names}
    if sorted(by_key) != sorted(map(_norm, order)) or len(by_key) != len(names):
        raise ValueError(f"{key}: CLIP_benchmark's '{LABEL_ORDER[key]}' list names other classes than CLIP's")
    return [by_key[_norm(n)] for n in order]


def build(reference: Path) -> dict:
    """Every set's entry of the JSON; templates are strings with one ``{}`` for the class name. Sources (ProtoCLIP
    Sec. IV-C1: "class names and prompt templates are consistent with CLIP [...] minor explanations to some
    classes, e.g. 'kite' -> 'kite (bird of prey)', are added following CLOOB"):

    * ImageNet: ``open_clip.zero_shot_metadata`` (``IMAGENET_CLASSNAMES``, ``OPENAI_IMAGENET_TEMPLATES``, the 80
      templates of CLIP's ImageNet notebook), and the WordNet ids of the classes in label order (``wnids``, from
      CLIP_benchmark's ``all_imagenet_wordnet_ids``): what the data on disk names its classes by. open_clip's class
      names are the CLIP notebook names with the CLOOB-era disambiguations already in (``kite (bird of prey)``,
      ``crane bird`` / ``construction crane``, ...), which is what the ProtoCLIP code (megvii-research/protoclip,
      ``zero_shot.py``) uses too. The disambiguations the paper names are listed in :data:`FIXES` and asserted /
      applied here, so the JSON carries them even if open_clip's list changes.
    * The other 13 of the paper's 14 sets: CLIP's ``Prompts for Image Classification`` (``reference``,
      clip-prompts.md), parsed verbatim (python list literals inside each ``## <Dataset>`` section); Oxford-IIIT
      Pets' list put in the data's label order (:data:`LABEL_ORDER`).
    * Offline sets (not in the paper): ``fashion_mnist`` (Fashion-MNIST class names in prompt-friendly form,
      CLIP-style generic photo templates) and ``digits`` (sklearn's 8x8 digits: CLIP's MNIST entry, class names
      '0'..'9' with the template ``a photo of the number: "{}".``)."""
    parsed = parse_clip_prompts(reference.read_text())
    entries: dict[str, dict] = {}
    raw = {"imagenet": imagenet_entry()}
    for key, (title, _) in CLIP_SECTIONS.items():
        if title not in parsed:
            raise ValueError(f"{reference}: no '## {title}' section with classes and templates")
        raw[key] = parsed[title]
    expected = {"imagenet": 1000, **{k: n for k, (_, n) in CLIP_SECTIONS.items()}}
    for key, entry in raw.items():
        names, fixes = apply_fixes(key, entry["classnames"])
        if key in LABEL_ORDER:
            names = label_order(key, names)
        if len(names) != expected[key]:
            raise ValueError(f"{key}: {len(names)} classes, expected {expected[key]} (ProtoCLIP Table II)")
        entries[key] = {"classnames": names, "templates": list(entry["templates"]), "fixes": fixes,
                        **({"wnids": entry["wnids"]} if "wnids" in entry else {}),
                        "source": "open_clip.zero_shot_metadata" if key == "imagenet" else
                        f"CLIP clip-prompts.md '## {CLIP_SECTIONS[key][0]}'"
                        + (f", in the label order of CLIP_benchmark's '{LABEL_ORDER[key]}' list" if key in LABEL_ORDER
                           else "")}
    entries["fashion_mnist"] = {"classnames": FASHION_MNIST_CLASSES, "templates": FASHION_MNIST_TEMPLATES,
                                "fixes": [], "source": "Fashion-MNIST labels; CLIP-style templates"}
    entries["digits"] = {"classnames": DIGITS_CLASSES, "templates": DIGITS_TEMPLATES, "fixes": [],
                         "source": "CLIP clip-prompts.md '## MNIST'"}
    for key, entry in entries.items():
        bad = [t for t in entry["templates"] if t.count("{}") != 1]
        if bad:
            raise ValueError(f"{key}: templates without exactly one '{{}}': {bad}")
    return entries


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reference", type=Path, default=Path("/work/shared/reference/clip-prompts.md"))
    p.add_argument("--out", type=Path, default=Path(__file__).with_name("zeroshot_prompts.json"))
    args = p.parse_args(argv)

    try:  # CLIP_benchmark (with pycocotools and pycocoevalcap) is the 'prompts' extra, only this script needs it
        import_extra("clip_benchmark", "prompts", "build_prompts")
    except MissingExtraError as err:
        raise SystemExit(f"{err.kind}: {err}") from None

    entries = build(args.reference)
    write_text(args.out, json.dumps(entries, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {args.out}: " + ", ".join(f"{k} ({len(v['classnames'])})" for k, v in entries.items()))


if __name__ == "__main__":
    main()
