"""The result-file formats (protoclip.files.records), the one presence check of an eval set and the task planner."""
from __future__ import annotations

import ast
import json

import numpy as np

from protoclip.files import records
from protoclip.evaluate.config import EvalDatasetConfig
from protoclip.evaluate.datasets import ArraySplit, LabelledSet, Skipped, eval_data_path, missing_reason
from protoclip.evaluate.plan import RUNS, TaskPlan, plan_tasks
from protoclip.files.layout import Layout
from protoclip.tasks import TaskStatus
from testkit import REPO

SRC = REPO / "src" / "protoclip"


def test_metrics_files_read_back_in_one_shape(tmp_path):
    lay = Layout(tmp_path / "data", tmp_path / "results")
    records.write_metrics(lay.metrics("r", "knn", "digits"),
                          {"run": "r", "dataset": "digits", "task": "knn", "metrics": {"top1": 91.5}, "n_test": 3})
    missing = TaskStatus(TaskStatus.MISSING, "skipped: cifar10 not found at /x")
    records.write_skip(lay.metrics("r", "zeroshot", "cifar10"), "r", "cifar10", "zeroshot", missing)
    (lay.eval_dir("r", "digits") / "notes.json").write_text("{}")  # not a task: not a metrics file
    for dataset, task in (("digits", "knn"), ("cifar10", "zeroshot")):  # as evaluate does last: the marker
        records.write_tasks(lay.eval_tasks("r", dataset), "r", dataset, {task: "ran"}, "0" * 64,
                            files=[lay.metrics("r", task, dataset)])
    assert records.read_metrics(lay.metrics("r", "knn", "digits")) == {"top1": 91.5}
    skipped = records.read_metrics(lay.metrics("r", "zeroshot", "cifar10"))
    assert skipped == {"skipped": "skipped: cifar10 not found at /x",
                       "status": {"state": "missing", "reason": "skipped: cifar10 not found at /x", "detail": ""}}
    assert records.skip_line(skipped) == "skipped: cifar10 not found at /x" and records.status_of(skipped) == missing
    assert records.skip_line({"top1": 1.0}) is None and records.skip_line(None) is None
    assert records.status_of({"top1": 1.0}) is None and records.status_of(None) is None
    assert records.read_metrics(lay.metrics("r", "linear", "digits")) is None  # no file
    assert [(t, d) for t, d, _ in records.metrics_files(lay, "r")] == [("knn", "digits"), ("zeroshot", "cifar10")]
    assert records.run_results(lay, "r") == {"knn": {"digits": {"top1": 91.5}}, "zeroshot": {"cifar10": skipped}}
    assert json.loads(lay.metrics("r", "zeroshot", "cifar10").read_text())["task"] == "zeroshot"


def test_per_example_results_round_trip_vouched_and_byte_deterministic(tmp_path):
    import pytest

    from protoclip.files.completion import IncompleteOutputError

    lay = Layout(tmp_path / "data", tmp_path / "results")
    hits = {"top1": np.array([True, False, True]), "top5": np.ones(3, bool), "labels": np.array([2, 0, 1])}
    path = records.write_examples(lay.examples("r", "knn", "digits"), hits)
    assert path.name == "knn.examples.npz" and path.parent == lay.metrics("r", "knn", "digits").parent
    first = path.read_bytes()
    records.write_examples(path, dict(reversed(list(hits.items()))))  # same arrays, later, other order
    assert path.read_bytes() == first  # fixed zip entry times: no change for DVC
    records.write_metrics(lay.metrics("r", "knn", "digits"), {"metrics": {"top1": 200 / 3}})
    # no marker yet: the folder is incomplete (killed half-way), never read as a result
    with pytest.raises(IncompleteOutputError, match="tasks.json"):
        records.read_examples(lay, "r", "knn", "digits")
    records.write_tasks(lay.eval_tasks("r", "digits"), "r", "digits", {"knn": "ran"}, "0" * 64,
                        files=[lay.metrics("r", "knn", "digits"), path])
    back = records.read_examples(lay, "r", "knn", "digits")
    assert set(back) == set(hits) and all(np.array_equal(back[k], v) and back[k].dtype == v.dtype
                                          for k, v in hits.items())
    assert records.read_examples(lay, "r", "zeroshot", "digits") is None  # the marker lists none
    assert records.read_examples(lay, "r", "knn", "cifar10") is None  # no folder
    assert [t for t, _, _ in records.metrics_files(lay, "r")] == ["knn"]  # the .npz is no metrics file
    path.write_bytes(first[:-10])  # changed after the marker was written
    with pytest.raises(IncompleteOutputError, match="changed after"):
        records.read_examples(lay, "r", "knn", "digits")


def test_train_log_round_trip_filters_kinds_and_cleans_non_finite(tmp_path):
    log = records.TrainLog(tmp_path / "train_log.jsonl")
    log.append({"kind": "start", "episode": 0})
    log.append({"kind": "step", "step": 0, "loss": float("nan")})
    log.append({"kind": "episode", "episode": 0, "time/train": 1.5})
    log.append({"kind": "step", "step": 1, "loss": 2.0})
    assert [r["step"] for r in records.read_train_log(log.path, kind="step")] == [0, 1]
    assert records.read_train_log(log.path, kind="step")[0]["loss"] == "nan"  # JSON has no NaN
    assert len(records.read_train_log(log.path)) == 4
    assert log.resume_at(episode=0, step=1) == 2  # a checkpoint before episode 0 ended, after step 0
    assert [r["kind"] for r in records.read_train_log(log.path)] == ["start", "step"]
    assert records.read_train_log(tmp_path / "none.jsonl") == []


