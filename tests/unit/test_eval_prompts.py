"""Zero-shot prompts package data: every paper set present with the right class count, the CLOOB fix."""
from __future__ import annotations

import pytest

from protoclip.evaluate.prompts import available, load_prompts
from protoclip.evaluate.prompts.build_prompts import apply_fixes, parse_clip_prompts

# ProtoCLIP Table II (class counts of the 14 zero-shot sets) + the two offline sets
TABLE_II = {"imagenet": 1000, "dtd": 47, "food101": 101, "oxford_pets": 37, "rendered_sst2": 2, "birdsnap": 500,
            "country211": 211, "flowers102": 102, "gtsrb": 43, "ucf101": 101, "stanford_cars": 196,
            "cifar10": 10, "cifar100": 100, "stl10": 10, "fashion_mnist": 10, "digits": 10}


@pytest.mark.parametrize("name,n", sorted(TABLE_II.items()))
def test_class_counts_and_templates(name, n):
    p = load_prompts(name)
    assert len(p.classnames) == n
    assert len(set(p.classnames)) >= n - 2  # CLIP's ImageNet names repeat 'missile' and 'sunglasses'
    assert p.templates and all(t.count("{}") == 1 for t in p.templates)


def test_all_sets_present():
    assert set(TABLE_II) <= set(available())


def test_kite_fix_and_known_entries():
    imagenet = load_prompts("imagenet")
    assert imagenet.classnames[21] == "kite (bird of prey)" and "kite" not in imagenet.classnames
    assert any(f["to"] == "kite (bird of prey)" for f in imagenet.fixes)
    assert len(imagenet.templates) == 80 and imagenet.templates[0] == "a bad photo of a {}."
    assert load_prompts("cifar10").classnames[:2] == ["airplane", "automobile"]
    assert load_prompts("rendered_sst2").templates == ["a {} review of a movie."]
    assert load_prompts("digits").templates == ['a photo of the number: "{}".']
    assert load_prompts("pets").classnames == load_prompts("oxford_pets").classnames  # alias


def test_unknown_set_raises():
    with pytest.raises(KeyError, match="no zero-shot prompts"):
        load_prompts("nope")


def test_parse_clip_prompts_and_fixes():
    md = ("# title\n\n## Toy\n\n```bash\nclasses = [\n    'a',\n    'kite',\n]\n\ntemplates = [\n"
          "    'a photo of a {}.',\n]\n```\n\n## NoLists\ntext\n")
    parsed = parse_clip_prompts(md)
    assert parsed == {"Toy": {"classnames": ["a", "kite"], "templates": ["a photo of a {}."]}}
    from protoclip.evaluate.prompts import build_prompts

    build_prompts.FIXES["toy"] = [(1, "kite", "kite (bird of prey)")]
    try:
        names, rec = apply_fixes("toy", parsed["Toy"]["classnames"])
        assert names == ["a", "kite (bird of prey)"] and rec[0]["status"] == "applied"
        with pytest.raises(ValueError, match="expected"):
            apply_fixes("toy", ["a", "b"])
    finally:
        del build_prompts.FIXES["toy"]


def test_class_lists_are_in_the_label_order_of_clip_benchmarks():
    """CLIP_benchmark's class lists are in the data's label order: ours name the same classes in the same order."""
    import json
    import re
    from pathlib import Path

    from clip_benchmark.datasets import builder

    theirs = json.loads(Path(builder.__file__).with_name("en_classnames.json").read_text())
    norm = lambda names: [re.sub(r"[^a-z0-9]", "", n.lower()) for n in names]
    for ours, key in (("imagenet", "imagenet1k"), ("oxford_pets", "pets"), ("flowers102", "flowers"),
                      ("gtsrb", "gtsrb"), ("country211", "country211")):
        assert norm(load_prompts(ours).classnames) == norm(theirs[key]), ours
    pets = load_prompts("oxford_pets").classnames
    assert pets[:3] == ["Abyssinian", "american bulldog", "american pit bull terrier"]  # CLIP's spellings


def test_reorder_puts_prompt_names_in_the_data_order_or_refuses():
    from protoclip.errors import UserError
    from protoclip.evaluate.datasets.classes import reorder

    known = ["Bengal", "american bulldog", "Abyssinian"]  # spellings of the prompts, another order
    assert reorder("pets", known, ["abyssinian", "American_Bulldog", "BENGAL"], "x.txt") == [
        "Abyssinian", "american bulldog", "Bengal"]
    assert reorder("pets", known, ["Bengal", "american-bulldog", "Abyssinian"], "x.txt") == known
    with pytest.raises(UserError, match="^x.txt: the 3 class names of pets do not match its 3 prompt class names "
                                        r"\(the data's 'Sphynx' is not a prompt class name\)"):
        reorder("pets", known, ["Abyssinian", "Bengal", "Sphynx"], "x.txt")
    with pytest.raises(UserError, match="names repeat"):
        reorder("pets", known, ["Abyssinian", "Abyssinian", "Bengal", "american bulldog"], "x.txt")
