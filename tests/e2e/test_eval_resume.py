"""A killed evaluation resumes its feature extraction: `protoclip evaluate` runs in a subprocess, is SIGKILLed while
it extracts (after a few chunks of its test split are on disk), and its output folder is deleted as Snakemake
deletes a failed job's outputs. The rerun keeps the chunks it finds, encodes the rest, and writes the same features,
bit for bit, as an uninterrupted run (the same batches through the same model on the same machine). That the kept
chunks are not encoded again is shown by a marker: a kept chunk rewritten with a constant comes out in the features.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
import yaml

from protoclip.project import load_config
from protoclip.evaluate.resumable import CHUNK
from protoclip.files.layout import Layout
from testkit.processes import project_env, wait_for

RUN, SET = "r", "digits"
BATCH, CHUNK_BATCHES = 4, 2  # 8 images a chunk
N_TEST = N_TRAIN = 200  # 25 chunks each


def _project(tmp_path: Path) -> tuple[Path, Layout]:
    from protoclip.models import build_model, save_model

    cfg_path = tmp_path / "config.yaml"
    cfg_path.write_text(yaml.safe_dump({
        "paths": {"data_dir": str(tmp_path / "data"), "results_dir": str(tmp_path / "results"),
                  "mlflow_uri": f"sqlite:///{tmp_path}/mlflow.db"},
        "runs": {RUN: {"method": "clip"}},
        "evaluate": {"device": "cpu", "batch_size": BATCH, "extract_chunk_batches": CHUNK_BATCHES,
                     "datasets": {SET: {"kind": "offline", "tasks": ["knn"]}}},
    }))
    layout = Layout.from_config(load_config(cfg_path))
    rng = np.random.default_rng(0)
    n = N_TEST + N_TRAIN
    labels = np.arange(n) % 4
    images = np.clip(labels[:, None, None, None] * 50 + rng.integers(0, 30, (n, 16, 16, 3)), 0, 255)
    layout.eval_set(SET).parent.mkdir(parents=True, exist_ok=True)
    np.savez(layout.eval_set(SET), images=images.astype(np.uint8), labels=labels,
             split=np.where(np.arange(n) % 2 == 0, "test", "train"), classnames=np.array(list("abcd")))
    torch.manual_seed(0)
    save_model(layout.model(RUN), build_model("tiny-rn", head_hidden=16, head_out=8), {"method": "clip"})
    return cfg_path, layout


def _evaluate(cfg_path: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "protoclip.cli", "evaluate", "--config", str(cfg_path), "--run",
                             RUN, "--dataset", SET, "--task", "knn"], env=project_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return err


def _features(layout: Layout) -> dict[str, np.ndarray]:
    with np.load(layout.features(RUN, SET), allow_pickle=False) as z:
        return {k: z[k] for k in z.files if k != "meta_json"}


def test_a_killed_evaluation_resumes_its_extraction_and_gives_the_same_features(tmp_path):
    cfg_path, layout = _project(tmp_path)
    work = layout.eval_progress(RUN, SET)
    _finish(_evaluate(cfg_path))  # uninterrupted
    reference = _features(layout)
    assert reference["test_z"].shape[0] == N_TEST and reference["train_z"].shape[0] == N_TRAIN
    assert not work.exists()  # the chunks are removed once the feature file is written

    layout.features(RUN, SET).unlink()
    shutil.rmtree(layout.eval_dir(RUN, SET))
    proc = _evaluate(cfg_path)

    def three_chunks() -> bool:
        assert proc.poll() is None, "the evaluation ended before it could be killed"
        return len(list((work / "test").glob("chunk_*.npz"))) >= 3

    wait_for(three_chunks, "3 chunks of the test split", timeout=240, poll=0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    kept = len(list((work / "test").glob("chunk_*.npz")))
    assert 3 <= kept < N_TEST // (BATCH * CHUNK_BATCHES) and not layout.features(RUN, SET).exists()
    shutil.rmtree(layout.eval_dir(RUN, SET), ignore_errors=True)  # what Snakemake does to a failed job's output
    snapshot = tmp_path / "snapshot"
    shutil.copytree(work, snapshot)

    err = _finish(_evaluate(cfg_path))
    done = kept * BATCH * CHUNK_BATCHES
    assert f"{SET} test: resumed: {done} of {N_TEST} images were extracted before ({kept} of 25 chunks" in err
    resumed = _features(layout)
    assert sorted(resumed) == sorted(reference)
    for k in reference:  # the same computation repeated: bit for bit
        np.testing.assert_array_equal(resumed[k], reference[k], err_msg=k)
    assert not work.exists() and layout.eval_tasks(RUN, SET).is_file()

    # the kept chunks are read, not encoded again: a marker written into one comes out in the features
    layout.features(RUN, SET).unlink()
    shutil.rmtree(layout.eval_dir(RUN, SET))
    shutil.copytree(snapshot, work)
    first = work / "test" / CHUNK.format(0)
    with np.load(first) as z:
        marked = {k: z[k] for k in z.files}
    marked["z"] = np.full_like(marked["z"], 7.0)
    with open(first, "wb") as f:
        np.savez(f, **marked)
    _finish(_evaluate(cfg_path))
    again = _features(layout)
    per_chunk = BATCH * CHUNK_BATCHES
    assert (again["test_z"][:per_chunk] == 7.0).all()
    np.testing.assert_array_equal(again["test_z"][per_chunk:], reference["test_z"][per_chunk:])
    np.testing.assert_array_equal(again["train_z"], reference["train_z"])
