"""`run_evaluate` scores a run under the linear protocol the config names for it, and says so (metrics file,
MLflow params); a pattern that matches no run is a warning, a run that two match an error."""
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
    def fake_evaluation_run(paths, run, model_sha256, targets):
        yield tracker

    monkeypatch.setattr("protoclip.evaluate.stage.evaluation_run", fake_evaluation_run)
    run_evaluate(cfg, RUN, tasks=["linear"], datasets=["digits"])
    return tracker


def test_a_run_pattern_picks_its_papers_protocol(project, monkeypatch):
    cfg, layout = project
    cfg.evaluate.linear.protocol_runs = {"ti*": "mocov3"}
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


def test_a_pattern_matching_no_run_is_a_warning_and_two_matching_one_run_stop(project, monkeypatch, caplog):
    """An overlay may leave out the experiment files of a pattern's runs (the paper miniature keeps ProtoCLIP's):
    a warning; a run two patterns match has no protocol to pick: an error before anything is scored."""
    import logging

    cfg, layout = project
    cfg.evaluate.linear.protocol_runs = {"pcl_*": "pcl"}
    with caplog.at_level(logging.WARNING, logger="protoclip.evaluate.stage"):
        _evaluate(cfg, monkeypatch)
    assert "evaluate.linear.protocol_runs: pcl_* match no run" in caplog.text
    assert json.loads(layout.metrics(RUN, "linear", "digits").read_text())["metrics"]["protocol"] == "protoclip"
    cfg.evaluate.linear.protocol_runs = {"ti*": "pcl", "*ny": "nclip"}
    with pytest.raises(ConfigError, match="matches several evaluate.linear.protocol_runs patterns"):
        run_evaluate(cfg, RUN, tasks=["linear"], datasets=["digits"])
