"""A real single-node SLURM cluster for the tests: Debian's munged, slurmctld and slurmd in a temp folder.

    with SlurmCluster(tmp_path / "slurm") as cluster:       # or the `slurm_cluster` fixture (conftest.py)
        subprocess.run(["sbatch", "--gpus=2", "--wrap", "env"], env=cluster.env())

Everything lives in the folder: slurm.conf and gres.conf, the munge key and socket, state and spool
directories, pid and log files, and four fake GPUs: character device files made with mknod (major 195, the
NVIDIA driver's), declared as generic resources (``GresTypes=gpu``, ``Gres=gpu:4``, ``AutoDetect=off``,
``File=``). With ``SelectType=select/cons_tres`` SLURM itself then gives ``sbatch --gpus=2`` its two GPUs
and sets ``CUDA_VISIBLE_DEVICES`` (global indices: no cgroup device constraint here, so concurrent jobs'
ids can be compared). The node declares what this machine has (its CPUs, a few GB of memory).

Nothing collides with another cluster on the machine: the daemons listen on free loopback ports picked at
start, the munge socket is the folder's own, and every command finds this cluster through ``SLURM_CONF``
(:meth:`SlurmCluster.env`; and ``bin/`` shims of the client commands, for the job steps that lose it). No accounting (``AccountingStorageType=accounting_storage/none``): finished jobs
stay visible to ``squeue`` for ``MinJobAge`` seconds (300), which is what the slurm profile's
``slurm-status-command: squeue`` reads. ``JobCompType=jobcomp/filetxt`` writes one line per finished job
(:meth:`SlurmCluster.finished_jobs`), the cluster's own record of what ran.

:meth:`stop` cancels every job, waits for the queue to empty and stops the daemons (run in the foreground as
children of the test process, so none outlives it unreaped).
The packages come from ``.ci/install-slurm`` (run by ``make test``); without them the fixture skips with the
reason, except in CI (``CI`` set), where it fails.

What a workflow's jobs did on the cluster: :class:`SlurmWatch` (a poller of ``squeue`` / ``scontrol``: each
job's rule and GPU request, the GPU indices of jobs running at once) and :func:`job_logs` (the SLURM plugin's
log of each job, by rule and wildcards).
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Self

from testkit.services import Service

DAEMONS = ("munged", "slurmctld", "slurmd")
N_GPUS = 4
NODE = "node1"
PARTITION = "debug"


def missing_commands() -> list[str]:
    return [c for c in (*DAEMONS, "sbatch", "squeue", "scancel", "scontrol", "sinfo") if shutil.which(c) is None]


def free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on loopback (bound to port 0, then released)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def memory_mb() -> int:
    """The node's RealMemory: 4 GB, or less on a smaller machine (slurmd refuses a node bigger than it is)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    return int(min(4096, total // 2))


