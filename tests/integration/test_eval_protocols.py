"""`run_evaluate` scores a run under the linear protocol the config names for it, and says so (metrics file,
MLflow params); a mistyped run pattern stops before anything is scored."""
from __future__ import annotations

import json
from contextlib import contextmanager

import pytest

from protoclip.errors import ConfigError
from protoclip.evaluate.stage import run_evaluate
from testkit.evaluation import RUN, RecordingTracker
from testkit.training import one_thread

_threads = pytest.fixture(autouse=True)(one_thread)


class ParamsTracker(RecordingTracker):
    def __init__(self):
        super().__init__()
        self.params: dict = {}

    def log_params(self, params):
        self.params.update(params)


def _evaluate(cfg, monkeypatch) -> ParamsTracker:
    tracker = ParamsTracker()

    @contextmanager
    def fake_evaluation_run(cfg_, run, model_sha256, targets=None):
        yield tracker

    monkeypatch.setattr("protoclip.evaluate.stage.evaluation_run", fake_evaluation_run)
    run_evaluate(cfg, RUN, tasks=["linear"], datasets=["digits"])
    return tracker


def test_a_run_pattern_picks_its_papers_protocol(project, monkeypatch):
    cfg, layout = project
    cfg.evaluate.linear_protocol_runs = {"ti*": "mocov3"}
    tracker = _evaluate(cfg, monkeypatch)
    m = json.loads(layout.metrics(RUN, "linear", "digits").read_text())["metrics"]
    assert m["protocol"] == "mocov3" and m["solver"] == "sgd" and m["lr"] == 1.0 and "C" not in m
    assert tracker.params["evaluate"]["linear_protocol"] == "mocov3"


def test_the_default_protocol_is_protoclips(project, monkeypatch):
    cfg, layout = project
    tracker = _evaluate(cfg, monkeypatch)
    m = json.loads(layout.metrics(RUN, "linear", "digits").read_text())["metrics"]
    assert m["protocol"] == "protoclip" and m["solver"] == "lbfgs" and "C" in m
    assert tracker.params["evaluate"]["linear_protocol"] == "protoclip"


def test_a_pattern_matching_no_run_stops(project):
    cfg, _ = project
    cfg.evaluate.linear_protocol_runs = {"pcl_*": "pcl"}
    with pytest.raises(ConfigError, match=r"pattern 'pcl_\*' matches no run"):
        run_evaluate(cfg, RUN, tasks=["linear"], datasets=["digits"])
