"""docs/architecture.md is the code's.

Its floors table: every import between two modules of src/protoclip (at a module's top, inside a function or under
TYPE_CHECKING) goes from a room to a room on a lower floor, or stays in its room, except the upward imports the doc
declares; every module lives in a room of the table and every room of the table exists; only the modules the doc
names load others by name; MLflow only through tracking.py, Snakemake and DVC only in dag/. Its names: every
``<module>.<name>`` it writes is defined there, every ``.py`` path it writes exists. And the house's sizes: no
function over 80 lines, no module over 600, no module docstring over 6 lines: what and why, the rest in docs/ (the
project's style)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from testkit import REPO

SRC = REPO / "src" / "protoclip"
DOC = REPO / "docs" / "architecture.md"
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 600
MAX_MODULE_DOCSTRING_LINES = 6


def floors_table(doc: str) -> dict[str, int]:
    """room -> floor, from the doc's Layers table: a room is a path under src/protoclip, a folder ending in "/"."""
    section = doc.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rooms: dict[str, int] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].isdigit():
            for room in re.findall(r"`([^`]+)`", cells[1]):
                assert room not in rooms, f"{room} stands on two floors"
                rooms[room] = int(cells[0])
    return rooms


def declared_upward(doc: str) -> set[tuple[str, str]]:
    """The (room, room) pairs of the doc's "Declared upward imports" line: `a` -> `b` each, or none."""
    line = next(x for x in doc.splitlines() if x.startswith("Declared upward imports"))
    return set(re.findall(r"`([^`]+)` -> `([^`]+)`", line))


def modules(root: Path = SRC) -> dict[str, Path]:
    """dotted name -> file, every module of the package (a package by its __init__.py)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(source: str, known: set[str]) -> set[str]:
    """The project modules a file imports anywhere in it (``from a.b import c`` is a.b.c when that is a module)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.update(f"{node.module}.{a.name}" for a in node.names)
    out = set()
    for name in names:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name.startswith("protoclip"):
            out.add(name)
    return out


def room_of(path: Path, rooms: dict[str, int], root: Path = SRC) -> str | None:
    """The longest room of the table that holds ``path``."""
    rel = path.relative_to(root).as_posix()
    held = [r for r in rooms if rel == r or (r.endswith("/") and rel.startswith(r))]
    return max(held, key=len) if held else None


def is_face(path: Path, known: set[str]) -> bool:
    """A package's __init__.py that imports nothing of the project: it needs no room."""
    return path.name == "__init__.py" and not imports(path.read_text(encoding="utf-8"), known)


def upward_imports(rooms: dict[str, int], root: Path = SRC) -> list[tuple[str, str, str]]:
    """(room, room, what) per import whose target's room is not on a lower floor than the importer's (same room:
    fine)."""
    mods = modules(root)
    known = set(mods)
    out = []
    for name, path in mods.items():
        here = room_of(path, rooms, root)
        for target in sorted(imports(path.read_text(encoding="utf-8"), known) - {name}):
            there = room_of(mods[target], rooms, root)
            if here is None or there is None or here == there:
                continue
            if rooms[there] >= rooms[here]:
                out.append((here, there, f"{name} (floor {rooms[here]}) imports {target} (floor {rooms[there]})"))
    return out


def missing_rooms(rooms: dict[str, int], root: Path = SRC) -> list[str]:
    """Modules no room holds (faces excepted), and rooms of the table that hold no module."""
    mods = modules(root)
    known = set(mods)
    homeless = [p.relative_to(root).as_posix() for p in mods.values()
                if room_of(p, rooms, root) is None and not is_face(p, known)]
    empty = [r for r in rooms if not any(room_of(p, {r: 0}, root) for p in mods.values())]
    return homeless + [f"{r}: in the table, not in the code" for r in empty]


DOC_TEXT = DOC.read_text(encoding="utf-8")
ROOMS = floors_table(DOC_TEXT)


def test_the_table_is_read():
    assert len(ROOMS) > 20 and ROOMS["cli.py"] > ROOMS["project.py"] > ROOMS["train/"] > ROOMS["errors.py"] == 1