class SlurmCluster(Service):
    def __init__(self, root: Path):
        self.root = Path(root)
        self.conf = self.root / "slurm.conf"
        self.cpus = os.cpu_count() or 1
        self.mem_mb = memory_mb()
        self.jobcomp = self.root / "log" / "jobcomp.log"
        self.dev = self.root / "dev"
        self.procs: dict[str, subprocess.Popen] = {}

    # ------------------------------------------------------------------ set-up
    def env(self, base: dict | None = None) -> dict:
        """``base`` (default: this process's environment) with ``SLURM_CONF`` pointing at this cluster, and no
        SLURM job variables inherited from an outer allocation."""
        env = {k: v for k, v in (os.environ if base is None else base).items() if not k.startswith("SLURM_")}
        env["SLURM_CONF"] = str(self.conf)
        env["PATH"] = f"{self.root / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        return env

    def _write_shims(self) -> None:
        """``bin/<command>`` for each client command: the real one with ``SLURM_CONF`` set. The SLURM executor
        plugin's job step runs ``srun`` with every ``SLURM_*`` variable removed but the job's ids, SLURM_CONF
        too; a real site's commands find their config at the default path (or from slurmd, configless), this
        cluster's is in its temp folder."""
        (self.root / "bin").mkdir(exist_ok=True)
        for name in ("sbatch", "srun", "squeue", "scancel", "scontrol", "sinfo", "sacct", "sacctmgr", "sshare"):
            real = shutil.which(name)
            if real:
                shim = self.root / "bin" / name
                shim.write_text(f'#!/bin/sh\nSLURM_CONF="{self.conf}" exec {real} "$@"\n')
                shim.chmod(0o755)

    def _write_config(self) -> None:
        ctld_port, slurmd_port = free_ports(2)
        host = socket.gethostname()
        r = self.root
        for d in ("munge", "state", "spool", "log", "dev"):
            (r / d).mkdir(parents=True, exist_ok=True)
        (r / "munge").chmod(0o700)
        for i in range(N_GPUS):  # fake NVIDIA devices (character devices, major 195)
            os.mknod(self.dev / f"nvidia{i}", 0o600 | 0o020000, os.makedev(195, i))
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.conf.write_text(f"""\
ClusterName=protoclip-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={r}/munge/munge.socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={self.jobcomp}
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
MinJobAge=300
ReturnToService=2
MpiDefault=none
SwitchType=switch/none
MailProg=/bin/true
KillWait=5
SchedulerParameters=sched_interval=1
NodeName={NODE} NodeHostname={host} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={self.mem_mb} Gres=gpu:{N_GPUS} State=UNKNOWN
PartitionName={PARTITION} Nodes={NODE} Default=YES MaxTime=INFINITE State=UP
""")
        self._write_shims()
        (r / "gres.conf").write_text(f"AutoDetect=off\nNodeName={NODE} Name=gpu File={self.dev}/nvidia[0-{N_GPUS - 1}]\n")

    def _daemon(self, name: str, *args: str) -> None:
        """Start daemon ``name`` in the foreground as a child of this process (so that it is reaped when it
        stops), its output in ``log/<name>.out``."""
        with open(self.root / "log" / f"{name}.out", "w") as out:
            self.procs[name] = subprocess.Popen([name, *args], env=self.env(), stdout=out, stderr=out,
                                                stdin=subprocess.DEVNULL, start_new_session=True)

    def _run(self, *cmd: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        out = subprocess.run(cmd, env=self.env(), capture_output=True, text=True, timeout=timeout, check=False)
        if check and out.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr.strip()}\n{self.logs()}")
        return out

    def start(self) -> SlurmCluster:
        self._write_config()
        r = self.root
        self._daemon("munged", "--foreground", "--force", f"--key-file={r}/munge/munge.key",
                     f"--socket={r}/munge/munge.socket", f"--pid-file={r}/munge/munged.pid",
                     f"--log-file={r}/log/munged.log", f"--seed-file={r}/munge/munged.seed")
        end = time.monotonic() + 30
        while not (r / "munge" / "munge.socket").exists() and time.monotonic() < end:
            time.sleep(0.1)
        self._daemon("slurmctld", "-D", "-i", "-f", str(self.conf))  # -i: no saved state to recover
        self._daemon("slurmd", "-D", "-f", str(self.conf), "-N", NODE)
        end = time.monotonic() + 60
        state = ""
        while time.monotonic() < end:
            if (dead := [n for n, p in self.procs.items() if p.poll() is not None]):
                raise RuntimeError(f"{', '.join(dead)} exited at start\n{self.logs()}")
            state = self._run("sinfo", "-h", "-N", "-o", "%T", check=False).stdout.strip()
            if state == "idle":
                return self
            time.sleep(0.5)
        raise RuntimeError(f"the SLURM node did not come up (state {state!r})\n{self.logs()}")

    # ------------------------------------------------------------------ use
    def queue(self) -> list[str]:
        """``squeue`` lines (job id, state) of jobs not yet finished."""
        return self._run("squeue", "-h", "-o", "%i %T", check=False).stdout.split("\n")[:-1]

    def finished_jobs(self) -> list[dict[str, str]]:
        """One dict per finished job (the jobcomp/filetxt record: JobId, Name, JobState, StartTime, Tres ...)."""
        if not self.jobcomp.exists():
            return []
        out = []
        for line in self.jobcomp.read_text().splitlines():
            fields = {}
            for item in line.split(" "):
                key, sep, value = item.partition("=")
                if sep:
                    fields[key] = value
            out.append(fields)
        return out

    def logs(self) -> str:
        parts = []
        for name in ("slurmctld.log", "slurmd.log", "munged.log", "slurmctld.out", "slurmd.out", "munged.out"):
            p = self.root / "log" / name
            if p.exists():
                parts.append(f"--- {name} (last lines)\n" + "\n".join(p.read_text(errors="replace").splitlines()[-15:]))
        return "\n".join(parts)

    # ------------------------------------------------------------------ tear-down
    def cancel_all(self, timeout: float = 60) -> None:
        """Cancel every job of this cluster and wait until none runs."""
        self._run("scancel", "--full", f"--partition={PARTITION}", check=False)
        end = time.monotonic() + timeout
        while time.monotonic() < end and any(
                s.split()[1] in ("RUNNING", "PENDING", "COMPLETING", "CONFIGURING") for s in self.queue()):
            time.sleep(0.5)

    def stop(self) -> None:
        if self.conf.exists():
            try:
                self.cancel_all()
            except (OSError, subprocess.SubprocessError):
                pass
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.pop(name, None)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()




