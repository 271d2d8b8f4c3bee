"""A train job killed under Snakemake loses nothing and never runs twice.

One tiny project (36 random PNGs, CLIP runs of 9 episodes with a checkpoint after each) run with the real
Snakefile and Snakemake's local executor. Snakemake trains three runs at once; each trainer is frozen (SIGSTOP,
so the kills land mid-run on any machine) once it has logged 3 episodes; then one process of each job is
SIGKILLed: the trainer, the job's shell, Snakemake itself. Then:

* no process of the jobs is left (a trainer never outlives its job);
* ``snakemake --unlock`` and ``snakemake`` again resume each run from its checkpoint;
* each final ``train_log.jsonl`` holds every step and episode exactly once and equals the uninterrupted run's
  (``time/*`` fields and the one ``resume`` record aside), and the weights are the uninterrupted run's.

Two trainers started by hand on one run: the second waits, in one line naming the first's pid and host, and
takes over (resuming) when the first is killed.

About 2-3 minutes on 2 cores: every Snakemake start builds the project's DAG, every trainer imports torch.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from protoclip.files.layout import Layout
from protoclip.files.records import read_train_log
from testkit import REPO
from testkit.processes import alive, project_env, wait_for
from testkit.tmpdirs import module_folder
from testkit.training import tiny_project, training_records

RUN = {"method": "clip", "teacher": None, "data": ["offline"], "model": "tiny-rn", "image_size": 32,
       "head_hidden": 32, "head_out": 16, "epochs": 3.0, "episode_size": 12, "batch_size": 6,  # 9 episodes x 2 steps
       "warmup_episodes": 1, "lock_image_epoch": None, "num_workers": 0, "device": "cpu",
       "checkpoint_interval_s": 0.0}  # a checkpoint after every episode
RUNS = ("ref", "k_trainer", "k_shell", "k_snakemake", "two")
N_EPISODES, N_STEPS = 9, 18


@pytest.fixture(scope="module")
def root(tmp_path_factory, request) -> Iterator[Path]:
    """The project, and the uninterrupted run ``ref`` trained by the train rule's command (removed after the module
    when its tests passed: ~1.4 GB of runs)."""
    with module_folder(tmp_path_factory, request, "kill") as root:
        tiny_project(root, {"paths": {"mlflow_experiment": "kill"}, "prepare": {"eval_sets": []}, "train": RUN,
                            "runs": {name: {} for name in RUNS}},
                     relative=True, config_name="config/config.yaml", n=36, size=32, captions="numbered")
        done = subprocess.run(train_cmd("ref"), cwd=root, env=project_env(), capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        yield root


def train_cmd(run: str) -> list[str]:
    """The train rule's command (protoclip.dag.stages.train_stage)."""
    return [str(Path(sys.executable).parent / "protoclip"), "train", "--config", "config/config.yaml", "--run", run,
            "--resume"]


def snakemake(root: Path, *args: str) -> subprocess.Popen:
    """Snakemake with the project's Snakefile on ``root``; its output goes to ``proc.log`` (a path)."""
    log = root / f"snakemake_{time.monotonic_ns()}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"),
                                 "--directory", str(root), *args], cwd=root, env=project_env(), stdout=out,
                                stderr=subprocess.STDOUT)
    proc.log = log
    return proc


# --------------------------------------------------------------------------- processes, from /proc
def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return 0


def descendants(pid: int) -> list[int]:
    pids = [int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit()]
    out, frontier = [], [pid]
    while frontier:
        kids = [p for p in pids if parent(p) in frontier]
        out += kids
        frontier = kids
    return out


def is_trainer(pid: int, run: str) -> bool:
    cmd = cmdline(pid)
    return len(cmd) > 2 and cmd[1].endswith("protoclip") and cmd[2] == "train" and run in cmd


def episodes_logged(root: Path, run: str) -> int:
    """Episode records in the run's train_log.jsonl (lines written so far)."""
    path = Layout(root / "data", root / "results").train_log(run)
    try:
        return sum('"kind": "episode"' in line for line in path.read_text().splitlines())
    except OSError:
        return 0


# --------------------------------------------------------------------------- the checks after the rerun
def check_complete(root: Path, run: str) -> None:
    """``run``'s log holds every step and episode once, as ``ref``'s (but for wall clock and its one resume),
    and its weights are ``ref``'s."""
    from protoclip.models import load_model

    layout = Layout(root / "data", root / "results")
    log, ref = read_train_log(layout.train_log(run)), read_train_log(layout.train_log("ref"))
    assert sorted(r["step"] for r in log if r["kind"] == "step") == list(range(N_STEPS))
    assert sorted(r["episode"] for r in log if r["kind"] == "episode") == list(range(N_EPISODES))
    resumes = [r["episode"] for r in log if r["kind"] == "resume"]
    assert len(resumes) == 1 and 2 <= resumes[0] < N_EPISODES, resumes  # killed after 3 episodes were logged
    assert training_records(log) == training_records(ref)
    a, b = load_model(layout.model("ref"))[0].state_dict(), load_model(layout.model(run))[0].state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


VICTIMS = {"k_trainer": "trainer", "k_shell": "shell", "k_snakemake": "snakemake"}  # run -> what is killed


