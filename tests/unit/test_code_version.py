"""Code fingerprints (protoclip.dag.code_version): a comment or docstring edit changes none, a code edit changes
the fingerprints of the commands that import the edited module and no other; the committed code-fingerprints.yaml
is the package's."""
from __future__ import annotations

import shutil

from protoclip.cli import COMMANDS
from protoclip.dag import code_version
from protoclip.dag.code_version import FINGERPRINTS, STAGE_MODULES, fingerprints, fingerprints_text, source_digest
from protoclip.dag.stages import stages
from protoclip.project import load_config
from testkit import REPO

MODULE = '''"""A module."""
import math


def area(r):
    """The area of a disc."""
    return math.pi * r ** 2  # pi r squared
'''


def test_comments_docstrings_and_layout_change_no_digest_code_does(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(MODULE)
    before = source_digest(path)
    path.write_text(MODULE.replace("# pi r squared", "# the disc's area").replace('"""A module."""', "# moved")
                    .replace("The area of a disc.", "Area.") + "\n\n# trailing comment\n")
    assert source_digest(path) == before
    path.write_text(MODULE.replace("** 2", "** 3"))
    assert source_digest(path) != before


def test_json_by_content(tmp_path):
    path = tmp_path / "prompts.json"
    path.write_text('{"a": [1, 2]}')
    before = source_digest(path)
    path.write_text('{\n  "a": [1,\n 2]\n}\n')
    assert source_digest(path) == before
    path.write_text('{"a": [1, 3]}')
    assert source_digest(path) != before


def package_copy(tmp_path):
    root = tmp_path / "protoclip"
    shutil.copytree(code_version.package_root(), root, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def changed(before: dict, after: dict) -> set[str]:
    return {k for k in before if before[k] != after[k]}


def test_an_edit_changes_the_commands_that_import_it(tmp_path):
    root = package_copy(tmp_path)
    before = fingerprints(root)
    figures = root / "report" / "figures.py"  # imported by `protoclip report` only
    toy = root / "toy" / "pauc_nemd.py"  # by `protoclip toy-nemd` only
    figures.write_text(figures.read_text() + "\n# a comment\n")
    assert fingerprints(root) == before
    figures.write_text(figures.read_text() + "EDITED = 1\n")
    assert changed(before, fingerprints(root)) == {"report"}
    toy.write_text(toy.read_text() + "EDITED = 1\n")
    assert changed(before, fingerprints(root)) == {"report", "toy-nemd"}
    # the CLI and the config loader run before every command: an edit there changes every fingerprint
    (root / "errors.py").write_text((root / "errors.py").read_text() + "EDITED = 1\n")
    assert changed(before, fingerprints(root)) == set(STAGE_MODULES)


def test_a_dynamically_imported_module_counts(tmp_path):
    """The evaluation tasks' adapters are imported by name ("module:function" strings, protoclip.tasks)."""
    root = package_copy(tmp_path)
    before = fingerprints(root)
    zeroshot = root / "evaluate" / "metrics" / "zeroshot.py"
    zeroshot.write_text(zeroshot.read_text() + "EDITED = 1\n")
    assert "evaluate" in changed(before, fingerprints(root))


def test_every_stage_command_has_a_fingerprint_and_its_module():
    cfg = load_config(str(REPO / "config" / "config.yaml"))
    assert {s.command for s in stages(cfg, "config/config.yaml")} <= set(STAGE_MODULES)
    assert all(COMMANDS[c].module == m for c, m in STAGE_MODULES.items())


def test_committed_fingerprints_are_the_code_s():
    assert (REPO / FINGERPRINTS).read_text() == fingerprints_text(fingerprints()), \
        f"{FINGERPRINTS} is stale: run `protoclip dvc-yaml` (or any snakemake call) and commit it"


def test_the_cache_gives_the_same_fingerprints_and_parses_only_changed_files(tmp_path, monkeypatch):
    root, cache = package_copy(tmp_path), tmp_path / "state" / "code-digests.json"
    uncached = fingerprints(root)
    assert fingerprints(root, cache) == uncached and cache.is_file()
    parsed = []
    real_parse = code_version.parse
    monkeypatch.setattr(code_version, "parse", lambda path: parsed.append(path.name) or real_parse(path))
    assert fingerprints(root, cache) == uncached and parsed == []  # every file known by its bytes
    figures = root / "report" / "figures.py"
    figures.write_text(figures.read_text() + "EDITED = 1\n")
    edited = fingerprints(root, cache)
    assert parsed == ["figures.py"] and changed(uncached, edited) == {"report"}
    monkeypatch.setattr(code_version, "parse", real_parse)
    assert edited == fingerprints(root)  # what the cache gave is what parsing every file gives
    cache.write_text("{not json")  # a broken cache is recomputed, not trusted
    assert fingerprints(root, cache) == edited
