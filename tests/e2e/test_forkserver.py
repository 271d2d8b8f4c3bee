"""`protoclip forkserver`: a job forked from the warm server is the job a fresh process runs (same weights, same
log, its own directory, environment, streams and exit code), its start-up is paid once, and it ends with the
command that asked for it."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from protoclip.jobs import forkserver
from testkit import REPO
from testkit.training import TINY_CLIP_RUN, tiny_project

# the command's own CPU seconds (its children's, waited for), printed after it: a fresh `protoclip train` spends
# seconds importing torch; one whose job runs in a fork of the server spends a fraction of one
CPU_OF = ("import resource, subprocess, sys; code = subprocess.call(sys.argv[1:]); "
          "u = resource.getrusage(resource.RUSAGE_CHILDREN); print(u.ru_utime + u.ru_stime); sys.exit(code)")


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "OMP_NUM_THREADS": "1"}


def protoclip(*args: str) -> list[str]:
    return [sys.executable, "-m", "protoclip.cli", *args]


def project(root: Path, **run) -> Path:
    """A tiny project with paths relative to ``root`` (so a job must run in the directory it was started in)."""
    return tiny_project(root, {"paths": {"mlflow_experiment": "fs"}, "prepare": {"eval_sets": []},
                               "train": {**TINY_CLIP_RUN, **run}, "runs": {"r": {}, "r2": {}}}, relative=True, n=16, size=32)


def steps(root: Path) -> list[dict]:
    lines = (root / "results/runs/r/train_log.jsonl").read_text().splitlines()
    return [{k: v for k, v in r.items() if not k.startswith("time/")}
            for r in map(json.loads, lines) if r["kind"] == "step"]


def test_a_forked_training_equals_a_fresh_process(tmp_path):
    for side in ("fresh", "forked"):
        project(tmp_path / side)
    train = protoclip("train", "--config", "config.yaml", "--run", "r")
    fresh = subprocess.run([sys.executable, "-c", CPU_OF, *train], cwd=tmp_path / "fresh", env=env(),
                           capture_output=True, text=True, timeout=600)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    # the server with 2 threads, the job with 1 (a fresh process's OpenMP would read 1)
    forked = subprocess.run(protoclip("forkserver", "--", "env", "OMP_NUM_THREADS=1", sys.executable, "-c", CPU_OF,
                                      *train),
                            cwd=tmp_path / "forked", env={**env(), "OMP_NUM_THREADS": "2"}, capture_output=True,
                            text=True, timeout=600)
    assert forked.returncode == 0, forked.stderr[-3000:]
    assert "not answering" not in forked.stderr
    assert "run r: tiny-rn on cpu" in forked.stderr  # the job's log reached the command's stderr
    used = re.search(r"ran as a fork of the fork server \(pid \d+\): ([\d.]+) CPU s, peak (\d+) MiB", forked.stderr)
    assert used and float(used[1]) > 0.5 and int(used[2]) > 100, forked.stderr[-2000:]  # the fork's, not the command's
    # the job ran in the fork: the command itself did not import torch
    assert float(fresh.stdout.split()[-1]) > 2.0 and float(forked.stdout.split()[-1]) < 1.0, (fresh.stdout,
                                                                                             forked.stdout)
    a = torch.load(tmp_path / "fresh/results/runs/r/model.pt", map_location="cpu", weights_only=False)
    b = torch.load(tmp_path / "forked/results/runs/r/model.pt", map_location="cpu", weights_only=False)
    sa, sb = a.get("state_dict", a), b.get("state_dict", b)
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert steps(tmp_path / "fresh") == steps(tmp_path / "forked") != []
    start = [json.loads(line) for line in (tmp_path / "forked/results/runs/r/train_log.jsonl").read_text()
             .splitlines()][0]
    assert start["provenance"]["threads"] == "1"  # the job's OMP_NUM_THREADS, not the server's


def test_a_forked_job_imports_no_heavy_module_the_server_could_have(tmp_path):
    # what a fork does after the server's preload, in one process: a training (MLflow's SQLite store included);
    # the modules it imports itself are what each of a workflow's jobs pays again
    project(tmp_path)
    job = ("import json, sys; from protoclip.jobs import forkserver; forkserver.preload(); before = set(sys.modules); "
           "from protoclip.cli import main; code = main(['train', '--config', 'config.yaml', '--run', 'r']); "
           "print(json.dumps(sorted(set(sys.modules) - before))); sys.exit(code)")
    done = subprocess.run([sys.executable, "-c", job], cwd=tmp_path, env=env(), capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "results/mlflow.db").is_file()  # the job did open the SQLite store
    imported = json.loads(done.stdout.splitlines()[-1])
    # the store's modules (SQLAlchemy, MLflow's table models: about a second per job) and the libraries the jobs
    # compute with; what a job may still import is light (GitPython for MLflow's git tag, a new store's migrations)
    heavy = ("sqlalchemy", "mlflow.store.tracking.sqlalchemy_store", "mlflow.store.tracking.dbmodels",
             "mlflow.store.model_registry.dbmodels", "torch.nn", "open_clip", "sklearn", "scipy")
    assert [m for m in imported if m.startswith(heavy)] == [], imported


def test_the_command_that_hands_a_job_to_the_server_imports_only_the_standard_library():
    # every job of a workflow starts this command before its fork: numpy, yaml or the config alone cost it 0.1 s
    code = ("import sys; before = set(sys.modules); import protoclip.cli; "
            "print(' '.join(sorted({m.split('.')[0] for m in set(sys.modules) - before})))")
    done = subprocess.run([sys.executable, "-c", code], env=env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    imported = set(done.stdout.split())
    assert "protoclip" in imported and imported - {"protoclip"} <= set(sys.stdlib_module_names), imported


def test_a_forked_job_keeps_its_exit_code_and_ends_with_its_command(tmp_path):
    root = tmp_path / "p"
    project(root, epochs=400.0)  # long enough to be stopped
    (root / "bad.yaml").write_text("nonsense_section: {}\n")
    script = tmp_path / "jobs.sh"
    script.write_text(f"""
