"""Imports sit at the top of a module; one inside a function says why on its line.

An import inside a function hides the import graph, so it is allowed only with a reason, one of:

* ``# heavy: <package>, <when it is needed>``: the package costs start-up time that the module's light importers
  (the config loader, the DAG, the CLI's parsing, a stage that does not need it) must not pay;
* ``# cycle: <module> imports this module``: at the top it would close an import circle;
* ``# optional: <package>, <its extra or when it is needed>``: a package that may be absent; only the code that
  uses it needs it;
* ``# order: <what must happen first>``: the import reads state that the lines above it set.

The rule is read from the source (ast for the imports, the line's text for the comment), so it holds for every
module of src/protoclip from now on.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src" / "protoclip"
REASONS = ("# heavy: ", "# cycle: ", "# optional: ", "# order: ")
# Modules whose local imports are not yet moved or annotated (none now). Add a name only while its module is being
# swept; the test then holds it to the rule too once removed.
NOT_YET_SWEPT: set[str] = set()


def local_imports(path: Path) -> list[tuple[int, str]]:
    """(line, text of the import's last line) of every import inside a function of ``path``."""
    text = path.read_text()
    lines = text.splitlines()
    found = []
    for fn in ast.walk(ast.parse(text, str(path))):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    found.append((node.lineno, lines[node.end_lineno - 1]))
    return sorted(set(found))


def unexplained(path: Path, root: Path = REPO) -> list[str]:
    """The local imports of ``path`` whose line has no comment starting with one of :data:`REASONS`."""
    out = []
    for lineno, line in local_imports(path):
        comment = line[line.find("#"):] if "#" in line else ""
        if not comment.startswith(REASONS):
            out.append(f"{path.relative_to(root)}:{lineno}: {line.strip()}")
    return out


def test_every_local_import_says_why():
    missing = [line for path in sorted(SRC.rglob("*.py"))
               if str(path.relative_to(SRC)) not in NOT_YET_SWEPT for line in unexplained(path)]
    assert not missing, ("imports inside functions without a reason comment (move them to the top, or say "
                         f"{' / '.join(r.strip() for r in REASONS)} on the line):\n" + "\n".join(missing))


def test_the_not_yet_swept_list_names_only_modules_that_need_it():
    """A module swept since leaves the list, so that the rule holds it from then on."""
    clean = sorted(name for name in NOT_YET_SWEPT if not unexplained(SRC / name))
    assert not clean, f"swept now, remove from NOT_YET_SWEPT: {clean}"


def test_the_rule_sees_a_bare_local_import(tmp_path):
    """The check is not vacuous: a bare local import is reported, an explained one and a top one are not."""
    module = tmp_path / "m.py"
    module.write_text("import os\n\n\ndef f():\n    import json\n    from math import (\n        pi)\n"
                      "    import torch  # heavy: torch, only when f runs\n"
                      "    import numpy  # here, because\n    return os, json, pi, torch, numpy\n")
    found = [line.split(": ", 1)[1] for line in unexplained(module, tmp_path)]
    assert found == ["import json", "pi)", "import numpy  # here, because"]


def test_the_light_paths_import_no_heavy_package():
    """The config loader (Snakemake imports it at every DAG build), the DAG's stage table and the CLI's parser
    import none of the packages the local imports keep out."""
    heavy = ("torch", "torchvision", "open_clip", "transformers", "sklearn", "scipy", "matplotlib", "mlflow",
             "faiss", "ot", "av", "snakemake", "dvc")
    for module, more in (("protoclip.project", ("pandas", "PIL")), ("protoclip.cli", ("pandas", "PIL", "numpy")),
                         ("protoclip.dag.stages", ()), ("protoclip.tasks", ())):
        code = (f"import sys, {module}; "
                f"print(sorted(m for m in {heavy + more!r} if m in sys.modules))")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"})
        assert out.stdout.strip() == "[]", f"import {module} imports {out.stdout.strip()}"
