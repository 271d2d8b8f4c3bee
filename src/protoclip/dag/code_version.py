"""Code fingerprints: the one rule for "the code changed" that Snakemake and DVC both follow.

A command's fingerprint hashes the package modules it can import, each as its syntax tree without docstrings and
positions, so a comment, a docstring or a reflowed line reruns nothing. The Snakefile (a rule param, at every
invocation) and ``protoclip dvc-yaml`` write them to ``code-fingerprints.yaml``, a param file of every DVC stage;
the rule and why: docs/dvc.md, "When the code changes". What each file gives is cached by its bytes (``CACHE``).
"""
from __future__ import annotations

import ast
import hashlib
import json
from collections.abc import Iterable
from pathlib import Path

import yaml

import protoclip
from protoclip.files.atomic import write_text

FINGERPRINTS = "code-fingerprints.yaml"  # beside dvc.yaml: a DVC params file, one key per command
PACKAGE = "protoclip"
CLI = "protoclip.cli"
ENTRY = (CLI, "protoclip.project")  # what every `protoclip <command>` imports before its command's module
# the commands of the DAG's stages (protoclip.dag.stages) and their modules (protoclip.cli.COMMANDS; a test
# checks the two agree: the CLI imports jobs/ and torch-free code only, so this table is repeated, not imported)
STAGE_MODULES = {"prepare": "protoclip.data.stage", "teacher": "protoclip.teacher.stage",
                 "train": "protoclip.train.stage", "evaluate": "protoclip.evaluate.stage",
                 "collect": "protoclip.evaluate.collect", "report": "protoclip.report.stage",
                 "toy-nemd": "protoclip.toy.stage", "export": "protoclip.models.export_openclip"}
DIGITS = 16  # hex digits kept of each sha256 (64 bits: no accidental equality between two versions)
# per project folder (Snakemake's own state folder): each file's digest and imports, keyed by its bytes, so a
# Snakemake start (every job's, on a cluster) parses only the files that changed (~1 s of ~250 parses otherwise)
CACHE = Path(".snakemake") / "protoclip" / "code-digests.json"


def package_root() -> Path:
    """The folder of the ``protoclip`` package this process runs (the code the stage commands run)."""
    return Path(protoclip.__file__).parent


def package_modules(root: Path) -> dict[str, Path]:
    """{dotted module name: file} of every module of the package at ``root`` (a package by its __init__.py)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if "__pycache__" in parts:
            continue
        name = ".".join((PACKAGE, *parts[:-1]) if parts[-1] == "__init__" else (PACKAGE, *parts))
        out[name] = path
    return out


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and \
                    isinstance(first.value.value, str):
                node.body = node.body[1:] or [ast.Pass()]
    return tree


def parse(path: Path) -> ast.Module | None:
    """A module's syntax tree; None for one that does not parse (hashed by its text; its command fails anyway)."""
    try:
        return ast.parse(path.read_text(encoding="utf-8"), str(path))
    except SyntaxError:
        return None


