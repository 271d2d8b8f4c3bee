"""Place a job on its GPUs, then run it: one process, or k torchrun ranks on k GPUs.

``protoclip train``, ``evaluate`` and ``teacher`` call :func:`place` before they touch CUDA, and ``protoclip launch``
runs any command the same way. A command also ends with its workflow job here (:func:`follow_job`), and a job log's
progress bars are slowed to a line every 30 s (:func:`progress_for_logs`).
"""
from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from protoclip.jobs.gpu_slots import GpuSlotsConfig, Held, SlotError, acquire, effective_policy, visible_ids

if TYPE_CHECKING:  # annotations only: the command a fork server serves imports this module before it hands over
    from protoclip.config.protocols import PlacedProject, RunSettings

CVD = "CUDA_VISIBLE_DEVICES"
LAUNCHER_PID = "PROTOCLIP_LAUNCHER_PID"  # set for the ranks run_ranks starts: the process holding their slots
JOB_PID = "PROTOCLIP_JOB_PID"  # set by a workflow rule: the process running the job (follow_job)
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def train_gpus(tcfg: RunSettings) -> int:
    """GPUs a run's train job takes (``gpu:`` of the run): the Snakemake ``resources: gpu`` and the ranks."""
    return tcfg.n_gpus()


def evaluate_gpus(cfg: PlacedProject, run: str) -> int:
    """GPUs an evaluation job of ``run`` takes: 1 when ``evaluate.device`` is cuda, or auto and the run is a GPU
    run (one GPU however many the run trained on: evaluation is one process), else 0."""
    device = cfg.evaluate.device
    if device.startswith("cuda"):
        return 1
    return 1 if device == "auto" and cfg.run(run).n_gpus() > 0 else 0


def teacher_gpus(cfg: PlacedProject) -> int:
    """GPUs the teacher job takes: 1 when ``teacher.device`` is cuda, or auto in a project that trains on GPUs
    (the caption encoder then runs on a GPU like the rest of the DAG), else 0 (the offline default: CPU)."""
    device = cfg.teacher.device
    if device.startswith("cuda"):
        return 1
    return 1 if device == "auto" and any(cfg.run(r).n_gpus() > 0 for r in cfg.run_names()) else 0


# the thread counts Snakemake exports for a job (snakemake.shell: each = the rule's threads)
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS",
               "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


LOG_PROGRESS_INTERVAL = "30"  # seconds between progress-bar updates when stderr is a log file, not a terminal


def progress_for_logs(stream=None) -> bool:
    """When ``stream`` (stderr) is not a terminal (a Snakemake rule's ``| tee`` log, a SLURM log), tqdm bars
    update every 30 s instead of ten times a second, so a rule log holds a few progress lines, not thousands
    of carriage-return frames (tqdm >= 4.66 reads ``TQDM_*`` defaults from the environment; an explicit
    ``TQDM_MININTERVAL`` wins). Returns whether it applied."""
    stream = sys.stderr if stream is None else stream
    if getattr(stream, "isatty", lambda: False)():
        return False
    os.environ.setdefault("TQDM_MININTERVAL", LOG_PROGRESS_INTERVAL)
    return True


