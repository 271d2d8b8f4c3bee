"""GPU slots: which GPU ids a job may use, so that concurrent jobs never share one.

Snakemake schedules GPU jobs by count but never says *which* GPUs a job gets, so every ``device: auto`` job would
take ``cuda:0``. Each GPU has ``jobs_per_gpu`` slots, each a ``flock``ed lock file; a job takes one on each of the k
GPUs it needs (:func:`acquire`) and :mod:`protoclip.jobs.launch` sets ``CUDA_VISIBLE_DEVICES``. Pure standard
library: imported before torch, whose CUDA state must not exist before ``CUDA_VISIBLE_DEVICES`` is set.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

LOCK_DIR = ".snakemake/protoclip/gpu-slots"


@dataclass
class GpuSlotsConfig:
    """``gpus:`` section of the project config: the GPUs jobs are placed on (protoclip.jobs.launch)."""

    # 'all' = the visible devices (CUDA_VISIBLE_DEVICES if set, else nvidia-smi's list), or explicit ids
    ids: str | list[int | str] = "all"
    jobs_per_gpu: int = 1  # concurrent jobs one GPU takes (small runs; each still sees a whole device)
    lock_dir: str = LOCK_DIR  # one lock file per slot; share it between clones that share GPUs
    # auto: slots, kept apart per SLURM job (SLURM_JOB_ID set); slots: in lock_dir itself; inherit: no slots
    policy: Literal["auto", "slots", "inherit"] = "auto"
    poll_s: float = 1.0  # how often a waiting job retries
    timeout_s: float | None = None  # give up waiting after this long (None: wait as long as it takes)

    def validate(self) -> None:
        if isinstance(self.ids, str) and self.ids != "all":
            raise ValueError(f"ids must be 'all' or a list of GPU ids, got {self.ids!r}")
        if isinstance(self.ids, list):
            names = [str(i).strip() for i in self.ids]
            if not names or any(not n or "," in n for n in names) or len(set(names)) != len(names):
                raise ValueError(f"ids must be a non-empty list of distinct GPU ids, got {self.ids!r}")
        if self.jobs_per_gpu < 1:
            raise ValueError(f"jobs_per_gpu must be >= 1, got {self.jobs_per_gpu}")
        if self.poll_s <= 0 or (self.timeout_s is not None and self.timeout_s < 0):
            raise ValueError("poll_s must be > 0 and timeout_s >= 0")


class SlotError(RuntimeError):
    """A job cannot be placed: it asks for more GPUs than exist, or waited past ``timeout_s``."""


def visible_ids(env: dict | None = None) -> list[str]:
    """The GPU ids this process may use: ``CUDA_VISIBLE_DEVICES`` when set (indices or UUIDs, as given), else
    the indices ``nvidia-smi -L`` lists; [] without an NVIDIA driver. (Not torch.cuda.device_count(): it would
    fix torch's device count in this process before the job's ``CUDA_VISIBLE_DEVICES`` is set.)"""
    env = os.environ if env is None else env
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        return [d.strip() for d in cvd.split(",") if d.strip()]
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(l for l in out.splitlines() if l.startswith("GPU "))]


def configured_ids(cfg: GpuSlotsConfig, env: dict | None = None) -> list[str]:
    """The ids slots are made for: the explicit list, or :func:`visible_ids` for ``all``."""
    return visible_ids(env) if cfg.ids == "all" else [str(i).strip() for i in cfg.ids]


def effective_policy(cfg: GpuSlotsConfig, env: dict | None = None) -> str:
    """'slots' or 'inherit' (``auto`` allocates slots: :func:`lock_dir` keeps SLURM jobs apart)."""
    return "inherit" if cfg.policy == "inherit" else "slots"


def lock_dir(cfg: GpuSlotsConfig, env: dict | None = None) -> Path:
    """The folder of the slot locks: ``cfg.lock_dir``, or under policy ``auto`` inside a SLURM job its own
    ``slurm-job-<SLURM_JOB_ID>`` subfolder (the jobs of one allocation share it, two allocations never do: both
    may see ids 0..k-1 for different GPUs)."""
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID")
    if cfg.policy == "auto" and job:
        return Path(cfg.lock_dir) / f"slurm-job-{''.join(c for c in job if c.isalnum() or c in '_-')}"
    return Path(cfg.lock_dir)


@dataclass
class Held:
    """Slots held by this process: ``ids`` in the order given to ``CUDA_VISIBLE_DEVICES``."""

    ids: list[str]
    files: list = field(default_factory=list, repr=False)  # open lock files (closing one frees its slot)

    def env_value(self) -> str:
        return ",".join(self.ids)

    def inheritable(self) -> None:
        """Keep the locks open across ``exec`` and in children (fds are close-on-exec by default, PEP 446):
        the slots then stay held while any process of the job's tree lives."""
        for f in self.files:
            os.set_inheritable(f.fileno(), True)

    def release(self) -> None:
        for f in self.files:
            f.close()  # closing the last descriptor drops the flock
        self.files = []


