"""An evaluation task added as one module reaches every consumer: a toy task declared here the way each module of
protoclip.evaluate.tasks declares its own (its Task with adapter, settings section, minimum-data rule, chance level,
resampling unit and MLflow params) is read from the config, planned, evaluated, tabled with its chance level by the
report, resampled by the claims ledger and run by validation while training. No file of the package is edited.
(tests/integration/test_task_registry.py runs a toy task through collect as well.)"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import yaml

from protoclip.claims.units import chance_of, metric_units
from protoclip.errors import ConfigError
from protoclip.evaluate.collect import run_collect
from protoclip.evaluate.config import EvaluateConfig
from protoclip.evaluate.plan import static_tasks, too_small
from protoclip.evaluate.set_features import SetFeatures
from protoclip.evaluate.stage import run_evaluate, task_params
from protoclip.evaluate.tasks.base import SetInput, TaskResult, sizes, with_labels
from protoclip.files import records
from protoclip.project import load_config
from protoclip.report.paper_tables import build_table
from protoclip.report.paper_targets import ColumnConfig, RowConfig, TargetConfig
from protoclip.report.tables import table_tasks
from protoclip.report.values import Results
from protoclip.similarity import Similarity
from protoclip.tasks import TASKS, Task, register, unregister
from protoclip.train.config import ValidationConfig
from testkit.evaluation import RUN
from testkit.training import one_thread

_threads = pytest.fixture(autouse=True)(one_thread)
TOY = "toy_below"


# ---- the toy task module: everything about the task is here ---------------------------------------------------
@dataclass
class ToyBelowConfig:
    """``evaluate.toy_below``: the label under which a test image counts as a hit."""
    below: int = 5

    def validate(self) -> None:
        if self.below < 1:
            raise ValueError(f"below must be >= 1, got {self.below}")


def task_toy_below(x: SetInput) -> TaskResult:
    """A hit per test image whose label is under ``evaluate.toy_below.below`` (digits: 2 test images of each of
    its 10 classes, so 50 % at 5); ``n_classes`` states its chance level."""
    hits = (np.asarray(x.feats.test_y) < x.cfg.toy_below.below).astype(np.float64)
    m = {"top1": 100.0 * float(hits.mean()), "n_classes": 10}
    return TaskResult(m, "labels", sizes(x.feats), with_labels({"top1": hits}, x.feats))


def toy_too_small(feats, similarity) -> str | None:
    return "the toy task needs 3 classes" if len(np.unique(feats.test_y)) < 3 else None


def toy_chance(metrics: dict) -> float | None:
    return 100.0 / metrics["n_classes"] if "n_classes" in metrics else None


@pytest.fixture
def toy_task():
    task = register(Task(TOY, ("top1",), task_toy_below, examples="hits", validation=True, settings=ToyBelowConfig,
                         too_small=toy_too_small, chance=toy_chance, title="Toy", digits=1,
                         params=lambda s, run: {"toy_below": s.below}))
    yield task
    unregister(task.name)


def test_a_task_module_is_read_from_the_config(toy_task, tmp_path):
    """Its section is ``evaluate.toy_below``, built strictly; the DAG lists it among the evaluation's params."""
    assert EvaluateConfig().toy_below == ToyBelowConfig()
    assert TOY in EvaluateConfig.keys()
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"evaluate": {"toy_below": {"below": 3}}}))
    assert load_config(path).evaluate.toy_below.below == 3
    path.write_text(yaml.safe_dump({"evaluate": {"toy_below": {"under": 3}}}))
    with pytest.raises(ConfigError, match="unknown key 'evaluate.toy_below.under'"):
        load_config(path)
    path.write_text(yaml.safe_dump({"evaluate": {"toy_below": {"below": 0}}}))
    with pytest.raises(ConfigError, match="evaluate.toy_below.below must be >= 1"):
        load_config(path)
    assert task_params(EvaluateConfig(), RUN)["toy_below"] == 5  # its MLflow params beside the others'
    assert list(TASKS)[-1] == TOY  # a plug-in's order: after the package's tasks


def test_a_task_module_is_planned_evaluated_reported_and_resampled(toy_task, project):
    cfg, layout = project
    # the plan: a labelled set's task; its own minimum-data rule stops it on too few classes
    assert TOY in static_tasks("digits", cfg.evaluate.datasets["digits"])
    two = SetFeatures(test_z=np.zeros((4, 2)), test_y=np.array([0, 1, 0, 1]))
    assert too_small(TOY, two, Similarity()).reason == "the toy task needs 3 classes"

    cfg.evaluate.toy_below.below = 5
    run_evaluate(cfg, RUN, tasks=[TOY], datasets=["digits"])
    run_collect(cfg, RUN)
    assert records.read_metrics(layout.metrics(RUN, TOY, "digits"))["top1"] == 50.0

    # the report: its generic table, and a paper target's column with the task's chance level and digits
    assert TOY in table_tasks()
    target = TargetConfig(id="toy_table", kind="table", caption="toy", paper="-", rows=[RowConfig("ours", run=RUN)],
                          columns=[ColumnConfig(label="Toy", task=TOY, datasets=["digits"])])
    target.validate()
    table, caption, _ = build_table(cfg, Results(cfg), target)
    assert table[("Toy", "ours")].tolist() == ["50.0 (1 seed)"]
    assert "Toy chance level: digits 10.0%." in caption

    # the claims ledger: its per-example hits are the resampling units, giving the metrics file's number
    examples = records.read_examples(layout, RUN, TOY, "digits")
    assert float(metric_units(TOY, "top1", examples).value()[0]) == 50.0
    assert chance_of(TOY, "top1", examples, {"n_classes": 10})[0] == 10.0


def test_a_task_module_marked_for_validation_runs_while_training(toy_task, project):
    """Validation scores the model by the task's adapter with the task's own settings."""
    import torch

    from protoclip import models
    from protoclip.files.layout import Layout
    from protoclip.train.config import TrainConfig
    from protoclip.train.validation import build_validator

    cfg, _ = project
    cfg.evaluate.toy_below.below = 2
    tcfg = TrainConfig(method="clip", validation=ValidationConfig(every_episodes=1, dataset="digits", tasks=[TOY]))
    tcfg.validation.validate()
    torch.manual_seed(0)
    model = models.build_model("tiny-rn", head_hidden=32, head_out=16)
    validator = build_validator(cfg.evaluate, Layout.from_config(cfg), tcfg, model.image_size,
                                tokenizer=lambda texts: None)
    assert validator(model)[f"val/{TOY}/top1"] == 20.0  # labels 0 and 1: 4 of digits' 20 test images
