"""Subprocesses of the tests: the environment that runs this checkout's code, Snakemake runs, waiting on processes."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from testkit import REPO

BIN = Path(sys.executable).parent  # the venv's console scripts: protoclip, snakemake, dvc, mlflow


def project_env(**extra: str) -> dict:
    """``os.environ`` for a child that runs this checkout: its src first on PYTHONPATH, the venv's bin first on PATH,
    one BLAS / OpenMP thread (2 shared cores), hubs offline, and no GPU list, job pid or fork server inherited from the
    caller."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env["PATH"] = str(BIN) + os.pathsep + env.get("PATH", "")
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", MPLBACKEND="Agg", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", DVC_NO_ANALYTICS="1")
    for name in ("CUDA_VISIBLE_DEVICES", "PROTOCLIP_JOB_PID", "PROTOCLIP_FORKSERVER"):
        env.pop(name, None)
    env.update(extra)
    return env


def run(cmd: list[str], cwd: Path, *, env: dict | None = None, check: bool = True,
        timeout: float | None = None) -> subprocess.CompletedProcess:
    """``cmd`` to completion with its output captured; with ``check``, a non-zero exit fails the test with the
    command's output tails."""
    out = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env if env is not None else project_env(),
                         capture_output=True, text=True, timeout=timeout)
    if check and out.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} failed ({out.returncode}):\n"
                             f"{out.stdout[-5000:]}\n{out.stderr[-15000:]}")
    return out


def snakemake(cwd: Path, *args: str, env: dict | None = None, check: bool = True,
              timeout: float | None = None) -> subprocess.CompletedProcess:
    """``python -m snakemake ARGS`` in ``cwd`` (see :func:`run`)."""
    return run([sys.executable, "-m", "snakemake", *args], cwd, env=env, check=check, timeout=timeout)


def alive(pid: int) -> bool:
    """Running (a zombie waiting to be reaped counts as dead)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_for(cond, what: str, timeout: float = 30.0, poll: float = 0.05):
    """``cond()``'s first true value, polled every ``poll`` s; a timeout fails the test naming ``what``."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if (got := cond()):
            return got
        time.sleep(poll)
    raise AssertionError(f"timed out waiting for {what}")
