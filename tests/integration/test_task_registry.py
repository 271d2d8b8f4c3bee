"""An evaluation task declared in one place (a :class:`protoclip.tasks.Task` with its adapter, registered here by a
fixture) is planned, evaluated, collected, tabled by the report, accepted by a paper target's column and, marked
so, run by validation while training: nothing else names it."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from protoclip import models
from protoclip.evaluate.adapters import SetInput, TaskResult
from protoclip.evaluate.collect import run_collect, summary_table
from protoclip.evaluate.config import EvalDatasetConfig
from protoclip.evaluate.datasets import CaptionSet, load_eval_set
from protoclip.evaluate.plan import not_applicable, plan_tasks, static_tasks
from protoclip.evaluate.stage import run_evaluate
from protoclip.files import records
from protoclip.files.layout import Layout
from protoclip.report.paper_targets import ColumnConfig
from protoclip.report.tables import collect_metrics, table_tasks, task_table
from protoclip.report.values import Results
from protoclip.tasks import TASKS, Task, TaskStatus, register, unregister
from protoclip.train.config import TrainConfig, ValidationConfig
from protoclip.train.validation import build_validator
from testkit.evaluation import RUN
from testkit.training import one_thread

_threads = pytest.fixture(autouse=True)(one_thread)


def label_stats(x: SetInput) -> TaskResult:
    """The toy task: the test split's mean label and number of distinct labels (digits: 2 test images of each of
    the 10 classes, so 4.5 and 10), read from the extracted features' labels."""
    y = np.asarray(x.feats.test_y)
    return TaskResult({"mean_label": float(y.mean()), "n_labels": int(len(np.unique(y)))}, "labels",
                      {"n_test": int(len(y))})


@pytest.fixture
def toy_task():
    """The one place the toy task is declared; it is gone again after the test."""
    task = register(Task("label_stats", ("mean_label", "n_labels"), label_stats, validation=True))
    yield task
    unregister(task.name)
    assert "label_stats" not in TASKS


def test_a_task_registered_once_is_planned_evaluated_and_reported(toy_task, project):
    cfg, layout = project
    assert "label_stats" in cfg.evaluate.datasets["digits"].tasks  # a set's default tasks: every task
    # the plan: a labelled set's task, not a caption set's, and no text-tower task (an image-only run keeps it)
    assert "label_stats" in static_tasks("digits", cfg.evaluate.datasets["digits"])
    assert "label_stats" not in static_tasks("coco", cfg.evaluate.datasets["coco"])
    digits = load_eval_set("digits", cfg.evaluate.datasets["digits"], layout, tasks=["label_stats"])
    assert plan_tasks("digits", digits, ["label_stats"], image_only="pcl")["label_stats"].runs
    assert not_applicable("label_stats", CaptionSet("c", digits.test, [["a"]] * len(digits.test))) == \
        "no class labels"

    run_evaluate(cfg, RUN, tasks=["label_stats"], datasets=["digits"])
    run_collect(cfg, RUN)
    metrics = records.read_metrics(layout.metrics(RUN, "label_stats", "digits"))
    assert metrics == {"mean_label": 4.5, "n_labels": 10}
    summary = records.collected_results(layout, RUN)
    lines = [line.split() for line in summary_table(summary).splitlines()]
    assert ["digits", "label_stats", "mean_label", "=", "4.5"] in lines  # the headline: its first metric
    status = records.status_of(summary["label_stats"]["cifar10"])  # a configured set whose data is missing
    assert status.state == TaskStatus.MISSING

    # the report: its generic table, rows in the task's metric order
    assert "label_stats" in table_tasks()
    table, skipped = task_table(collect_metrics(Results(cfg), [RUN]), "label_stats")
    assert list(table.index) == [("digits", "mean_label"), ("digits", "n_labels")]
    assert table[RUN].tolist() == ["4.5", "10"] and skipped == []  # cifar10: no evaluation folder, no row
    # a paper target may show it: its column is accepted and asks the DAG to evaluate the task on its sets
    column = ColumnConfig(label="Mean label", task="label_stats", metric="mean_label", datasets=["digits"])
    column.validate()


def test_a_task_marked_for_validation_runs_while_training(toy_task, project):
    cfg, layout = project
    ValidationConfig(tasks=["label_stats"]).validate()
    with pytest.raises(ValueError, match="already registered"):  # one declaration per name
        register(Task("label_stats", ("mean_label",), label_stats))
    with pytest.raises(ValueError, match="not 'tasks'"):  # <task>.json sits beside the evaluation's tasks.json
        register(Task("tasks", ("mean_label",), label_stats))
    other = register(Task("label_stats_eval_only", ("mean_label",), label_stats))
    try:
        with pytest.raises(ValueError, match=r"non-empty list of zeroshot, knn, retrieval, label_stats,"):
            ValidationConfig(tasks=["label_stats_eval_only"]).validate()
    finally:
        unregister(other.name)
    tcfg = TrainConfig(method="clip", validation=ValidationConfig(every_episodes=1, dataset="digits",
                                                                  tasks=["label_stats"]))
    torch.manual_seed(0)
    model = models.build_model("tiny-rn", head_hidden=32, head_out=16)
    validator = build_validator(cfg.evaluate, Layout.from_config(cfg), tcfg, model.image_size, tokenizer=lambda texts: None)
    out = validator(model)
    assert (out["val/label_stats/mean_label"], out["val/label_stats/n_labels"]) == (4.5, 10)