cd {root}
"$PY" -c "import os, socket; s = socket.socket(socket.AF_UNIX); s.connect(os.environ['PROTOCLIP_FORKSERVER']); \
s.sendall(b'no descriptors'); s.close()"
"$PY" -m protoclip.cli evaluate --config bad.yaml --run r 2> bad.err; echo $? > bad.rc
SLURM_JOB_ID=4242 "$PY" -m protoclip.cli evaluate --config bad.yaml --run r 2> slurm.err; echo $? > slurm.rc
for job in "TERM r" "KILL r2"; do
    set -- $job
    "$PY" -m protoclip.cli train --config config.yaml --run $2 2> $1.err & client=$!
    while ! grep -q '"kind": "step"' results/runs/$2/train_log.jsonl 2> /dev/null; do sleep 0.2; done
    kill -$1 $client; wait $client; echo $? > $1.rc
done
""")
    server = subprocess.Popen(protoclip("forkserver", "--", "bash", str(script)), env={**env(), "PY": sys.executable},
                              stderr=subprocess.PIPE, text=True)
    forks_seen, names = set(), set()
    try:
        while server.poll() is None:  # the forks: the server's children other than the command
            for kid in psutil.Process(server.pid).children():
                try:
                    if kid.name() != "bash":
                        forks_seen.add(kid.pid)
                        names.add(kid.name())
                except psutil.NoSuchProcess:
                    pass
            time.sleep(0.1)
    finally:
        if server.poll() is None:
            server.kill()
    _, err = server.communicate(timeout=60)
    assert server.returncode == 0, err[-3000:]
    assert (root / "bad.rc").read_text().strip() == "2"
    assert "nonsense_section" in (root / "bad.err").read_text()  # bad.yaml read from the job's directory
    # ... by a fork, although a malformed request came first (refused, the server serves on)
    assert "ran as a fork" in (root / "bad.err").read_text() and "malformed request" in err
    # a SLURM job's process is not forked outside its allocation: it runs itself, to the same end
    assert (root / "slurm.rc").read_text().strip() == "2"
    assert "SLURM_JOB_ID is 4242, the server's unset: running in this process" in (root / "slurm.err").read_text()
    assert "nonsense_section" in (root / "slurm.err").read_text()
    # SIGTERM: forwarded to the fork, which it ends; SIGKILL ends the command, and the fork follows it
    assert (root / "TERM.rc").read_text().strip() == str(128 + signal.SIGTERM)
    assert "ended: stopping" not in (root / "TERM.err").read_text()
    assert (root / "KILL.rc").read_text().strip() == str(128 + signal.SIGKILL)
    assert "ended: stopping" in (root / "KILL.err").read_text()
    assert len(forks_seen) >= 2 and "train (fork)" in names, names  # `ps` names a fork by its job
    deadline = time.time() + 15
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in forks_seen):
        assert time.time() < deadline, "a fork outlived the command that started it"
        time.sleep(0.2)


@pytest.mark.parametrize("argv, environ", [
    (["evaluate", "--run", "r"], {}),  # no server
    (["report"], {forkserver.ENV: "/nonexistent/socket"}),  # not a forked command
])
def test_a_command_runs_in_its_own_process_where_no_fork_applies(argv, environ):
    assert forkserver.delegate(argv, environ) is None


def test_a_command_whose_server_is_gone_runs_in_its_own_process(tmp_path, capsys):
    assert forkserver.delegate(["train", "--run", "r"], {forkserver.ENV: str(tmp_path / "socket")}) is None
    assert "not answering" in capsys.readouterr().err


def test_exit_codes_are_a_shells():
    assert [forkserver.exit_code(s) for s in (0, 2, -signal.SIGTERM)] == [0, 2, 143]
