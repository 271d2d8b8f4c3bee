"""GPU slot allocator and launcher (protoclip.jobs.gpu_slots, protoclip.jobs.launch) on fake GPU ids: no GPU needed.

Slots are flock()ed lock files; these tests take them in this process and in child processes, kill holders
with SIGKILL and check who holds what by probing the locks (try_acquire), as a waiting job would.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from protoclip.project import load_config
from protoclip.errors import ConfigError
from protoclip.jobs.gpu_slots import GpuSlotsConfig, SlotError, acquire, configured_ids, try_acquire, visible_ids
from protoclip.jobs.launch import evaluate_gpus, place, rank_threads, teacher_gpus, torchrun_args
from testkit import REPO
from testkit.processes import wait_for


def slots(tmp_path, ids=(0, 1, 2, 3), **kw) -> GpuSlotsConfig:
    return GpuSlotsConfig(ids=list(ids), lock_dir=str(tmp_path / "locks"), poll_s=0.05, **kw)


def free_ids(cfg: GpuSlotsConfig) -> list[str]:
    """GPUs with a free slot right now (probed one at a time, released at once)."""
    out = []
    for gpu in configured_ids(cfg):
        held = try_acquire(cfg, 1, [gpu])
        if held is not None:
            out.append(gpu)
            held.release()
    return out


def test_k_gpu_jobs_get_distinct_ids_and_release_frees_them(tmp_path):
    cfg = slots(tmp_path)
    a, b = acquire(cfg, 2), acquire(cfg, 1)
    assert a.ids == ["0", "1"] and b.ids == ["2"] and a.env_value() == "0,1"
    assert try_acquire(cfg, 2, configured_ids(cfg)) is None  # one GPU left, a 2-GPU job must wait
    c = try_acquire(cfg, 1, configured_ids(cfg))
    assert c.ids == ["3"] and free_ids(cfg) == []
    a.release()
    assert free_ids(cfg) == ["0", "1"]
    with pytest.raises(SlotError, match="asks for 5 GPU"):
        acquire(cfg, 5)


def test_jobs_per_gpu_spreads_and_never_puts_two_ranks_on_one_gpu(tmp_path):
    cfg = slots(tmp_path, ids=(0, 1), jobs_per_gpu=2)
    held = [acquire(cfg, 1) for _ in range(3)]
    assert [h.ids for h in held] == [["0"], ["1"], ["0"]]  # the GPU with the most free slots first
    # one free slot left (GPU 1): a 2-GPU job needs slots on 2 distinct GPUs, takes nothing and waits
    assert try_acquire(cfg, 2, ["0", "1"]) is None
    assert try_acquire(cfg, 1, ["0", "1"]).ids == ["1"]  # ... and left that slot free


def test_waiting_job_gets_the_slot_when_the_holder_ends_and_times_out_otherwise(tmp_path):
    cfg = slots(tmp_path, ids=(7,), timeout_s=0.3)
    first = acquire(cfg, 1)
    lines = []
    with pytest.raises(SlotError, match="after 0.3 s"):
        acquire(cfg, 1, log=lines.append)
    assert lines and "waiting for 1 free GPU slot(s) of 7" in lines[0]
    first.release()
    assert acquire(cfg, 1).ids == ["7"]


def _launch(tmp_path, cfg_text: str, gpus: int, command: str) -> subprocess.Popen:
    conf = tmp_path / "c.yaml"
    conf.write_text(cfg_text)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return subprocess.Popen([sys.executable, "-m", "protoclip.cli", "launch", "--config", str(conf), "--gpus",
                             str(gpus), "--", "bash", "-c", command], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _written(path: Path, timeout: float = 60.0) -> str:
    """``path``'s text once a whole line is in it."""
    return wait_for(lambda: path.exists() and path.read_text().endswith("\n") and path.read_text(), f"{path}",
                    timeout=timeout)


