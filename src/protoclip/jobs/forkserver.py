"""A fork server for a workflow's CPU jobs: torch, open_clip and MLflow are imported once, and each ``protoclip
train`` / ``evaluate`` / ``collect`` job runs as a fork of that process instead of a fresh interpreter.

    protoclip forkserver -- snakemake --cores all --resources gpu=0    # what `make run` runs

How a job hands itself over, when it runs itself, what a fork shares: docs/architecture.md, "The fork server".
"""
from __future__ import annotations

import array
import atexit
import ctypes
import importlib
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path

from protoclip.jobs.launch import JOB_PID, LOG_PROGRESS_INTERVAL, stop, watch_processes

ENV = "PROTOCLIP_FORKSERVER"  # the server's socket, in the wrapped command's environment
FORKED = ("train", "evaluate", "collect")  # the many jobs of a workflow whose start-up is mostly these imports
# MLflow imports its SQLite store (SQLAlchemy, its table models, alembic) when a job opens its client, not with
# ``mlflow``: a second or two of every job's start without the store modules here
PRELOAD = ("torch", "open_clip", "mlflow", "mlflow.store.tracking.sqlalchemy_store",
           "mlflow.store.model_registry.sqlalchemy_store", "mlflow.tracing.processor.base_mlflow",
           "sqlalchemy.dialects.sqlite", "sklearn.linear_model", "sklearn.cluster", "protoclip.cli",
           "protoclip.tracking", "protoclip.train.stage", "protoclip.evaluate.stage", "protoclip.evaluate.features",
           "protoclip.evaluate.metrics", "protoclip.evaluate.collect")
ENTRY = "protoclip.cli:main"  # what a fork runs with the job's argv
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_MAX_REQUEST = 1 << 20  # argv + cwd + environment, JSON
PR_SET_NAME = 15  # linux/prctl.h


# --------------------------------------------------------------------------- the job's side
def delegate(argv: list[str], env: dict | None = None) -> int | None:
    """Run ``protoclip <argv>`` as a fork of the server ``PROTOCLIP_FORKSERVER`` names; its exit code, or None
    when this command does not go there (not in :data:`FORKED`, no variable, no server answering)."""
    env = os.environ if env is None else env
    path = env.get(ENV, "")
    if not path or not argv or argv[0] not in FORKED:
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        request = json.dumps({"argv": list(argv), "cwd": os.getcwd(), "env": dict(env)}).encode()
        socket.send_fds(conn, [len(request).to_bytes(4, "big") + request], [0, 1, 2])
        reply = conn.makefile("r")
        answer = reply.readline().strip()
    except OSError as err:
        answer = f"not answering ({err})"
    if not answer.isdigit():
        print(f"protoclip: fork server {path} {answer or 'not answering'}: running in this process", file=sys.stderr)
        conn.close()
        return None
    pid = int(answer)
    for sig in FORWARDED:
        signal.signal(sig, lambda signum, frame: _kill(pid, signum))
    line = reply.readline()  # the server writes the fork's status when it has ended
    conn.close()
    if not line:
        print("protoclip: the fork server went away before the job ended", file=sys.stderr)
        return 1
    status, cpu_s, peak_mib = line.split()
    print(f"protoclip: ran as a fork of the fork server (pid {pid}): {cpu_s} CPU s, peak {peak_mib} MiB resident",
          file=sys.stderr)
    return exit_code(int(status))


def exit_code(status: int) -> int:
    """A shell's exit code for ``os.waitstatus_to_exitcode``'s value: -N (killed by signal N) -> 128 + N."""
    return 128 - status if status < 0 else status


def _kill(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


# --------------------------------------------------------------------------- the server
def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    """One request: (argv, cwd, env) and the job's three standard descriptors."""
    head, fds, _, _ = socket.recv_fds(conn, 4, 3)
    size = int.from_bytes(head, "big") if len(head) == 4 else 0
    if len(fds) != 3 or not 0 < size <= _MAX_REQUEST:
        for fd in fds:
            os.close(fd)
        raise ValueError("malformed request")
    try:
        body = b""
        while len(body) < size:
            chunk = conn.recv(size - len(body))
            if not chunk:
                raise ValueError("truncated request")
            body += chunk
        return json.loads(body), fds
    except (OSError, ValueError):
        for fd in fds:
            os.close(fd)
        raise


def refusal(env: dict) -> str | None:
    """Why a job with environment ``env`` must not run as a fork of this server (None: it may). A SLURM job's
    process belongs to its allocation (its cgroup, its accounting): a fork of the server would run outside it."""
    job, own = env.get("SLURM_JOB_ID"), os.environ.get("SLURM_JOB_ID")
    if job != own:
        return f"refused: the job's SLURM_JOB_ID is {job or 'unset'}, the server's {own or 'unset'}"
    return None


def _run_fork(request: dict, fds: list[int], client_pid: int, entry: str) -> None:
    """In the fork: become the job (streams, directory, environment, threads, signals), run it, exit. Never
    returns."""
    code = 1
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        for sig in (*FORWARDED, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update({k: v for k, v in request["env"].items() if k not in (ENV, JOB_PID)})
        _apply_threads(os.environ)
        _name(f"{request['argv'][0]} (fork)")
        _follow(client_pid)
        sys.argv = ["protoclip", *request["argv"]]
        module, _, name = entry.partition(":")
        code = getattr(importlib.import_module(module), name)(request["argv"])
    except SystemExit as err:
        code = err.code
    except BaseException:  # noqa: BLE001 - as an interpreter would: the traceback, exit 1
        traceback.print_exc()
        code = 1
    _exit(code)


def _apply_threads(env) -> None:
    """The job's thread count, as a fresh process would take it from ``OMP_NUM_THREADS``: the OpenMP runtime reads
    the variable once per process (the server's), so the fork applies it with ``torch.set_num_threads``; unset,
    the fork keeps the server's count, i.e. a fresh process's default."""
    torch = sys.modules.get("torch")
    value = env.get("OMP_NUM_THREADS", "")
    if torch is not None and value.isdigit() and int(value) > 0:
        torch.set_num_threads(int(value))


def _name(name: str) -> None:
    """The name ``ps`` / ``top`` show for this fork (its command line stays the server's)."""
    ctypes.CDLL(None).prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)


def _follow(client_pid: int) -> None:
    """End this fork (SIGKILL, as the job's kill would have) when the command that asked for it ends: its job
    cancelled, Snakemake killed. Watched from here, while the command is known to wait for this fork."""
    watch_processes([client_pid], lambda pid: stop(f"the command that started this job (pid {pid}) ended"),
                    "protoclip-forkserver-client")


def _exit(code) -> None:
    """Leave as the interpreter would at the end of a script (other threads joined, atexit functions, streams
    flushed), then ``os._exit``: the server's frames below this one must not run in the fork."""
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    try:
        for thread in threading.enumerate():
            if thread is not threading.current_thread() and not thread.daemon:
                thread.join()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code & 0xFF)


