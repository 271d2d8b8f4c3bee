"""Evaluation of an image-only run (``method: pcl``): zero-shot and retrieval are reported "not applicable", never
as chance numbers of the untrained text tower; image-feature tasks run as usual."""
from __future__ import annotations

import json
from contextlib import contextmanager

import pytest

from protoclip.evaluate.collect import run_collect
from protoclip.evaluate.plan import image_only_method
from protoclip.evaluate.stage import run_evaluate
from protoclip.models import EvalSpec, build_model, read_eval_spec, save_model
from testkit.evaluation import RUN, RecordingTracker
from testkit.training import one_thread

_threads = pytest.fixture(autouse=True)(one_thread)


def _save_as(layout, method: str) -> EvalSpec:
    """Re-save the fixture's model as trained by ``method`` (the spec its class writes at save time)."""
    from protoclip.config.strict import build
    from protoclip.train.config import TrainConfig

    tcfg = build(TrainConfig, {"method": method, "lock_image_epoch": None})
    save_model(layout.model(RUN), build_model("tiny-rn", head_hidden=32, head_out=16), {"method": method},
               eval_spec=tcfg.method_class().eval_spec(tcfg))
    return read_eval_spec(layout.model(RUN))


def test_image_only_run_reports_text_tasks_not_applicable(project, monkeypatch):
    cfg, layout = project
    assert image_only_method(_save_as(layout, "pcl")) == "pcl"
    cfg._runs = {RUN: ({"method": "protoclip"}, "<test>")}  # the model file decides, not the project config

    @contextmanager
    def fake_evaluation_run(paths, run, model_sha256, targets):
        yield RecordingTracker()

    monkeypatch.setattr("protoclip.evaluate.stage.evaluation_run", fake_evaluation_run)
    run_evaluate(cfg, RUN, tasks=["knn", "retrieval", "zeroshot"], datasets=["digits", "heldout_pairs"])
    run_collect(cfg, RUN)  # per-set evaluations leave metrics.json to `collect`
    for task, name in (("retrieval", "heldout_pairs"), ("zeroshot", "digits")):
        rec = json.loads(layout.metrics(RUN, task, name).read_text())
        assert rec["skipped"].startswith("not applicable: image-only method (pcl)") and "metrics" not in rec
    assert "top1" in json.loads(layout.metrics(RUN, "knn", "digits").read_text())["metrics"]
    summary = json.loads(layout.metrics_summary(RUN).read_text())
    assert summary["retrieval"]["heldout_pairs"]["status"] == {
        "state": "not_applicable", "reason": "image-only method (pcl)", "detail": "the text tower is untrained"}


def test_text_methods_are_not_image_only(project):
    _, layout = project
    for method in ("protoclip", "clip", "nclip", "xclip"):
        assert image_only_method(_save_as(layout, method)) is None
    assert image_only_method(EvalSpec()) is None  # a model saved without a method: evaluate everything
    assert image_only_method(EvalSpec(image_only=True)) == "unknown method"