def test_sigkill_of_the_job_frees_its_slots_but_not_while_a_child_lives(tmp_path):
    """The launcher execs the command with the lock files open: the slots belong to the job's process tree."""
    cfg = slots(tmp_path)
    text = f"gpus: {{ids: [0, 1, 2, 3], lock_dir: {cfg.lock_dir}, poll_s: 0.05}}\n"
    # the job's shell starts a child that inherits the locks, then reports both pids and waits
    job = _launch(tmp_path, text, 2, "sleep 60 & echo $CUDA_VISIBLE_DEVICES $$ $! > job.txt; wait")
    cvd, shell_pid, child_pid = _written(tmp_path / "job.txt").split()
    assert cvd == "0,1" and int(shell_pid) == job.pid  # exec: the command is the launcher's own process
    assert free_ids(cfg) == ["2", "3"]
    os.kill(int(shell_pid), signal.SIGKILL)
    job.wait(timeout=30)
    assert free_ids(cfg) == ["2", "3"]  # the child still runs on GPUs 0, 1: still held
    os.kill(int(child_pid), signal.SIGKILL)
    end = time.monotonic() + 10
    while free_ids(cfg) != ["0", "1", "2", "3"] and time.monotonic() < end:
        time.sleep(0.05)
    assert free_ids(cfg) == ["0", "1", "2", "3"]


def test_cpu_job_sees_no_gpu_and_a_job_asking_too_much_fails_in_one_line(tmp_path):
    text = f"gpus: {{ids: [0, 1], lock_dir: {tmp_path / 'locks'}}}\n"
    job = _launch(tmp_path, text, 0, 'echo "[${CUDA_VISIBLE_DEVICES-unset}]"')
    out, _ = job.communicate(timeout=60)
    assert job.returncode == 0 and out.strip() == "[]"
    job = _launch(tmp_path, text, 3, "true")
    _, err = job.communicate(timeout=60)
    assert job.returncode == 2 and err.strip().splitlines() == [
        "protoclip launch: GPU placement: a job asks for 3 GPU(s) but gpus.ids gives 2 (0, 1)"]


