"""Evaluation of an image-only run (``method: pcl``): zero-shot and retrieval are reported "not applicable", never
as chance numbers of the untrained text tower; image-feature tasks run as usual."""
from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_eval_stage import RUN, RecordingTracker, one_thread, project  # noqa: E402,F401  (fixtures)

from protoclip.evaluate.stage import image_only_method, run_collect, run_evaluate  # noqa: E402


@pytest.mark.slow
def test_image_only_run_reports_text_tasks_not_applicable(project, monkeypatch):
    cfg, layout = project
    cfg._runs = {RUN: ({"method": "pcl", "lock_image_epoch": None}, "<test>")}
    assert image_only_method(cfg, RUN) == "pcl"

    @contextmanager
    def fake_evaluation_run(cfg_, run, model_sha256, targets=None):
        yield RecordingTracker()

    monkeypatch.setattr("protoclip.evaluate.stage.evaluation_run", fake_evaluation_run)
    run_evaluate(cfg, RUN, tasks=["knn", "retrieval", "zeroshot"], datasets=["digits", "heldout_pairs"])
    run_collect(cfg, RUN)  # per-set evaluations leave metrics.json to `collect`
    for task, name in (("retrieval", "heldout_pairs"), ("zeroshot", "digits")):
        rec = json.loads(layout.metrics(RUN, task, name).read_text())
        assert rec["skipped"].startswith("not applicable: image-only method (pcl)") and "metrics" not in rec
    assert "top1" in json.loads(layout.metrics(RUN, "knn", "digits").read_text())["metrics"]
    summary = json.loads(layout.metrics_summary(RUN).read_text())
    assert summary["retrieval"]["heldout_pairs"]["skipped"].startswith("not applicable")


def test_text_methods_are_not_image_only(project):
    cfg, _ = project
    cfg._runs = {RUN: ({"method": "protoclip"}, "<test>")}
    assert image_only_method(cfg, RUN) is None
    cfg._runs = {}
    assert image_only_method(cfg, RUN) is None  # not a configured run: evaluate everything