# ---------------------------------------------------------------------- what the workflow's jobs did on it
class SlurmWatch(threading.Thread):
    """Polls the cluster every 0.3 s while a workflow runs: ``jobs`` {job id: {"comment" (the plugin's: rule and
    wildcards), "gres" (its GPU request, e.g. gres:gpu:2), "idx" (the GPU indices it holds)}}, and ``snapshots``
    of the GPU indices of the jobs running at the same moment (when more than one)."""

    def __init__(self, cluster: SlurmCluster):
        super().__init__(daemon=True)
        self.cluster, self.jobs, self.snapshots = cluster, {}, []
        self.halt = threading.Event()

    def run(self):
        e = self.cluster.env()
        while not self.halt.is_set():
            out = subprocess.run(["squeue", "-h", "-O", "JobID:|,Comment:300|,tres-per-job:|,State:|"], env=e,
                                 capture_output=True, text=True, check=False)
            running = {}
            for line in out.stdout.splitlines():
                jid, comment, gres, state = (f.strip() for f in line.split("|")[:4])
                job = self.jobs.setdefault(jid, {"comment": comment, "gres": gres, "idx": None})
                if state == "RUNNING" and gres != "N/A":
                    if job["idx"] is None:
                        detail = subprocess.run(["scontrol", "-d", "show", "job", jid], env=e, capture_output=True,
                                                text=True, check=False).stdout
                        m = re.search(r"GRES=gpu:\d+\(IDX:([\d,-]+)\)", detail)
                        job["idx"] = expand_idx(m.group(1)) if m else None
                    if job["idx"] is not None:
                        running[jid] = job["idx"]
            if len(running) > 1:
                self.snapshots.append(running)
            self.halt.wait(0.3)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.halt.set()
        self.join()


def expand_idx(text: str) -> list[int]:
    """SLURM's index list '0-1,3' -> [0, 1, 3]."""
    out = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b or a) + 1))
    return out


def job_logs(project: Path) -> dict[str, list[Path]]:
    """{'<rule>/<wildcards>': the SLURM plugin's job logs (named <job id>.log), oldest first} of a project."""
    out: dict[str, list[Path]] = {}
    base = project / ".snakemake" / "slurm_logs"
    for log in base.rglob("*.log"):
        out.setdefault("/".join(log.relative_to(base).parts[:-1]), []).append(log)
    return {k: sorted(v, key=lambda p: int(p.stem)) for k, v in out.items()}