def test_visible_ids_and_slurm_placement(tmp_path):
    assert visible_ids({"CUDA_VISIBLE_DEVICES": "2, 5"}) == ["2", "5"]
    assert visible_ids({"CUDA_VISIBLE_DEVICES": ""}) == []
    cfg = GpuSlotsConfig(lock_dir=str(tmp_path / "locks"))  # ids: all, policy auto
    assert configured_ids(cfg, {"CUDA_VISIBLE_DEVICES": "GPU-a1,GPU-b2"}) == ["GPU-a1", "GPU-b2"]
    # a job SLURM gave GPUs 4, 6 takes both, its locks kept apart from other SLURM jobs'
    env = {"SLURM_JOB_ID": "42", "CUDA_VISIBLE_DEVICES": "4,6"}
    p = place(cfg, 2, ranks=2, env=env)
    assert (p.visible, p.ranks, p.held.ids) == ("4,6", 2, ["4", "6"])
    assert (tmp_path / "locks" / "slurm-job-42" / "gpu4.slot0.lock").exists()
    p.held.release()
    # snakemake inside an allocation (salloc --gpus=2): concurrent jobs get disjoint ids of it, not all the first
    first = place(cfg, 1, env=(e1 := dict(env)))
    second = place(cfg, 1, env=(e2 := dict(env)))
    assert (e1["CUDA_VISIBLE_DEVICES"], e2["CUDA_VISIBLE_DEVICES"]) == ("4", "6")
    # another allocation that sees the same ids (e.g. cgroup-renumbered 0..k-1) does not wait for this one
    other = place(cfg, 2, env={"SLURM_JOB_ID": "43", "CUDA_VISIBLE_DEVICES": "4,6"})
    assert other.held.ids == ["4", "6"]
    for held in (first, second, other):
        held.held.release()
    with pytest.raises(SlotError, match="asks for 2 GPU.*gives 1"):
        place(cfg, 2, env={"SLURM_JOB_ID": "42", "CUDA_VISIBLE_DEVICES": "3"})
    # policy inherit steps aside: the first k devices of the allocation, no lock file
    inherit = GpuSlotsConfig(policy="inherit", lock_dir=str(tmp_path / "inherit-locks"))
    env = {"SLURM_JOB_ID": "42", "CUDA_VISIBLE_DEVICES": "4,6"}
    p = place(inherit, 2, ranks=2, env=env)
    assert (p.visible, p.ranks, p.held) == ("4,6", 2, None) and not (tmp_path / "inherit-locks").exists()
    with pytest.raises(SlotError, match="asks for 2 GPU.*shows 1"):
        place(inherit, 2, env={"SLURM_JOB_ID": "42", "CUDA_VISIBLE_DEVICES": "3"})
    # policy slots allocates in lock_dir itself, SLURM or not
    env = {"SLURM_JOB_ID": "42", "CUDA_VISIBLE_DEVICES": "4,6"}
    p = place(GpuSlotsConfig(policy="slots", lock_dir=str(tmp_path / "locks")), 1, env=env)
    assert p.visible == "4" and env["CUDA_VISIBLE_DEVICES"] == "4" and p.held.ids == ["4"]
    assert (tmp_path / "locks" / "gpu4.slot0.lock").exists()
    # a torchrun rank is not placed again; a CPU job gets no GPU
    env = {"LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "0,1"}
    assert place(cfg, 2, ranks=2, env=env).ranks == 1 and env["CUDA_VISIBLE_DEVICES"] == "0,1"
    env = {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert place(cfg, 0, env=env).visible == "" and env["CUDA_VISIBLE_DEVICES"] == ""
    assert torchrun_args(4) == ["--standalone", "--nproc_per_node=4", "-m", "protoclip.cli"]


def _config(tmp_path, text: str):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return load_config(path)


def test_gpu_config_is_validated_with_the_key_named(tmp_path):
    with pytest.raises(ConfigError, match="gpus.ids must be 'all' or a list"):
        _config(tmp_path, "gpus: {ids: '0,1'}\n")
    with pytest.raises(ConfigError, match="jobs_per_gpu must be >= 1"):
        _config(tmp_path, "gpus: {jobs_per_gpu: 0}\n")
    with pytest.raises(ConfigError, match="unknown key 'gpus.idz'"):
        _config(tmp_path, "gpus: {idz: [0]}\n")
    cfg = _config(tmp_path, "gpus: {ids: [0, 3], jobs_per_gpu: 2}\nruns: {a: {gpu: 4}, b: {gpu: true}, c: {}}\n")
    assert configured_ids(cfg.gpus) == ["0", "3"] and cfg.gpus.jobs_per_gpu == 2
    assert [cfg.run(r).n_gpus() for r in "abc"] == [4, 1, 0]
    assert [evaluate_gpus(cfg, r) for r in "abc"] == [1, 1, 0]  # evaluation is one process
    with pytest.raises(ConfigError, match="gpu must be true, false or a number"):
        _config(tmp_path, "runs: {a: {gpu: -1}}\n").run("a")
    with pytest.raises(ConfigError, match="batch_size 510 .* must be a multiple of gpu: 4"):
        _config(tmp_path, "runs: {a: {gpu: 4, batch_size: 510}}\n").run("a")
    with pytest.raises(ConfigError, match="device 'cuda' needs `gpu: true`"):
        _config(tmp_path, "runs: {a: {device: cuda}}\n").run("a")
    # one named GPU for k ranks would put every rank on it (NCCL refuses duplicate GPUs): stopped at load
    with pytest.raises(ConfigError, match="device 'cuda:1' names one GPU, but gpu: 2 runs one rank per GPU"):
        _config(tmp_path, "runs: {a: {device: 'cuda:1', gpu: 2}}\n").run("a")
    assert _config(tmp_path, "runs: {a: {device: 'cuda:1', gpu: 1}, b: {device: cuda, gpu: 2}}\n").run("b").n_gpus() == 2
    # the teacher is a GPU job in a project that trains on GPUs (or when its device says cuda)
    assert teacher_gpus(cfg) == 1
    assert teacher_gpus(_config(tmp_path, "runs: {c: {}}\n")) == 0
    assert teacher_gpus(_config(tmp_path, "teacher: {device: cuda}\nruns: {c: {}}\n")) == 1


def test_each_rank_of_a_k_gpu_job_gets_its_share_of_the_threads():
    # Snakemake exports the job's threads; torchrun's k ranks get threads / k each (at least 1), not k x threads
    env = {"OMP_NUM_THREADS": "8", "MKL_NUM_THREADS": "8", "PATH": "/bin"}
    assert rank_threads(env, 2) == {"OMP_NUM_THREADS": "4", "MKL_NUM_THREADS": "4"}
    assert rank_threads(env, 3)["OMP_NUM_THREADS"] == "2" and rank_threads(env, 16)["OMP_NUM_THREADS"] == "1"
    assert rank_threads({}, 1) == {"OMP_NUM_THREADS": str(len(os.sched_getaffinity(0)))}  # unset: this process's CPUs