def test_every_import_goes_down_or_is_declared():
    declared = declared_upward(DOC_TEXT)
    assert [what for here, there, what in upward_imports(ROOMS) if (here, there) not in declared] == []


def test_every_module_has_a_room_and_every_room_a_module():
    assert missing_rooms(ROOMS) == []


def test_the_check_flags_an_upward_import_and_a_missing_room(tmp_path):
    """By construction: a low module that imports a higher one, a module no room holds, a room that is gone."""
    pkg = tmp_path / "protoclip"
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "__init__.py").write_text("")
    (pkg / "low" / "a.py").write_text("def f():\n    from protoclip.high import g\n    return g\n")
    (pkg / "high.py").write_text("g = 1\n")
    (pkg / "stray.py").write_text("import protoclip.high\n")
    rooms = {"__init__.py": 1, "low/": 1, "high.py": 2, "gone.py": 3}
    assert upward_imports(rooms, pkg) == [
        ("low/", "high.py", "protoclip.low.a (floor 1) imports protoclip.high (floor 2)")]
    assert missing_rooms(rooms, pkg) == ["stray.py", "gone.py: in the table, not in the code"]
    assert upward_imports({"__init__.py": 1, "low/": 3, "high.py": 2, "stray.py": 3}, pkg) == []
    assert upward_imports({"__init__.py": 1, "low/": 2, "high.py": 2}, pkg) != []  # one floor: not below
    assert declared_upward("Declared upward imports (...): `low/` -> `high.py` (why).") == {("low/", "high.py")}


def test_only_the_named_modules_load_by_name():
    """The doc's "Loads by name" paragraph names every module that calls importlib.import_module."""
    para = DOC_TEXT.split("Loads by name", 1)[1].split("\n\n", 1)[0]
    named = {r for r in re.findall(r"`([a-z_/]+\.py)`", para)}
    calling = {p.relative_to(SRC).as_posix() for p in SRC.rglob("*.py")
               if "import_module(" in p.read_text(encoding="utf-8")}
    assert calling == named