def source_digest(path: Path, tree: ast.Module | None = None) -> str:
    """sha256 of a module's code without comments, docstrings and positions (``tree``: its parsed tree), or of a
    data file's content (JSON and YAML by their parsed content; the data files beside a package's modules, such as
    prompts JSON, model configs and the papers' numbers, count with those modules)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".py" and (tree := tree or parse(path)) is not None:
        canonical = ast.dump(_strip_docstrings(tree), include_attributes=False)
    elif path.suffix == ".json":
        canonical = json.dumps(json.loads(text), sort_keys=True)
    elif path.suffix in (".yaml", ".yml"):
        canonical = json.dumps(yaml.safe_load(text), sort_keys=True, default=str)
    else:
        canonical = text
    return hashlib.sha256(canonical.encode()).hexdigest()


def _with_parents(name: str) -> list[str]:
    """A module and its parent packages (importing ``a.b.c`` runs ``a/__init__``, ``a/b/__init__`` too)."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def import_candidates(name: str, path: Path, tree: ast.Module | None, strings: bool = True) -> tuple[set, set]:
    """(the names module ``name``'s import statements import, anywhere: module level or inside a function; the
    string constants naming a module of the package: ``"pkg.mod"`` or ``"pkg.mod:attr"``, the adapters' and the
    method registry's dynamic imports; none with ``strings=False``: the CLI names every command's module, and runs
    one). From the file alone (:func:`package_imports` keeps the package's modules)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    named: set[str] = set()
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package, level - 1 packages up
                anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import module`
        elif strings and isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                node.value.startswith(PACKAGE + "."):  # not "protoclip" itself (a logger's or program's name)
            named.add(node.value.partition(":")[0])
    return found, named


def package_imports(found: Iterable[str], named: Iterable[str], modules: dict[str, Path]) -> set[str]:
    """The package modules (and their parent packages) that a module may import, from its
    :func:`import_candidates`: more than a run imports, never less; a package named by a string: all of its
    modules (loaded by walking the package)."""
    found = set(found) | set(named)
    for target in named:
        if target in modules and modules[target].name == "__init__.py":
            found.update(m for m in modules if m.startswith(target + "."))
    return {parent for m in found if m in modules for parent in _with_parents(m)}


def closure(roots: list[str], modules: dict[str, Path], imports: dict[str, set[str]]) -> set[str]:
    """Every module reachable from ``roots`` through ``imports`` (module -> what it imports)."""
    seen: set[str] = set()
    todo = [p for r in roots for p in _with_parents(r)]
    while todo:
        m = todo.pop()
        if m in seen or m not in modules:
            continue
        seen.add(m)
        todo.extend(imports[m])
    return seen


def data_files(root: Path) -> dict[Path, list[Path]]:
    """{folder holding modules: the non-Python files under it that no deeper module folder holds}."""
    out: dict[Path, list[Path]] = {}
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.suffix in (".py", ".pyc") or "__pycache__" in path.parts:
            continue
        folder = path.parent
        while folder != root and not any(folder.glob("*.py")):
            folder = folder.parent
        out.setdefault(folder, []).append(path)
    return out


def _read_cache(cache: Path | None) -> dict:
    try:
        return json.loads(cache.read_text()) if cache is not None else {}
    except (OSError, ValueError):  # none yet, or a broken one: recomputed
        return {}


def fingerprints(root: Path | None = None, cache: Path | None = None) -> dict[str, str]:
    """{stage command: fingerprint} of the package at ``root`` (default: the one this process runs). With ``cache``
    (a JSON file), each file's digest and import candidates are taken from it when the file's bytes are the ones
    they were computed from, and the file is rewritten with this call's entries when any was computed."""
    root = root or package_root()
    modules = package_modules(root)
    extra = data_files(root)
    known, used = _read_cache(cache), {}

    def facts(path: Path, name: str | None) -> dict:
        """{digest, found, named} of a module (``name``), {digest} of a data file, by the file's bytes."""
        key = f"{name or path.suffix} {hashlib.sha256(path.read_bytes()).hexdigest()}"
        if (got := known.get(key)) is None:
            tree = parse(path) if name else None
            got = {"digest": source_digest(path, tree)}
            if name:
                found, named = import_candidates(name, path, tree, strings=name != CLI)
                got.update(found=sorted(found), named=sorted(named))
        used[key] = got
        return got

    module_facts = {m: facts(p, m) for m, p in modules.items()}
    imports = {m: package_imports(f["found"], f["named"], modules) for m, f in module_facts.items()}
    digests = {modules[m]: f["digest"] for m, f in module_facts.items()}
    digests |= {f: facts(f, None)["digest"] for files in extra.values() for f in files}
    if cache is not None and used.keys() - known.keys():
        write_text(cache, json.dumps(used, sort_keys=True))
    out = {}
    for command, module in STAGE_MODULES.items():
        files = {modules[m] for m in closure([*ENTRY, module], modules, imports)}
        files |= {f for folder in {p.parent for p in files} for f in extra.get(folder, [])}
        lines = "".join(f"{f.relative_to(root).as_posix()} {digests[f]}\n" for f in sorted(files))
        out[command] = hashlib.sha256(lines.encode()).hexdigest()[:DIGITS]
    return out


def fingerprints_text(values: dict[str, str]) -> str:
    return ("# Generated by `protoclip dvc-yaml` and by every `snakemake` call (protoclip/dag/code_version.py): per\n"
            "# stage command, a hash of the code it runs without comments and docstrings. Each DVC stage lists its\n"
            "# command's key as a param; the Snakemake rules rerun on the same value. Commit it with the code.\n"
            + yaml.safe_dump(values, sort_keys=False))


def write_fingerprints(path: str | Path = FINGERPRINTS, root: Path | None = None,
                       cache: Path | None = None) -> dict[str, str]:
    """Compute the fingerprints (with ``cache``, see :func:`fingerprints`) and write them to ``path`` when they
    differ from what it holds (an unchanged file keeps its time); return them."""
    values = fingerprints(root, cache)
    text = fingerprints_text(values)
    path = Path(path)
    if not path.is_file() or path.read_text() != text:
        write_text(path, text)
    return values
