"""kill -9 inside `evaluate`: the half-written evaluation folder is never read as complete.

A forked child runs the real stage and SIGKILLs itself at a chosen point: inside the atomic write of a task's
metrics file (so the temp file of a killed write is left, as a real kill leaves it), after an earlier task's
file was written, or while re-evaluating a folder that a previous run had completed. Then:

* ``collect`` (and the report's readers) refuse the folder with one line naming it, instead of summarising
  the tasks that happened to finish as the whole evaluation;
* a 0-byte or corrupt metrics file in a complete folder is one line naming the file, not a JSON traceback;
* the next ``evaluate`` removes the killed write's temp file and completes the folder.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from protoclip.files import records
from protoclip.cli import main
from protoclip.project import load_config
from protoclip.errors import UserError
from protoclip.files.layout import Layout

RUN = "r"
TASKS = ["knn", "clustering"]  # the cheapest two: the kill lands in the second


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One project evaluated once (its feature cache then makes every evaluate below take about a second)."""
    import protoclip.tracking
    from protoclip.evaluate.stage import run_evaluate
    from protoclip.models import build_model, save_model

    tmp_path = tmp_path_factory.mktemp("kill")
    mp = pytest.MonkeyPatch()
    mp.setattr(protoclip.tracking, "_mlflow", lambda cfg: None)  # files only: MLflow is not tested here
    torch.set_num_threads(1)
    cfg_path = tmp_path / "config.yaml"
    cfg_path.write_text(yaml.safe_dump({
        "paths": {"data_dir": str(tmp_path / "data"), "results_dir": str(tmp_path / "results")},
        "runs": {RUN: {"method": "clip"}},
        "evaluate": {"device": "cpu", "batch_size": 8, "datasets": {"digits": {"kind": "offline", "tasks": TASKS}}},
    }))
    cfg = load_config(cfg_path)
    layout = Layout.from_config(cfg)
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), 4)
    images = np.clip(labels[:, None, None, None] * 50 + rng.integers(0, 30, (16, 16, 16, 3)), 0, 255)
    layout.eval_set("digits").parent.mkdir(parents=True, exist_ok=True)
    np.savez(layout.eval_set("digits"), images=images.astype(np.uint8), labels=labels,
             split=np.where(np.arange(16) % 2 == 0, "test", "train"), classnames=np.array(list("abcd")))
    torch.manual_seed(0)
    save_model(layout.model(RUN), build_model("tiny-rn", head_hidden=16, head_out=8), {"method": "clip"})
    run_evaluate(cfg, RUN, datasets=["digits"])
    pristine = tmp_path / "pristine"
    shutil.copytree(layout.eval_dir(RUN, "digits"), pristine)
    yield cfg_path, cfg, layout, pristine
    mp.undo()


@pytest.fixture
def project(built):
    """The evaluation folder as a fresh job finds it (empty; the feature cache beside it) ..."""
    cfg_path, cfg, layout, pristine = built
    folder = layout.eval_dir(RUN, "digits")
    shutil.rmtree(folder)
    folder.mkdir()
    assert layout.features(RUN, "digits").is_file()  # outside the job's folder: a rerun still finds it
    layout.metrics_summary(RUN).unlink(missing_ok=True)
    return cfg_path, cfg, layout


@pytest.fixture
def completed(built):
    """... or as a complete evaluation left it."""
    cfg_path, cfg, layout, pristine = built
    shutil.rmtree(layout.eval_dir(RUN, "digits"))
    shutil.copytree(pristine, layout.eval_dir(RUN, "digits"))
    layout.metrics_summary(RUN).unlink(missing_ok=True)
    return cfg_path, cfg, layout


def evaluate_killed_at(cfg, kill_task: str, inside_write: bool) -> None:
    """Run evaluate in a forked child that SIGKILLs itself when it comes to write ``kill_task``'s metrics file:
    after the file's temp was written, before the rename (``inside_write``: the temp file is left behind), or
    before the write starts. ``atomic_path`` is what every writer of the stage goes through."""
    import protoclip.files.atomic as atomic
    import protoclip.evaluate.stage as stage

    pid = os.fork()
    if pid == 0:  # child: never returns
        try:
            torch.set_num_threads(1)
            real = atomic.atomic_path

            @contextmanager
            def atomic_path(path):
                if Path(path).name != f"{kill_task}.json":
                    with real(path) as tmp:
                        yield tmp
                    return
                if not inside_write:
                    os.kill(os.getpid(), signal.SIGKILL)
                with real(path) as tmp:
                    yield tmp
                    os.kill(os.getpid(), signal.SIGKILL)  # the temp is written; the rename never happens

            atomic.atomic_path = atomic_path
            stage.run_evaluate(cfg, RUN, datasets=["digits"])
        finally:
            os._exit(3)  # not killed: the test fails on the status below
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status