def _slot_path(lock_dir: Path, gpu: str, slot: int) -> Path:
    """``<lock_dir>/gpu<id>.slot<j>.lock``: slot j of GPU ``gpu``, the id made safe for a file name."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in gpu)
    return lock_dir / f"gpu{safe}.slot{slot}.lock"


def _try_lock(path: Path):
    """The open file holding an exclusive flock on ``path``, or None when another process holds it. The kernel
    drops a flock when its holder's last descriptor closes, so a killed job (SIGKILL included) frees its slots and
    no stale lock survives a reboot."""
    f = open(path, "a+")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        return None
    return f


def try_acquire(cfg: GpuSlotsConfig, n: int, ids: list[str], who: str = "", env: dict | None = None) -> Held | None:
    """One attempt: slots on ``n`` distinct GPUs of ``ids`` (most free slots first, then id order), or None.
    All at once or none: no job holds some slots while it waits for others (no hold-and-wait, so no deadlock).

    Attempts are serialised by ``<lock_dir>/allocator.lock`` so that two jobs probing at once cannot each
    take half of what both need; a slot is probed by locking it without blocking.
    """
    folder = lock_dir(cfg, env)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "allocator.lock", "a+") as mutex:
        fcntl.flock(mutex.fileno(), fcntl.LOCK_EX)  # held for the attempt only (released on close)
        free: dict[str, list] = {}  # gpu -> open files of its free slots (locked by us while we decide)
        try:
            for gpu in ids:
                free[gpu] = [f for s in range(cfg.jobs_per_gpu) if (f := _try_lock(_slot_path(folder, gpu, s)))]
            order = sorted((g for g in ids if free[g]), key=lambda g: (-len(free[g]), ids.index(g)))
            if len(order) < n:
                return None
            chosen = sorted(order[:n], key=ids.index)
            held = Held(chosen, [free[g].pop(0) for g in chosen])
            for f in held.files:  # who holds it, for a person looking at the lock folder
                f.truncate(0)
                f.write(f"pid {os.getpid()} {who}\n")
                f.flush()
            return held
        finally:
            for files in free.values():  # probes we keep no more
                for f in files:
                    f.close()


def acquire(cfg: GpuSlotsConfig, n: int, who: str = "", env: dict | None = None, log=None) -> Held:
    """Block until ``n`` GPUs are free, take one slot on each, return them. ``n`` must be >= 1 and at most
    the number of configured GPUs (else :class:`SlotError`). Prints one line when it has to wait::

        held = acquire(GpuSlotsConfig(ids=[0, 1, 2, 3]), 2)   # blocks until 2 GPUs are free
        held.ids        # ['1', '3'];  held.release() or process exit frees them
    """
    ids = configured_ids(cfg, env)
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if n > len(ids):
        raise SlotError(f"a job asks for {n} GPU(s) but gpus.ids gives {len(ids)} ({', '.join(ids) or 'none'}"
                        f"{'; no GPU is visible' if not ids and cfg.ids == 'all' else ''})")
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    start, waited = time.monotonic(), False
    while True:
        held = try_acquire(cfg, n, ids, who, env)
        if held is not None:
            if waited:
                log(f"protoclip: got GPU(s) {held.env_value()} after {time.monotonic() - start:.0f} s")
            return held
        if not waited:
            log(f"protoclip: waiting for {n} free GPU slot(s) of {', '.join(ids)} ({cfg.jobs_per_gpu} job(s) "
                f"per GPU, locks in {lock_dir(cfg, env)})")
            waited = True
        if cfg.timeout_s is not None and time.monotonic() - start >= cfg.timeout_s:
            raise SlotError(f"no {n} free GPU slot(s) of {', '.join(ids)} after {cfg.timeout_s:g} s "
                            f"(locks in {lock_dir(cfg, env)})")
        time.sleep(cfg.poll_s)