def test_killed_train_jobs_rerun_to_the_whole_log_once(root):
    """The three kills in one Snakemake session (one start instead of three): its three train jobs run at once;
    each trainer is frozen after 3 logged episodes; then the trainer of ``k_trainer`` and the shell of
    ``k_shell`` are killed (Snakemake reports both jobs failed and deletes their outputs), then Snakemake itself
    (``k_snakemake``'s job still running)."""
    targets = [f"results/runs/{run}/model.pt" for run in VICTIMS]
    sm = snakemake(root, "--cores", "3", "--keep-going", *targets)
    trainers: dict[str, int] = {}
    layout = Layout(root / "data", root / "results")

    def freeze_each_after_3_episodes():
        for run in VICTIMS:
            pid = trainers.get(run) or next((p for p in descendants(sm.pid) if is_trainer(p, run)), None)
            if pid and run not in trainers and episodes_logged(root, run) >= 3:
                os.kill(pid, signal.SIGSTOP)
                trainers[run] = pid
        finished = any(layout.model(run).exists() for run in VICTIMS if run not in trainers)
        return len(trainers) == len(VICTIMS) or sm.poll() is not None or finished

    def state() -> str:
        """Where each victim stands, for a failure's message (a timeout on a loaded machine, or a run that ended
        before it was frozen)."""
        runs = ", ".join(f"{run}: {episodes_logged(root, run)} episodes, "
                         f"{'frozen' if run in trainers else 'not frozen'}"
                         f"{', model written' if layout.model(run).exists() else ''}" for run in VICTIMS)
        return f"{runs}; snakemake {'running' if sm.poll() is None else f'exited {sm.returncode}'}; its log ends:\n" \
               + sm.log.read_text()[-2000:]

    try:  # ~1 min alone on 2 cores; the deadline allows for the other end-to-end tests sharing them
        wait_for(freeze_each_after_3_episodes, "3 trainers with 3 episodes each", timeout=600)
        assert len(trainers) == len(VICTIMS), "Snakemake ended, or a victim finished, before all three were frozen"
    except AssertionError as err:  # leave no frozen trainer behind
        message = f"{err}: {state()}"
        for pid in [*descendants(sm.pid), sm.pid]:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        raise AssertionError(message) from None
    assert sm.poll() is None and all(episodes_logged(root, run) < N_EPISODES for run in VICTIMS)
    job = descendants(sm.pid)
    shells = {run: parent(pid) for run, pid in trainers.items()}
    for shell in shells.values():  # snakemake -> bash -c '...' -> protoclip train
        assert parent(shell) == sm.pid and "bash" in cmdline(shell)[0], cmdline(shell)
    try:
        os.kill(trainers["k_trainer"], signal.SIGKILL)
        os.kill(shells["k_shell"], signal.SIGKILL)
        wait_for(lambda: sm.log.read_text().count("Error in rule train") >= 2, "Snakemake to fail both jobs", 120)
        os.kill(sm.pid, signal.SIGKILL)
        sm.wait()
        for pid in trainers.values():
            if alive(pid):
                os.kill(pid, signal.SIGCONT)
        # a trainer never outlives its job: the shell's and Snakemake's deaths reach the frozen trainers too; one
        # that trained on (an orphan) would be alive here, or done and have written its model
        wait_for(lambda: not any(alive(p) for p in job), "every process of the killed jobs to end", timeout=10)
        assert [run for run in VICTIMS if layout.model(run).exists()] == []
    finally:
        for pid in job:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert snakemake(root, "--cores", "1", "--unlock").wait(timeout=300) == 0  # Snakemake's lock outlived it (its own advice)
    rerun = snakemake(root, "--cores", "2", "--rerun-incomplete", *targets)
    assert rerun.wait(timeout=600) == 0, rerun.log.read_text()[-3000:]
    for run in VICTIMS:
        assert f"resumed {run} at episode" in (root / "logs" / f"train_{run}.log").read_text(), run
        check_complete(root, run)


def test_a_second_trainer_waits_naming_the_first_and_takes_over_when_it_is_killed(root):
    first = subprocess.Popen(train_cmd("two"), cwd=root, env=project_env(), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    second = None
    try:
        wait_for(lambda: episodes_logged(root, "two") >= 3, "3 episodes of the first trainer", timeout=300)
        os.kill(first.pid, signal.SIGSTOP)  # holds the run, writes nothing
        logged = Layout(root / "data", root / "results").train_log_work("two").read_bytes()
        second = subprocess.Popen(train_cmd("two"), cwd=root, env=project_env(), stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
        line = second.stdout.readline()
        while "train two" not in line and line:
            line = second.stdout.readline()
        assert f"the run is held by pid {first.pid} on host {socket.gethostname()}" in line, line
        assert "waiting for it to end" in line
        time.sleep(2.0)
        assert second.poll() is None  # still waiting ...
        assert Layout(root / "data", root / "results").train_log_work("two").read_bytes() == logged  # ... idle
        first.kill()  # the kernel drops the first trainer's lock
        first.wait()
        out = second.communicate(timeout=600)[0]
        assert second.returncode == 0, out[-3000:]
        assert "got the run after" in out and "resumed two at episode" in out
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    check_complete(root, "two")
