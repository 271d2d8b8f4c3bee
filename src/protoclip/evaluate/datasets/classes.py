"""The prompt class names of a set, in the label order of its data, checked against the data's own names.

Zero-shot scores image ``i`` against ``classnames[label]``: a list in another order would score images against other
classes' names without a word, a number that looks plausible and is wrong (:func:`prompt_classes` says how).
"""
from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

from protoclip.evaluate.datasets.sets import EvalDataError, norm, read_lines
from protoclip.evaluate.prompts import has_prompts, load_prompts

log = logging.getLogger(__name__)


class ClassNamesError(EvalDataError):
    """The data's class names do not match the prompt class names (one line naming the file)."""


def prompt_templates(name: str) -> list[str]:
    return load_prompts(name).templates if has_prompts(name) else []


def templates_from_file(path: Path) -> list[str]:
    """CLIP_benchmark's ``zeroshot_classification_templates.txt`` (``{c}`` placeholders; ours are ``{}``)."""
    return [t.replace("{c}", "{}") for t in read_lines(path)]


def reorder(name: str, known: list[str], data_names: list[str], source: str) -> list[str]:
    """``known`` (prompt spellings) in the order of ``data_names`` (the data's label order); raises
    :class:`ClassNamesError` unless both name the same classes."""
    by_key = {norm(c): c for c in known}
    if [norm(c) for c in known] == [norm(d) for d in data_names]:
        return list(known)
    if len(by_key) == len(known) and Counter(map(norm, known)) == Counter(map(norm, data_names)):
        log.info("%s: the prompt class names follow the data's label order (%s), not the prompts file's",
                 name, source)
        return [by_key[norm(d)] for d in data_names]
    unknown = [d for d in data_names if norm(d) not in by_key]
    absent = [c for c in known if norm(c) not in {norm(d) for d in data_names}]
    example = (f"the data's '{unknown[0]}' is not a prompt class name" if unknown else
               f"the prompt class '{absent[0]}' is not in the data" if absent else "names repeat")
    raise ClassNamesError(f"{source}: the {len(data_names)} class names of {name} do not match its "
                          f"{len(known)} prompt class names ({example}); refusing to score images against "
                          "other classes' names: check that the path holds this data set")


def prompt_classes(name: str, data_names: list[str] | None, source: str, *, by_count: int | None = None,
                   pretty: bool = True) -> tuple[list[str], list[str]]:
    """(class names in the data's label order, templates) of set ``name``.

    The prompts JSON (``protoclip.evaluate.prompts``) holds CLIP's lists in label order (Oxford-IIIT Pets'
    reordered: CLIP sorted the breeds case-sensitively, cats first, while the data's ids follow the official,
    case-insensitive order). It is compared with ``data_names``, the class names the data itself carries, in label
    order (torchvision's ``classes``, the folder names, ``classnames.txt``, ImageNet's wnids):

    * the same names (up to case and punctuation, :func:`~.sets.norm`) in the same order: the JSON's spellings;
    * the same names in another order (a copy relabelled by its own class list, e.g. CLIP_benchmark shards with a
      ``classnames.txt``): the JSON's names put in the data's order (:func:`reorder`);
    * anything else: :class:`ClassNamesError`, one line naming ``source``, the file the data's names came from.

    ``data_names`` is None for sets whose data carries no names (Flowers102's and GTSRB's labels are bare ids,
    Country211's folders ISO codes whose order CLIP's list follows): give ``by_count``, their number of classes,
    checked against the prompts'. A set without prompts keeps the data's names (``_`` as spaces when ``pretty``)
    and has no templates (no zero-shot)."""
    if not has_prompts(name):
        if data_names is None:
            raise ClassNamesError(f"{source}: {name} has no class names in the data and no prompts; add a "
                                  "classnames.txt (one name per line, in label order)")
        return [d.replace("_", " ") if pretty else d for d in data_names], []
    prompts = load_prompts(name)
    if data_names is None:
        if by_count != len(prompts.classnames):
            raise ClassNamesError(f"{source}: {name} has {by_count} classes, its prompts "
                                  f"{len(prompts.classnames)}; refusing to score images against other classes' "
                                  "names: check that the path holds this data set")
        return list(prompts.classnames), list(prompts.templates)
    return reorder(name, prompts.classnames, data_names, source), list(prompts.templates)
