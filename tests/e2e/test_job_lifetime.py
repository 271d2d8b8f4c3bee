"""A job's processes end with the job (protoclip.jobs.launch.follow_job) and one process trains a run at a time
(protoclip.jobs.run_lock): checked on real processes, in seconds. The end-to-end kills under Snakemake are in
tests/test_train_kill.py.

The follow_job cases build the process tree a Snakemake job has: a "job runner" (a Python process standing for
Snakemake) -> ``bash -c '...'`` (the job's shell) -> the command, which calls ``follow_job`` with
``PROTOCLIP_JOB_PID`` = the runner's pid, as the train rule sets it.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from protoclip.jobs import run_lock
from protoclip.jobs.launch import JOB_PID, LAUNCHER_PID, ancestors
from testkit import REPO
from testkit.processes import alive, wait_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal and pidfds: Linux")

COMMAND = """
import json, sys, time
from protoclip.jobs.launch import follow_job
watched = follow_job()
open(sys.argv[1], "w").write(json.dumps({"watched": watched}))
time.sleep(120)
"""
RUNNER = """
import os, subprocess, sys, time
env = dict(os.environ)
if sys.argv[2] == "follow":
    env["PROTOCLIP_JOB_PID"] = str(os.getpid())
subprocess.Popen(["bash", "-c", f"{sys.executable} -c '{sys.argv[3]}' {sys.argv[1]}; echo shell-done"], env=env)
time.sleep(120)
"""


def job_tree(tmp_path: Path, follow: bool) -> tuple[subprocess.Popen, int, int, list[int]]:
    """runner -> bash -> command; returns the runner, the shell's pid, the command's pid and what it watches."""
    out = tmp_path / "command.json"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    env.pop(JOB_PID, None)
    runner = subprocess.Popen([sys.executable, "-c", RUNNER, str(out), "follow" if follow else "no", COMMAND],
                              env=env)
    written = wait_for(lambda: out.exists() and out.read_text(), "the command to start")
    shell = next(int(d) for d in os.listdir("/proc") if d.isdigit() and _parent(int(d)) == runner.pid)
    command = next(int(d) for d in os.listdir("/proc") if d.isdigit() and _parent(int(d)) == shell)
    watched = json.loads(written)["watched"]
    return runner, shell, command, watched


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return 0


def cleanup(*pids: int) -> None:
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("victim", ["shell", "runner"])
def test_a_command_ends_when_its_job_shell_or_runner_ends(tmp_path, victim):
    runner, shell, command, watched = job_tree(tmp_path, follow=True)
    try:
        assert watched == [shell, runner.pid]  # its shell and the job's runner, nothing above
        assert alive(command)
        os.kill(shell if victim == "shell" else runner.pid, signal.SIGKILL)
        wait_for(lambda: not alive(command), f"the command to end after its {victim}", timeout=10)
    finally:
        cleanup(command, shell, runner.pid)
        runner.wait()


def test_without_the_variable_a_command_outlives_its_shell_as_nohup_expects(tmp_path):
    runner, shell, command, watched = job_tree(tmp_path, follow=False)
    try:
        os.kill(shell, signal.SIGKILL)
        time.sleep(1.5)
        assert alive(command)
    finally:
        cleanup(command, shell, runner.pid)
        runner.wait()


def test_a_job_pid_that_is_not_an_ancestor_is_not_followed(capsys):
    from protoclip.jobs.launch import follow_job

    assert follow_job({JOB_PID: str(os.getpid())}) == []  # itself, not an ancestor
    assert "is not a process this one runs under: not followed" in capsys.readouterr().err
    assert follow_job({}) == []
    assert ancestors(os.getpid())[0] == os.getppid()


# --------------------------------------------------------------------------- the run lock
HOLDER = """
import sys, time
from protoclip.jobs.run_lock import hold_run
with hold_run(sys.argv[1], "train r"):
    print("held", flush=True)
    time.sleep(120)
"""


def test_a_second_holder_waits_naming_the_first_until_the_kernel_drops_its_lock(tmp_path):
    path = tmp_path / "runs" / "r" / "checkpoints" / "train.lock"
    first = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    try:
        assert first.stdout.readline().strip() == "held"
        assert path.read_text().startswith(f"pid {first.pid} on host {socket.gethostname()} since ")
        lines: list[str] = []
        got = threading.Event()

        def second():
            with run_lock.hold_run(path, "train r", env={}, log=lines.append):
                got.set()
                assert path.read_text().startswith(f"pid {os.getpid()} on host ")

        t = threading.Thread(target=second)
        t.start()
        wait_for(lambda: lines, "the waiting line")
        assert len(lines) == 1 and f"train r: the run is held by pid {first.pid} on host {socket.gethostname()}" \
            in lines[0] and str(path) in lines[0] and lines[0].endswith("waiting for it to end")
        time.sleep(0.5)
        assert not got.is_set()
        first.kill()  # SIGKILL: no cleanup runs, the kernel drops the flock
        first.wait()
        t.join(timeout=10)
        assert got.is_set() and "got the run after" in lines[1]
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()


def test_the_lock_is_reentrant_and_left_to_the_launcher_in_its_ranks(tmp_path):
    path = tmp_path / "train.lock"
    with run_lock.hold_run(path, "train r", env={}):
        with run_lock.hold_run(path, "train r", env={}):  # the CLI holds it, then run_train asks again
            pass
        assert path.resolve() in run_lock._held  # still held after the inner block
    assert path.resolve() not in run_lock._held
    assert run_lock.held_by_launcher({LAUNCHER_PID: "123"}) and run_lock.held_by_launcher({"RANK": "1"})
    assert not run_lock.held_by_launcher({}) and not run_lock.held_by_launcher({"RANK": "0"})