def rank_threads(env: dict, ranks: int) -> dict:
    """The thread variables of each of ``ranks`` processes sharing a job's threads: every ``*_NUM_THREADS``
    the job has divided by ``ranks`` (at least 1), ``OMP_NUM_THREADS`` from the CPUs this process may use when
    unset (torchrun would set 1). A k-GPU job of T threads runs k ranks of T / k threads, not k x T."""
    out = {}
    for var in THREAD_VARS:
        if var in env or var == "OMP_NUM_THREADS":
            try:
                total = int(env[var]) if var in env else len(os.sched_getaffinity(0))
            except ValueError:
                continue
            out[var] = str(max(1, total // max(1, ranks)))
    return out


def under_torchrun(env: dict | None = None) -> bool:
    """Whether this process is a rank of torchrun (``LOCAL_RANK`` set): whoever started torchrun placed it."""
    env = os.environ if env is None else env
    return "LOCAL_RANK" in env


@dataclass
class Placement:
    """Where a job runs: the ``CUDA_VISIBLE_DEVICES`` it got, how many ranks, and the slots it holds."""

    visible: str  # value of CUDA_VISIBLE_DEVICES for the job
    ranks: int  # processes to start (1: this one)
    held: Held | None = None  # None: no slot taken (CPU job, SLURM placement, already a torchrun rank)

    def __enter__(self) -> "Placement":
        return self

    def __exit__(self, *exc) -> None:
        # an exec'd command or torchrun's ranks inherited the lock files: they hold the slots on their own
        if self.held is not None:
            self.held.release()


def place(cfg: GpuSlotsConfig, n_gpus: int, ranks: int = 1, who: str = "", env: dict | None = None) -> Placement:
    """Reserve the job's GPUs and set ``CUDA_VISIBLE_DEVICES`` in ``env`` (default: this process's).

    ``n_gpus``: 0 = CPU job; ``ranks``: processes the job will run (1, or ``n_gpus`` for torchrun). Call before
    CUDA is initialised. A torchrun rank is left as it is (its launcher placed the job).

    A CPU job gets ``CUDA_VISIBLE_DEVICES=""``, so it cannot take a GPU another job was given. A GPU job takes
    ``n_gpus`` slots (:mod:`protoclip.jobs.gpu_slots`; inside SLURM over the ids SLURM gave), held by inheritable
    descriptors, so they are freed exactly when the job's last process (DataLoader workers, exec'd commands) is
    gone, and logs where it was placed in one line.
    """
    env = os.environ if env is None else env
    if n_gpus < 0 or ranks < 1:
        raise ValueError(f"n_gpus must be >= 0 and ranks >= 1, got {n_gpus}, {ranks}")
    if under_torchrun(env):
        die_with_launcher(env)
        return Placement(env.get(CVD, ""), 1)
    if n_gpus == 0:
        env[CVD] = ""  # a CPU job sees no GPU, so it cannot take one from a GPU job
        return Placement("", ranks)
    if effective_policy(cfg, env) == "inherit":
        have = visible_ids(env)
        if len(have) < n_gpus:
            raise SlotError(f"the job asks for {n_gpus} GPU(s) but its allocation shows {len(have)} "
                            f"({CVD}={env.get(CVD, '<unset>')}); request them with SLURM --gpus / resources gpu")
        env[CVD] = ",".join(have[:n_gpus])
        _say_placed(who, env)
        return Placement(env[CVD], ranks)
    if cfg.ids == "all" and env.get("SLURM_JOB_ID") and CVD not in env:
        # an `salloc` shell (no job step yet) or a job that asked for no GPU: nvidia-smi would list the node's
        # GPUs, other jobs' included
        raise SlotError(f"inside SLURM job {env['SLURM_JOB_ID']} but {CVD} is not set, so its GPUs are unknown: run "
                        "in a job step of an allocation with GPUs (after `salloc --gpus=N`: `srun --pty bash`)")
    held = acquire(cfg, n_gpus, who=who, env=env)
    held.inheritable()
    env[CVD] = held.env_value()
    _say_placed(who, env)
    return Placement(env[CVD], ranks, held)


def _say_placed(who: str, env: dict) -> None:
    job = f" (SLURM job {env['SLURM_JOB_ID']})" if env.get("SLURM_JOB_ID") else ""
    print(f"protoclip: {who or 'job'}: {CVD}={env[CVD]}{job}", file=sys.stderr, flush=True)


def die_with_launcher(env: dict | None = None) -> None:
    """In a rank that :func:`run_ranks` started: have the kernel SIGKILL this process when the launcher dies.

    torchrun starts each rank in a session of its own, so a SIGKILL of the launcher (OOM killer, a node agent)
    would leave the ranks training on GPUs whose slots the launcher's death just freed. Linux only (prctl);
    elsewhere, and in ranks of a torchrun that protoclip did not start, nothing is done.
    """
    env = os.environ if env is None else env
    pid = env.get(LAUNCHER_PID)
    if not pid or not sys.platform.startswith("linux"):
        return
    _set_parent_death_signal()
    if os.getppid() != int(pid):  # the launcher died before prctl took effect
        os._exit(1)


def _set_parent_death_signal() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


def parent_of(pid: int) -> int:
    """The parent pid of ``pid`` from /proc (0 when it is gone or has none)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[1])  # the name in (...) may hold spaces


def ancestors(pid: int) -> list[int]:
    """``pid``'s parent, grandparent, ... up to (not including) pid 1 / 0."""
    out = []
    parent = parent_of(pid)
    while parent > 1 and parent not in out:
        out.append(parent)
        parent = parent_of(parent)
    return out


def stop(why: str) -> None:
    """Say ``why`` and SIGKILL this process, as the kill of its job would have (torchrun ranks die with it)."""
    print(f"protoclip: {why}: stopping", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def _end_with_job(pid: int) -> None:
    stop(f"the job's process {pid} ended (the job was cancelled, its shell or Snakemake killed)")


def watch_processes(pids: list[int], on_end, name: str, ancestors_only: bool = False) -> None:
    """Call ``on_end(pid)`` (it stops this process) from a daemon thread when one of ``pids`` ends. Uses pidfds
    (Linux >= 5.3): no polling, and a pid reused by another process cannot be mistaken for the watched one; polls
    /proc once a second where pidfds are not available. ``ancestors_only``: the pids are this process's ancestors,
    so one that ended before its pidfd was open is seen missing from the chain."""
    fds: dict[int, int] = {}
    try:
        for pid in pids:
            fds[os.pidfd_open(pid)] = pid
    except ProcessLookupError:
        on_end(pid)
    except (OSError, AttributeError):  # no pidfd_open here (old kernel, seccomp): poll
        for fd in fds:
            os.close(fd)

        def poll_proc() -> None:
            while True:
                gone = [p for p in pids if not Path(f"/proc/{p}").exists()]
                if gone:
                    on_end(gone[0])
                time.sleep(1.0)
        threading.Thread(target=poll_proc, name=name, daemon=True).start()
        return
    if ancestors_only and ancestors(os.getpid())[:len(pids)] != pids:  # one ended before its pidfd was open
        on_end(next(p for p in pids if p not in ancestors(os.getpid())))

    def wait() -> None:
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)  # a pidfd becomes readable when its process exits
        while True:
            for fd, _event in poller.poll():
                on_end(fds[fd])
    threading.Thread(target=wait, name=name, daemon=True).start()


def follow_job(env: dict | None = None) -> list[int]:
    """End this process with its job: when ``PROTOCLIP_JOB_PID`` names one of its ancestors, watch it and every
    process between them (the job's shell) and SIGKILL this one when any of them ends (the parent by the kernel's
    parent-death signal, the others by a daemon thread). Returns the watched pids ([] when the variable is unset,
    names no ancestor, or off Linux). Without the variable, ``nohup protoclip train ... &`` survives its shell;
    torchrun ranks inherit it and follow the same job. The train rule sets it (``PROTOCLIP_JOB_PID=$PPID``), so a
    killed Snakemake never leaves a trainer running beside the rerun's.
    """
    env = os.environ if env is None else env
    value = env.get(JOB_PID, "")
    if not value or not sys.platform.startswith("linux"):
        return []
    chain = ancestors(os.getpid())
    if not value.isdigit() or int(value) not in chain:
        print(f"protoclip: {JOB_PID}={value} is not a process this one runs under: not followed", file=sys.stderr)
        return []
    watched = chain[:chain.index(int(value)) + 1]
    _set_parent_death_signal()
    if os.getppid() != watched[0]:  # the parent died before the signal was set
        _end_with_job(watched[0])
    watch_processes(watched, _end_with_job, "protoclip-follow-job", ancestors_only=True)
    return watched


def torchrun_args(nproc: int) -> list[str]:
    """torchrun's own arguments for a k-rank job of ``protoclip.cli`` on this node."""
    return ["--standalone", f"--nproc_per_node={nproc}", "-m", "protoclip.cli"]


def run_ranks(placement: Placement, protoclip_args: list[str]) -> int:
    """Run ``python -m protoclip.cli <protoclip_args>`` as ``placement.ranks`` torchrun ranks; their exit code.

    A training whose run has ``gpu: k > 1`` (``protoclip train --config config/config.yaml --run clip_4gpu`` with
    ``gpu: 4``) comes here: ``torchrun --standalone --nproc_per_node k`` running the same command, one rank per GPU
    with threads / k each (:func:`rank_threads`); the kernel kills the ranks if this agent dies
    (:func:`die_with_launcher`).

    This process becomes torchrun's agent (``torch.distributed.run.run``, what the ``torchrun`` command calls),
    keeping the job's GPU slots while the ranks run. The ranks' arguments are handed over unparsed: torchrun's
    command line would read ``--run`` as an abbreviation of its own ``--run-path`` and stop.
    """
    from torch.distributed.elastic.multiprocessing.errors import (
        ChildFailedError)  # heavy: torch, only when torchrun starts ranks
    from torch.distributed.run import get_args_parser, run  # heavy: torch, only when torchrun starts ranks

    args = get_args_parser().parse_args(torchrun_args(placement.ranks))
    args.training_script_args = list(protoclip_args)
    os.environ[LAUNCHER_PID] = str(os.getpid())  # the ranks die with this process (die_with_launcher)
    threads = rank_threads(os.environ, placement.ranks)
    os.environ.update(threads)  # the ranks inherit them (torchrun keeps a set OMP_NUM_THREADS)
    print(f"protoclip: {CVD}={placement.visible}, OMP_NUM_THREADS={threads['OMP_NUM_THREADS']} per rank: "
          f"torch.distributed.run {' '.join(torchrun_args(placement.ranks))} {' '.join(protoclip_args)}",
          file=sys.stderr, flush=True)
    try:
        run(args)
    except ChildFailedError as err:
        codes = [f.exitcode for f in err.failures.values()]
        print(f"protoclip: {len(codes)} of {placement.ranks} ranks failed (exit codes {codes})", file=sys.stderr)
        return next((c for c in codes if c and c > 0), 1)
    return 0


def exec_command(command: list[str]) -> None:
    """Replace this process with ``command`` (its environment already placed); never returns."""
    if not command:
        raise ValueError("no command given after --")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp(command[0], command)


# --------------------------------------------------------------------------- `protoclip launch`
def add_arguments(p, name: str) -> None:
    p.add_argument("--gpus", type=int, required=True, help="GPUs the command needs (0: it sees none)")
    p.add_argument("command", nargs="...", help="-- command and its arguments")


def main(args) -> int:
    """Run ``args.command`` on ``args.gpus`` free GPU slots: the slots' lock files stay open in it (exec).

    ``protoclip launch --config config/config.yaml --gpus 2 -- nvidia-smi`` runs nvidia-smi on 2 free GPUs."""
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("protoclip launch: no command given (protoclip launch --gpus K -- <command>)", file=sys.stderr)
        return 2
    with place(args.cfg.gpus, args.gpus, who=" ".join(command)[:200]):
        exec_command(command)
    return 0