class Server:
    """Accepts requests on ``path``, forks a job for each, writes back each job's pid and then its status. The
    server never touches CUDA, so a fork may."""

    def __init__(self, path: Path, entry: str = ENTRY):
        self.path, self.entry = Path(path), entry
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(self.path))
        self.listener.listen(64)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ, ("accept", None))
        self.jobs: dict[int, socket.socket] = {}

    def serve_until(self, proc: subprocess.Popen) -> int:
        """Serve until ``proc`` (the wrapped command) ends; its exit code."""
        pidfd = os.pidfd_open(proc.pid)
        self.selector.register(pidfd, selectors.EVENT_READ, ("command", None))
        try:
            while True:
                for key, _ in self.selector.select():
                    kind, data = key.data
                    if kind == "accept":
                        self._accept()
                    elif kind == "job":
                        self._reap(key.fd, data)
                    else:
                        return proc.wait()
        finally:
            self.selector.unregister(pidfd)
            os.close(pidfd)

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        client_pid = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
        client_pid = array.array("i", client_pid)[0]
        try:
            request, fds = _receive(conn)
        except (OSError, ValueError) as err:
            print(f"protoclip forkserver: request refused: {err}", file=sys.stderr)
            conn.close()
            return
        if (refused := refusal(request["env"])) is not None:
            for fd in fds:
                os.close(fd)
            self._send(conn, refused)
            conn.close()
            return
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            self.listener.close()
            _run_fork(request, fds, client_pid, self.entry)
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        self.jobs[pidfd] = conn
        self.selector.register(pidfd, selectors.EVENT_READ, ("job", pid))
        self._send(conn, pid)

    def _reap(self, pidfd: int, pid: int) -> None:
        _, status, usage = os.wait4(pid, 0)
        self.selector.unregister(pidfd)
        os.close(pidfd)
        conn = self.jobs.pop(pidfd)
        # its status, then what it used (the job's log says it: Snakemake's benchmark sees the command only)
        self._send(conn, f"{os.waitstatus_to_exitcode(status)} {usage.ru_utime + usage.ru_stime:.1f} "
                         f"{usage.ru_maxrss // 1024}")
        conn.close()

    @staticmethod
    def _send(conn: socket.socket, value: int | str) -> None:
        try:
            conn.sendall(f"{value}\n".encode())
        except OSError:  # the command is gone; its fork follows it (_follow)
            pass

    def close(self) -> None:
        self.selector.close()
        self.listener.close()
        for conn in self.jobs.values():
            conn.close()


def preload(modules=PRELOAD) -> None:
    """Import what the forks share: these modules and everything they read at import time, so the environment is
    set first as a job's log gets it (``TQDM_MININTERVAL``: :func:`protoclip.jobs.launch.progress_for_logs`)."""
    os.environ.setdefault("TQDM_MININTERVAL", LOG_PROGRESS_INTERVAL)
    for name in modules:
        importlib.import_module(name)


def run(command: list[str], modules=PRELOAD, entry: str = ENTRY) -> int:
    """Preload, start ``command`` with ``PROTOCLIP_FORKSERVER`` set, serve its jobs until it ends; its exit code."""
    if not command:
        raise ValueError("no command to run (protoclip forkserver -- <command>)")
    preload(modules)
    # not a TemporaryDirectory: its clean-up at exit would run in every fork (atexit functions are inherited)
    folder = Path(tempfile.mkdtemp(prefix="protoclip-forkserver-"))
    server = Server(folder / "socket", entry)
    # Ctrl-C reaches the command and its jobs (one process group); the server waits for the command to end
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        proc = subprocess.Popen(command, env={**os.environ, ENV: str(server.path)},
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        return server.serve_until(proc)
    finally:
        signal.signal(signal.SIGINT, previous)
        server.close()
        shutil.rmtree(folder, ignore_errors=True)


# --------------------------------------------------------------------------- `protoclip forkserver`
def add_arguments(p, name: str) -> None:
    p.add_argument("command", nargs="+", help="the command to run with the server (after --)")


def main(args) -> int:
    return run(args.command)