def test_missing_reason_is_the_one_presence_check(tmp_path):
    lay = Layout(tmp_path / "data", tmp_path / "results")
    offline = EvalDatasetConfig(kind="offline")
    assert eval_data_path("digits", offline, lay) == lay.eval_set("digits")
    assert eval_data_path("heldout_pairs", offline, lay) == lay.manifest
    assert missing_reason("digits", offline, lay) == f"skipped: digits not found at {lay.eval_set('digits')}"
    lay.eval_set("digits").parent.mkdir(parents=True)
    lay.eval_set("digits").write_bytes(b"")
    assert missing_reason("digits", offline, lay) is None
    assert missing_reason("cifar10", EvalDatasetConfig(kind="torchvision"), lay) == \
        "skipped: cifar10 path not configured"
    ext = EvalDatasetConfig(kind="folder", path=str(tmp_path / "ext"))
    assert missing_reason("pets", ext, lay) == f"skipped: pets not found at {tmp_path / 'ext'}"
    (tmp_path / "ext").mkdir()
    assert missing_reason("pets", ext, lay) is None


def _labelled(templates: list[str], train: bool) -> LabelledSet:
    split = ArraySplit(np.zeros((4, 8, 8, 3), np.uint8), np.array([0, 1, 0, 1]))
    return LabelledSet("s", ["a", "b"], templates, split, split if train else None)


def test_plan_tasks_decides_run_or_skip_per_task():
    na = TaskStatus.NOT_APPLICABLE
    tasks = ["zeroshot", "linear", "knn", "retrieval", "clustering"]
    plan = plan_tasks("s", _labelled(["a photo of a {}."], train=False), tasks, image_only=None)
    assert plan["zeroshot"] == RUNS and plan["clustering"] == RUNS and plan["zeroshot"].runs
    assert plan["linear"] == TaskPlan(TaskStatus(na, "no train split"))
    assert plan["linear"].status.line == "not applicable: no train split"
    assert plan["retrieval"] == TaskPlan(TaskStatus(na, "no captions"))
    # an image-only run: its text-tower task gets a not-applicable metrics file (cells read n/a)
    plan = plan_tasks("s", _labelled(["a photo of a {}."], train=True), tasks, image_only="pcl")
    assert plan["zeroshot"].status == TaskStatus(na, "image-only method (pcl)", "the text tower is untrained")
    assert plan["zeroshot"].status.line == "not applicable: image-only method (pcl), the text tower is untrained"
    assert plan["zeroshot"].metrics_file and not plan["zeroshot"].in_marker and not plan["zeroshot"].runs
    assert plan["linear"].runs
    # a set without templates: zero-shot does not apply to the set, whatever the method
    assert plan_tasks("s", _labelled([], True), ["zeroshot"], "pcl")["zeroshot"] == TaskPlan(
        TaskStatus(na, "no prompt templates"))
    missing = plan_tasks("s", Skipped("s", "skipped: s not found at /x"), ["knn"], None)["knn"]
    assert missing == TaskPlan(TaskStatus(TaskStatus.MISSING, "skipped: s not found at /x"), metrics_file=True)
    assert missing.status.line == "skipped: s not found at /x"
    # a copy without its training split: the probes are skipped with the reason (in their cells), the rest runs
    test_only = _labelled(["a photo of a {}."], train=False)
    test_only.train_missing = "no train split in /x/gtsrb (RuntimeError: Dataset not found.)"
    plan = plan_tasks("s", test_only, tasks, image_only=None)
    assert plan["knn"] == plan["linear"] == TaskPlan(TaskStatus(
        TaskStatus.MISSING, "skipped: s: no train split in /x/gtsrb (RuntimeError: Dataset not found.)"),
        metrics_file=True)
    assert plan["zeroshot"].runs and plan["clustering"].runs


def test_task_status_lines_and_records_round_trip():
    small = TaskStatus(TaskStatus.TOO_SMALL, "t-SNE needs at least 3 test images")
    assert small.line == "not run: t-SNE needs at least 3 test images" and not small.ran
    assert TaskStatus(TaskStatus.RAN).line == "ran" and TaskStatus(TaskStatus.RAN).ran
    for status in (small, TaskStatus(TaskStatus.NOT_APPLICABLE, "a", "b"), TaskStatus(TaskStatus.MISSING, "x")):
        assert TaskStatus.from_record(json.loads(json.dumps(status.record()))) == status
    import pytest

    with pytest.raises(ValueError, match="unknown task state"):
        TaskStatus("maybe")


def test_a_skip_record_without_its_status_is_one_line_naming_it(tmp_path):
    import pytest

    from protoclip.files.completion import RecordError

    path = tmp_path / "knn.json"
    path.write_text(json.dumps({"skipped": "not applicable: x"}))
    with pytest.raises(RecordError, match=f"{path}: a skipped task without its status"):
        records.read_metrics(path)


def test_layout_imports_nothing_of_the_project():
    tree = ast.parse((SRC / "files" / "layout.py").read_text())
    imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)] + \
        [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in imported if m and m.startswith("protoclip")], imported
