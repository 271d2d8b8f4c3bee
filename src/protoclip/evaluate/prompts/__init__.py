"""Class names and prompt templates of the zero-shot evaluation sets: package data (``zeroshot_prompts.json``, one
:class:`Prompts` per set), built by ``build_prompts.py`` from CLIP's prompt file and open_clip's ImageNet metadata,
and committed.

    p = load_prompts("cifar10")   # Prompts(classnames=['airplane', ...], templates=['a photo of a {}.', ...])
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources

# other spellings of the set names -> the key in the JSON
ALIASES = {
    "pets": "oxford_pets", "oxfordiiitpet": "oxford_pets", "oxford_iiit_pet": "oxford_pets",
    "sst2": "rendered_sst2", "renderedsst2": "rendered_sst2", "cars": "stanford_cars",
    "stanfordcars": "stanford_cars", "describable_textures": "dtd", "flowers": "flowers102",
    "imagenet1k": "imagenet", "imagenet-1k": "imagenet", "stl-10": "stl10", "fashion-mnist": "fashion_mnist",
    "fashionmnist": "fashion_mnist", "food-101": "food101",
}


@dataclass(frozen=True)
class Prompts:
    """One set's entry of ``zeroshot_prompts.json``: ``classnames`` (CLIP's lists, in the data's label order:
    Oxford-IIIT Pets' reordered, ``build_prompts.LABEL_ORDER``; the loaders check the order against the data's own
    class names, ``evaluate.datasets.classes``), ``templates`` (strings with one ``{}``), the CLOOB-style name
    ``fixes`` and, for ImageNet, the ``wnids`` of the classes. The JSON also records each entry's ``source``."""
    classnames: list[str]
    templates: list[str]
    fixes: list[dict] = field(default_factory=list)
    wnids: list[str] = field(default_factory=list)  # ImageNet: the WordNet id of each class, in label order


@lru_cache(maxsize=1)
def _all() -> dict:
    return json.loads(resources.files(__name__).joinpath("zeroshot_prompts.json").read_text(encoding="utf-8"))


def available() -> list[str]:
    """Names of the sets that have class names and templates."""
    return sorted(_all())


def canonical(name: str) -> str:
    key = name.lower()
    return ALIASES.get(key, key)


def has_prompts(name: str) -> bool:
    return canonical(name) in _all()


def load_prompts(name: str) -> Prompts:
    """Class names and templates of set ``name`` (aliases such as ``pets`` accepted)."""
    entry = _all().get(canonical(name))
    if entry is None:
        raise KeyError(f"no zero-shot prompts for data set {name!r} (known: {', '.join(available())})")
    return Prompts(list(entry["classnames"]), list(entry["templates"]), list(entry.get("fixes", [])),
                   list(entry.get("wnids", [])))
