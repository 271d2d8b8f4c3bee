"""Every third-party package imported under src/ is declared in pyproject.toml: a base dependency when imported at a
module's top (any command loads it), else the base or the pip extra of the command that imports it (inside a function,
or through ``protoclip.errors.import_extra``, which names the extra when the package is missing). Import names map to
distributions with ``importlib.metadata.packages_distributions()`` (the environment's own record), the standard
library is ``sys.stdlib_module_names``. And ``requires-python`` admits no Python that a pin's wheel refuses."""
from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib import metadata

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from testkit import REPO

FIRST_PARTY = {"protoclip"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503


def declared_groups() -> dict[str, set[str]]:
    """distribution (normalised) -> the groups that declare it: "base" and/or extra names."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    groups: dict[str, set[str]] = {}
    for group, reqs in [("base", project["dependencies"]), *project["optional-dependencies"].items()]:
        for req in reqs:
            groups.setdefault(_norm(Requirement(req).name), set()).add(group)
    return groups


def imports_of(source: str) -> list[tuple[str, str]]:
    """(top-level module, where) of one file's absolute imports; where = "top" (module level), "lazy" (inside a
    function) or "extra:<name>" (an ``import_extra("module", "<name>", ...)`` call)."""
    tree = ast.parse(source)
    lazy = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            for n in ast.walk(f)}
    found = []
    for node in ast.walk(tree):
        where = "lazy" if id(node) in lazy else "top"
        if isinstance(node, ast.Import):
            found += [(a.name.split(".")[0], where) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module.split(".")[0], where))
        elif (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "import_extra"
              and len(node.args) >= 2 and all(isinstance(a, ast.Constant) for a in node.args[:2])):
            found.append((node.args[0].value.split(".")[0], f"extra:{node.args[1].value}"))
    return [(m, w) for m, w in found if m not in sys.stdlib_module_names and m not in FIRST_PARTY]


def problems(sources: dict[str, str], declared: dict[str, set[str]], dists: dict[str, list[str]]) -> list[str]:
    """One line per import that the declarations do not cover (see the module doc)."""
    out = []
    for path, source in sources.items():
        for module, where in imports_of(source):
            names = [_norm(d) for d in dists.get(module, [])]
            if not names:
                out.append(f"{path}: {module}: no installed distribution provides it")
                continue
            groups = set().union(*(declared.get(n, set()) for n in names))
            if not groups:
                out.append(f"{path}: {module} ({', '.join(names)}) is not declared")
            elif where == "top" and "base" not in groups:
                out.append(f"{path}: {module} is imported at module level but only in extras {sorted(groups)}")
            elif where.startswith("extra:") and where[6:] not in groups:
                out.append(f"{path}: import_extra names extra {where[6:]!r} for {module}, declared in {sorted(groups)}")
    return out


def test_every_import_under_src_is_declared():
    sources = {str(p.relative_to(REPO)): p.read_text() for p in sorted((REPO / "src").rglob("*.py"))}
    assert problems(sources, declared_groups(), metadata.packages_distributions()) == []


def test_the_check_flags_what_it_must():
    """The checker itself, on made-up sources: an undeclared package, an extra's package imported at module level,
    an import_extra naming the wrong extra; a lazy import of an extra's package and the standard library pass."""
    declared = {"numpy": {"base"}, "av": {"ucf101"}}
    dists = {"numpy": ["numpy"], "av": ["av"], "requests": ["requests"]}
    sources = {"a.py": "import os, json\nimport numpy as np\nfrom requests import get\nimport av\n",
               "b.py": "def f():\n    import av\n    import_extra('av', 'prompts', 'x')\n    from protoclip import cli\n",
               "c.py": "import notinstalled\n"}
    assert problems(sources, declared, dists) == [
        "a.py: requests (requests) is not declared",
        "a.py: av is imported at module level but only in extras ['ucf101']",
        "b.py: import_extra names extra 'prompts' for av, declared in ['ucf101']",
        "c.py: notinstalled: no installed distribution provides it",
    ]


def test_heavy_single_use_packages_are_extras_and_faiss_is_one_of_two():
    declared = declared_groups()
    assert declared["av"] == {"ucf101"}
    assert {"clip-benchmark", "pycocoevalcap", "pycocotools"} <= {d for d, g in declared.items() if g == {"prompts"}}
    assert declared["faiss-cpu"] == {"cpu"} and declared["faiss-gpu-cu12"] == {"gpu"}  # never in one environment
    gpu = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    assert all("==" in r for r in gpu)  # pinned


@pytest.mark.parametrize("group", ["base", "cpu", "ucf101", "prompts"])
def test_requires_python_admits_only_pythons_every_pin_installs_on(group):
    """The oldest Python ``requires-python`` admits (3.11 for ">=3.11") is one every pinned distribution of the group
    accepts (its installed metadata's Requires-Python), where this environment holds the pinned version."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    ours = SpecifierSet(project["requires-python"])
    oldest = next(f"3.{m}" for m in range(6, 20) if f"3.{m}.0" in ours)
    reqs = project["dependencies"] if group == "base" else project["optional-dependencies"][group]
    refused, checked = [], 0
    for req in map(Requirement, reqs):
        pin = next(iter(req.specifier)).version
        try:
            meta = metadata.metadata(req.name)
        except metadata.PackageNotFoundError:
            continue
        if meta["Version"] != pin:
            continue
        checked += 1
        if meta.get("Requires-Python") and f"{oldest}.0" not in SpecifierSet(meta["Requires-Python"]):
            refused.append(f"{req.name}=={pin} requires Python {meta['Requires-Python']}")
    assert checked and refused == []
    assert sys.version_info[:2] >= tuple(map(int, oldest.split(".")))  # this environment is one it admits


def test_setuptools_floor_reads_the_license_string():
    """``license = "MIT"`` (an SPDX expression, PEP 639) needs setuptools >= 77 at build time."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert isinstance(pyproject["project"]["license"], str)
    floor = next(Requirement(r) for r in pyproject["build-system"]["requires"] if r.startswith("setuptools"))
    assert "76.9" not in floor.specifier and "77.0" in floor.specifier

