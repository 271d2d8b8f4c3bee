"""Task knowledge lives with the task: outside its module (src/protoclip/evaluate/tasks/<name>.py) and the config
modules, no code names an evaluation task by a string; the plan, the report, the ledger and validation read the
task's properties (protoclip.tasks.Task) instead. A string of the package equal to a task name is either there,
or one of the words below that merely spell like one (a metric's key, a plot kind, a data set type)."""
from __future__ import annotations

import ast
from pathlib import Path

from protoclip.tasks import TASKS

SRC = Path(__file__).resolve().parents[2] / "src" / "protoclip"

# (module, string): the same word meaning something else than the task
NOT_TASKS = {
    ("evaluate/metrics/nemd.py", "nemd"): "the metric's own key in its result dict",
    ("toy/pauc_nemd.py", "nemd"): "the toy study's metric key and table column",
    ("evaluate/datasets/wds.py", "retrieval"): "CLIP_benchmark's dataset_type.txt word for a caption set",
    ("evaluate/plan.py", "retrieval"): "CLIP_benchmark's dataset_type.txt word for a caption set",
    ("report/paper_targets.py", "tsne"): "a figure's plot kind",
    ("report/paper_targets.py", "temperature"): "a figure's plot kind",
    ("report/figures.py", "tsne"): "a figure's plot kind",
    ("report/figures.py", "temperature"): "a figure's plot kind",
    ("report/temperature.py", "linear"): "a matplotlib axis scale",
    ("report/dvc_plots.py", "linear"): "a DVC plot template",
}


def _allowed(rel: str) -> bool:
    """The task modules and the config modules (a config's defaults may name tasks, as its YAML does)."""
    return rel.startswith(("evaluate/tasks/", "config/")) or rel.endswith("config.py")


def task_name_strings() -> set[tuple[str, str]]:
    """(module, string) of every string constant of the package, outside the allowed modules, equal to a task name
    (docstrings never equal one)."""
    found = set()
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if _allowed(rel):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in TASKS:
                found.add((rel, node.value))
    return found


def test_no_task_is_named_outside_its_module_and_the_config():
    found = task_name_strings()
    named = sorted(found - set(NOT_TASKS))
    assert not named, f"task names written outside their task module (read a Task property instead): {named}"
    assert not set(NOT_TASKS) - found, f"stale entries of NOT_TASKS: {sorted(set(NOT_TASKS) - found)}"


def test_the_scan_finds_a_task_name(tmp_path, monkeypatch):
    """The scan itself: a module comparing with a task name is reported."""
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "x.py").write_text('def f(task):\n    return task == "knn"\n')
    monkeypatch.setitem(globals(), "SRC", tmp_path)
    assert task_name_strings() == {("report/x.py", "knn")}
