"""Every stage removes, when it starts, the temp files that a kill -9 inside its atomic writes left in its output
folders (they ended up inside DVC-tracked outputs), and only its own: a job that shares a folder with
other jobs (one teacher job per teacher in ``data/teacher/``) leaves theirs alone.

The leftovers are made for real: a forked child enters ``atomic_path`` on the output, writes half of it and
SIGKILLs itself. The stage is then started and stopped right after its clean-up (a sentinel exception from its
next step; collect, with nothing to collect, runs whole), so each test needs no trained model.
"""
from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import yaml

from protoclip.files.atomic import TEMP_NAME, atomic_path
from protoclip.project import load_config
from protoclip.files.layout import Layout


class Stop(Exception):
    """Raised by the step after a stage's clean-up."""


def killed_write(path: Path) -> Path:
    """The temp file a process killed inside ``atomic_path(path)`` leaves."""
    before = set(path.parent.glob(".*")) if path.parent.is_dir() else set()
    pid = os.fork()
    if pid == 0:
        try:
            with atomic_path(path) as tmp:
                tmp.write_bytes(b"half a file")
                os.kill(os.getpid(), signal.SIGKILL)
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status), status
    (left,) = set(path.parent.glob(".*")) - before
    assert TEMP_NAME.fullmatch(left.name) and not path.exists()
    return left


def stop(*_a, **_k):
    raise Stop


@pytest.fixture
def cfg(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"paths": {"data_dir": str(tmp_path / "data"),
                                              "results_dir": str(tmp_path / "results")},
                                    "runs": {"r": {"method": "clip"}}}))
    return load_config(path)


def test_collect_removes_a_killed_metrics_summary_write(cfg):
    from protoclip.evaluate.collect import run_collect

    layout = Layout.from_config(cfg)
    left = killed_write(layout.metrics_summary("r"))
    run_collect(cfg, "r")  # nothing evaluated: an empty summary, written for real
    assert not left.exists() and layout.metrics_summary("r").is_file()


def test_report_removes_killed_writes_in_its_folders(cfg, monkeypatch):
    import protoclip.report.stage as stage

    layout = Layout.from_config(cfg)
    left = [killed_write(layout.tables / "zeroshot.csv"), killed_write(layout.figures / "fig.png")]
    monkeypatch.setattr(stage, "collect_metrics", stop)
    with pytest.raises(Stop):
        stage.run_report(cfg)
    assert not any(p.exists() for p in left)


def test_teacher_removes_its_own_killed_writes_only(cfg, monkeypatch):
    import protoclip.teacher.cache as cache
    from protoclip.teacher.stage import run_teacher

    layout = Layout.from_config(cfg)
    out = layout.teacher_features(cfg.teacher.name)
    mine = [killed_write(out), killed_write(out.with_suffix(".json"))]
    other = killed_write(layout.teacher_features("another-teacher"))  # a job running beside this one
    monkeypatch.setattr(cache, "train_captions", stop)
    with pytest.raises(Stop):
        run_teacher(cfg)
    assert not any(p.exists() for p in mine) and other.exists()


def test_toy_removes_killed_writes_of_its_outputs(cfg, monkeypatch):
    import protoclip.toy.pauc_nemd as toy
    from protoclip.toy.stage import run_toy_nemd

    layout = Layout.from_config(cfg)
    left = [killed_write(p) for p in layout.toy_files().values()]
    monkeypatch.setattr(toy, "make_blobs3d", stop)
    with pytest.raises(Stop):
        run_toy_nemd(cfg, layout)
    assert not any(p.exists() for p in left)