def collect_fails_naming(cfg_path: Path, what: Path, capsys) -> None:
    assert main(["collect", "--config", str(cfg_path), "--run", RUN]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(what) in err and "Traceback" not in err, err


@pytest.mark.parametrize("inside_write", [True, False], ids=["in-atomic-write", "between-files"])
def test_killed_evaluation_is_not_collected_and_rerun_completes(project, capsys, inside_write):
    from protoclip.evaluate.stage import run_evaluate

    cfg_path, cfg, layout = project
    folder = layout.eval_dir(RUN, "digits")
    evaluate_killed_at(cfg, "clustering", inside_write)
    assert layout.metrics(RUN, "knn", "digits").is_file()  # the first task finished before the kill
    temps = [p for p in folder.iterdir() if p.name.startswith(".") and ".tmp" in p.name]
    assert bool(temps) == inside_write
    collect_fails_naming(cfg_path, folder, capsys)
    assert not layout.metrics_summary(RUN).exists()

    run_evaluate(cfg, RUN, datasets=["digits"])  # the rerun cleans up and completes
    assert not [p for p in folder.iterdir() if p.name.startswith(".") and ".tmp" in p.name]
    assert main(["collect", "--config", str(cfg_path), "--run", RUN]) == 0
    summary = json.loads(layout.metrics_summary(RUN).read_text())
    assert set(summary) == set(TASKS) and all("digits" in summary[t] for t in TASKS)


def test_kill_while_reevaluating_a_complete_folder_is_not_trusted(completed, capsys):
    """The previous run's completion must not vouch for a rerun that was killed half-way."""
    cfg_path, cfg, layout = completed
    assert main(["collect", "--config", str(cfg_path), "--run", RUN]) == 0
    capsys.readouterr()
    evaluate_killed_at(cfg, "clustering", inside_write=False)
    collect_fails_naming(cfg_path, layout.eval_dir(RUN, "digits"), capsys)


@pytest.mark.parametrize("content", [b"", b'{"run": "r", "task": "knn", "metr', b"\xff\xfe\x00garbage", b"[1, 2]"],
                         ids=["empty", "cut", "binary", "not-a-record"])
def test_broken_metrics_file_is_one_line_naming_it(completed, capsys, content):
    cfg_path, cfg, layout = completed
    broken = layout.metrics(RUN, "knn", "digits")
    broken.write_bytes(content)
    collect_fails_naming(cfg_path, broken, capsys)
    assert main(["report", "--config", str(cfg_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(broken) in err and "Traceback" not in err, err
    with pytest.raises(UserError):
        from protoclip.report.tables import collect_metrics
        from protoclip.report.values import Results

        collect_metrics(Results(cfg), [RUN])


def test_evaluating_some_tasks_keeps_the_others_complete(completed):
    """`evaluate --task knn` on a complete folder: the new marker also vouches for the earlier clustering
    file (intact, same model), so the folder stays complete with both."""
    from protoclip.evaluate.stage import run_evaluate

    cfg_path, cfg, layout = completed
    run_evaluate(cfg, RUN, tasks=["knn"], datasets=["digits"])
    assert main(["collect", "--config", str(cfg_path), "--run", RUN]) == 0
    assert set(json.loads(layout.metrics_summary(RUN).read_text())) == set(TASKS)
    marker = json.loads(layout.eval_tasks(RUN, "digits").read_text())
    # knn's and clustering's per-example results too (hits; k-means assignments)
    assert marker["tasks"] == {"knn": "ran"} and set(marker["complete_files"]) == {f"{t}.json" for t in TASKS} | {
        "knn.examples.npz", "clustering.examples.npz"}
    # then `--task clustering`: knn's metrics file and its per-example results stay vouched for (same model)
    run_evaluate(cfg, RUN, tasks=["clustering"], datasets=["digits"])
    marker = json.loads(layout.eval_tasks(RUN, "digits").read_text())
    assert set(marker["complete_files"]) == {"knn.json", "clustering.json", "knn.examples.npz",
                                             "clustering.examples.npz"}
    assert records.read_examples(layout, RUN, "knn", "digits") is not None