def long_definitions(root: Path = SRC) -> list[str]:
    """Functions over MAX_FUNCTION_LINES lines (decorators to last line) and modules over MAX_MODULE_LINES."""
    out = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(root).as_posix()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            out.append(f"{rel}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                if node.end_lineno - start + 1 > MAX_FUNCTION_LINES:
                    out.append(f"{rel}:{node.name}: {node.end_lineno - start + 1} lines")
    return out


def test_no_function_over_80_lines_no_module_over_600():
    assert long_definitions() == []


@pytest.mark.parametrize("lines, flagged", [(MAX_FUNCTION_LINES, False), (MAX_FUNCTION_LINES + 1, True)])
def test_the_size_check_counts_a_function_from_its_def_to_its_last_line(tmp_path, lines, flagged):
    body = "".join("    x = 1\n" for _ in range(lines - 1))
    (tmp_path / "m.py").write_text(f"def f():\n{body}")
    assert bool(long_definitions(tmp_path)) is flagged


def long_module_docstrings(root: Path = SRC) -> list[str]:
    """Modules whose docstring runs over MAX_MODULE_DOCSTRING_LINES lines (from its opening quotes to its closing)."""
    out = []
    for path in sorted(root.rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=False)
        if doc is not None and len(doc.splitlines()) > MAX_MODULE_DOCSTRING_LINES:
            out.append(f"{path.relative_to(root).as_posix()}: {len(doc.splitlines())} lines")
    return out


def test_module_docstrings_of_a_few_lines():
    assert long_module_docstrings() == []


@pytest.mark.parametrize("lines, flagged", [(MAX_MODULE_DOCSTRING_LINES, False),
                                            (MAX_MODULE_DOCSTRING_LINES + 1, True)])
def test_the_docstring_check_counts_every_line_of_a_module_docstring(tmp_path, lines, flagged):
    text = "\n".join(f"line {i}" for i in range(lines))
    (tmp_path / "m.py").write_text(f'"""{text}"""\nx = 1\n')
    assert bool(long_module_docstrings(tmp_path)) is flagged


def third_party(path: Path) -> set[str]:
    """The top-level packages outside the project that a file imports anywhere in it."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names - {"protoclip"}


def test_mlflow_only_through_tracking_snakemake_and_dvc_only_in_dag():
    """The doc's rule: MLflow is reached only through tracking.py; the workflow tools only from dag/."""
    users = {pkg: sorted(p.relative_to(SRC).as_posix() for p in SRC.rglob("*.py") if pkg in third_party(p))
             for pkg in ("mlflow", "snakemake", "dvc")}
    assert users["mlflow"] == ["tracking.py"]
    assert all(p.startswith("dag/") for p in users["snakemake"] + users["dvc"]), users


def top_level_names(path: Path) -> set[str]:
    """What a module defines or imports at its top (functions, classes, assignments, imported names)."""
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


CONFIG_KEYS = {"train.validation.tasks"}  # config keys the doc writes that spell like a module's name
EXTENSIONS = {"json", "png", "py", "yaml", "md", "csv", "tex", "html", "npz", "jsonl"}


def references(doc: str, root: Path = SRC) -> set[str]:
    """The doc's code spans' dotted names that start at the package or at one of its top-level rooms
    (``protoclip.files.records.PHASES``, ``files.records.PHASES``), without ``protoclip.``."""
    tops = {p.stem if p.suffix == ".py" else p.name for p in root.iterdir() if not p.name.startswith("_")}
    refs = set()
    for span in re.findall(r"`([^`]+)`", re.sub(r"```.*?```", "", doc, flags=re.S)):
        for ref in re.findall(r"(?<![\w./])([a-z_]+(?:\.\w+)+)", span):
            parts = ref.split(".")[1:] if ref.startswith("protoclip.") else ref.split(".")
            if parts and parts[0] in tops and ".".join(parts) not in CONFIG_KEYS and parts[-1] not in EXTENSIONS:
                refs.add(".".join(parts))
    return refs


def stale_names(doc: str, root: Path = SRC) -> list[str]:
    """The doc's references to a module's name (``files.records.PHASES``) whose module does not define or import
    that name at its top (the recipes' examples, ``my...``, aside). A reference that stops at a package and goes on
    with a name the package does not hold is a config key (``train.pcl``), not checked."""
    out = []
    for ref in sorted(references(doc, root)):
        parts = ref.split(".")
        for i in range(len(parts), 0, -1):
            module = root.joinpath(*parts[:i]).with_suffix(".py")
            package = root.joinpath(*parts[:i]) / "__init__.py"
            if module.is_file() or package.is_file():
                break
        rest = parts[i:]
        if not rest or any(p.startswith("my") for p in parts):
            continue
        if module.is_file() and rest[0] not in top_level_names(module):
            out.append(ref)
    return out


def test_the_doc_names_what_the_code_defines():
    """A moved or renamed function, class or constant that docs/architecture.md still names where it was fails."""
    assert stale_names(DOC_TEXT) == []
    assert stale_names("`protoclip.report.values.PHASES_GONE`, `files.records.PHASES`, `records.Nope`, "
                       "`teacher.cache.gone`, `train.pcl`") == ["report.values.PHASES_GONE", "teacher.cache.gone"]


def missing_paths(doc: str, repo: Path = REPO) -> list[str]:
    """The doc's code spans' ``.py`` paths that no file of the repository ends with (the recipes' ``my...`` aside)."""
    files = [p.relative_to(repo).as_posix() for top in ("src", "tests", "bench", "workflow", "config")
             for p in (repo / top).rglob("*.py")] + [p.name for p in repo.glob("*.py")]
    out = []
    for span in re.findall(r"`([^`]+)`", re.sub(r"```.*?```", "", doc, flags=re.S)):
        for path in re.findall(r"((?:[\w.]+/)*\w+\.py)\b", span):
            if "my" not in path.split("/")[-1][:2] and not any(f == path or f.endswith("/" + path) for f in files):
                out.append(path)
    return sorted(set(out))


def test_the_doc_names_files_that_exist():
    assert missing_paths(DOC_TEXT) == []
    assert missing_paths("`train/gone.py`, `methods/base.py`, `src/protoclip/train/methods/mymethod.py`") == [
        "train/gone.py"]
