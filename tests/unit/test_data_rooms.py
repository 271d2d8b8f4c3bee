"""data/ in two rooms: loading/ (training and evaluation time) never imports corpus/ (prepare time), not even inside
a function, so that reading the corpus never pulls in the code that builds it."""
from __future__ import annotations

import ast
from pathlib import Path

import protoclip.data.loading

LOADING = Path(protoclip.data.loading.__file__).parent


def imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.update([node.module, *(f"{node.module}.{a.name}" for a in node.names)])
    return names


def test_loading_never_imports_corpus():
    modules = sorted(LOADING.glob("*.py"))
    assert len(modules) > 5
    bad = {p.name: sorted(n for n in imported(p) if n.startswith("protoclip.data.corpus")) for p in modules}
    assert not {k: v for k, v in bad.items() if v}
