"""bench/gpu_suite.sh stays runnable: without a GPU it says so in one line and exits 0, and its CPU smoke runs every
bench of the suite at tiny sizes (the step bench's data-wait rows and the episode bench on JPEG shards in img2dataset's
layout, k-means, the decode bench) and validates the GPU smoke overlay against config/paper.yaml."""
from __future__ import annotations

import os
import re
import subprocess

from testkit import REPO


def suite(*args: str, **env: str) -> subprocess.CompletedProcess:
    full = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", **env)  # no GPU, whatever the machine
    return subprocess.run(["bash", str(REPO / "bench" / "gpu_suite.sh"), *args], cwd=REPO, env=full,
                          capture_output=True, text=True, timeout=600)


def test_without_a_gpu_one_line_and_exit_0():
    done = suite()
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["gpu_suite: no GPU here (nvidia-smi or torch.cuda.is_available() missing): "
                                        "nothing measured"]
    assert not list((REPO / "bench" / "results").glob("*_cpu_smoke*"))


def test_cpu_smoke_runs_every_bench_at_tiny_size_and_checks_the_smoke_overlay(tmp_path):
    done = suite("--cpu-smoke", GPU_SUITE_OUT=str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "gpu_smoke: overlay valid" in done.stdout and "CPU smoke passed" in done.stdout
    assert len(list((tmp_path / "shards").glob("*.tar"))) == 2  # the tiny shards, in img2dataset's layout
    text = (tmp_path / "decode_cpu_smoke.txt").read_text()
    rates = dict(re.findall(r"^  (ours \(protoclip\)|open_clip_train) +([0-9.]+) ", text, re.M))
    assert set(rates) == {"ours (protoclip)", "open_clip_train"} and all(float(v) > 0 for v in rates.values()), text
    assert re.search(r"^ratio ours \(protoclip\) / open_clip_train per round: [0-9.]+; min [0-9.]+x, median", text,
                     re.M), text
    assert "decode_jpeg pixels equal to PIL's: 8/8 images" in text
    step = (tmp_path / "step_cpu_smoke.txt").read_text()  # the data-wait rows: one per place of the augmentation
    waits = re.findall(r"^ours reading JPEG shards with 1 workers, (.+): (\d+)% of step time waiting", step, re.M)
    assert [w for w, _ in waits] == ["colour in the workers", "colour on the device", "decoded on the device"], step
    assert "open_clip" not in step  # --skip-open-clip
    episode = (tmp_path / "episode_cpu_smoke.txt").read_text()
    ratios = re.findall(r"^ProtoCLIP / CLIP time per episode \(augment_on: (\w+)\): x([0-9.]+)", episode, re.M)
    assert [on for on, _ in ratios] == ["workers", "device"] and all(float(r) > 0 for _, r in ratios), episode
    assert "data: shards, 1 workers" in episode
    kmeans = (tmp_path / "kmeans_cpu_smoke.txt").read_text()
    assert re.search(r"^torch cpu +[0-9.]+ ", kmeans, re.M), kmeans
