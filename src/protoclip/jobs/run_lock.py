"""One writer per training run: the process training a run holds its lock, a second one waits.

Two trainers on one run (an orphan of a killed job, ``dvc repro`` beside ``snakemake``, a retried cluster job)
would interleave their logs and overwrite each other's checkpoint, so the train stage holds
``checkpoints/train.lock`` (:func:`hold_run`) from before it decides fresh / resume until ``model.pt`` is written.
Pure standard library, imported before torch.
"""
from __future__ import annotations

import fcntl
import os
import socket
import sys
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Callable, ContextManager, Iterator

from protoclip.jobs.launch import LAUNCHER_PID

_held: dict[Path, object] = {}  # lock path -> open file, of the locks this process holds


def holder_line(what: str) -> str:
    """What the lock file says about its holder (this process)."""
    return (f"pid {os.getpid()} on host {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')} "
            f"({what})")


def read_holder(path: str | Path) -> str:
    """The holder's line of a lock file ('' when there is none yet)."""
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def held_by_launcher(env: dict | None = None) -> bool:
    """Whether this process is a rank whose launcher holds the run: a rank of protoclip's launcher, or a rank
    other than 0 of another torchrun (rank 0 locks for them)."""
    env = os.environ if env is None else env
    return LAUNCHER_PID in env or env.get("RANK", "0") != "0"


def hold_run(path: str | Path, what: str, env: dict | None = None,
             log: Callable[[str], None] | None = None) -> ContextManager[None]:
    """Hold the run's lock for the block, waiting while another process holds it (one line, naming it).
    A no-op where this process already holds it, or its launcher does (:func:`held_by_launcher`)::

        with hold_run(layout.train_lock("clip"), "train clip"):   # waits (one line) while another process holds it
            ...

    The lock is an ``fcntl.flock``, as for GPU slots: a killed holder frees it, and the file names the holder
    (pid, host, start, command) for the one line a waiter prints. The descriptor is inherited by torchrun's ranks,
    which do not lock again. On NFS, flock maps to the server's byte-range locks (across nodes) unless mounted
    ``nolock`` / ``local_lock``."""
    path = Path(path).resolve()
    if path in _held or held_by_launcher(env):
        return nullcontext()
    return _hold(path, what, log or (lambda msg: print(msg, file=sys.stderr, flush=True)))


@contextmanager
def _hold(path: Path, what: str, log: Callable[[str], None]) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "a+")
    try:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            start = time.monotonic()
            log(f"protoclip: {what}: the run is held by {read_holder(path) or 'another process'} (lock {path}); "
                "waiting for it to end")
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)  # blocks; the kernel wakes us when the holder's lock goes
            log(f"protoclip: {what}: got the run after {time.monotonic() - start:.0f} s")
        f.seek(0)
        f.truncate()
        f.write(holder_line(what) + "\n")
        f.flush()
        os.set_inheritable(f.fileno(), True)  # kept by what this process forks or execs (torchrun ranks)
        _held[path] = f
        yield
    finally:
        _held.pop(path, None)
        f.close()  # closing the last descriptor drops the flock
