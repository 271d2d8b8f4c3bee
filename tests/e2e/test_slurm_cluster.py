"""The SLURM test cluster itself (tests/testkit/slurm.py): fake GPUs as generic resources, placed by SLURM.

The profile's end-to-end test (tests/e2e/test_paper_miniature.py) relies on these: a ``--gpus=k`` job gets k
GPU ids in ``CUDA_VISIBLE_DEVICES`` from SLURM, concurrent jobs get disjoint ids, and the cluster records
every finished job.
"""
from __future__ import annotations

import subprocess
import time

from testkit import REPO


def sbatch(cluster, tmp_path, *args: str, wrap: str) -> str:
    out = subprocess.run(["sbatch", "--parsable", "-o", str(tmp_path / "%j.out"), *args, "--wrap", wrap],
                         env=cluster.env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().split(";")[0]


def wait_done(cluster, ids: list[str], timeout: float = 120) -> dict[str, dict]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        done = {j["JobId"]: j for j in cluster.finished_jobs() if j.get("JobId") in ids}
        if len(done) == len(ids):
            return done
        time.sleep(0.3)
    raise AssertionError(f"jobs {ids} not finished: {cluster.queue()}\n{cluster.logs()}")


def test_gpus_are_generic_resources_slurm_places(slurm_cluster, tmp_path):
    cluster = slurm_cluster
    # two jobs at once (1 CPU each): a 2-GPU job and a 1-GPU job; each reports what SLURM gave it
    hold = tmp_path / "hold"
    hold.touch()
    wrap = f'echo "$CUDA_VISIBLE_DEVICES"; while [ -e {hold} ]; do sleep 0.1; done'
    pair = sbatch(cluster, tmp_path, "--gpus=2", "--cpus-per-task=1", "--ntasks=1", "--mem=100", wrap=wrap)
    single = sbatch(cluster, tmp_path, "--gpus=1", "--cpus-per-task=1", "--ntasks=1", "--mem=100", wrap=wrap)
    none = sbatch(cluster, tmp_path, "--ntasks=1", "--cpus-per-task=1", "--mem=100",
                  wrap='echo "[${CUDA_VISIBLE_DEVICES-unset}]"')
    end = time.monotonic() + 60
    outs = {j: tmp_path / f"{j}.out" for j in (pair, single)}
    while time.monotonic() < end and not all(p.exists() and p.read_text().strip() for p in outs.values()):
        time.sleep(0.2)
    running = {line.split()[0]: line.split()[1] for line in cluster.queue()}
    hold.unlink()
    done = wait_done(cluster, [pair, single, none])
    assert (running.get(pair), running.get(single)) == ("RUNNING", "RUNNING")  # they ran at the same time
    assert outs[pair].read_text().split() == ["0,1"]  # the first job: GPUs 0 and 1, set by SLURM itself
    assert outs[single].read_text().split() == ["2"]  # the other one: a GPU the pair does not hold
    assert (tmp_path / f"{none}.out").read_text().split() == ["[unset]"]  # no --gpus: SLURM sets none
    assert all(done[j]["JobState"] == "COMPLETED" for j in done)


def test_jobs_inside_an_allocation_share_its_gpus_without_sharing_one(slurm_cluster, tmp_path):
    """The gpu profile inside `salloc --gpus=3` + `srun --pty bash` (one job step holding the allocation's GPUs):
    three concurrent `protoclip launch --gpus 1` (the placement train / evaluate run first) take its three GPU
    ids, one each; in the salloc shell itself (no step: SLURM sets no CUDA_VISIBLE_DEVICES) a GPU job stops
    with one line instead of taking the node's GPUs."""
    import os
    import sys
    from pathlib import Path

    repo = REPO
    (tmp_path / "c.yaml").write_text(f"gpus: {{lock_dir: {tmp_path / 'locks'}, poll_s: 0.1}}\n")
    env = slurm_cluster.env({**os.environ, "PYTHONPATH": str(repo / "src"),
                             "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"})
    env.pop("CUDA_VISIBLE_DEVICES", None)
    launch = (f"{sys.executable} -m protoclip.cli launch --config {tmp_path / 'c.yaml'} --gpus 1 -- sh -c "
              f"'echo $CUDA_VISIBLE_DEVICES > {tmp_path}/$0.cvd; while [ ! -e {tmp_path}/go ]; do sleep 0.1; done'")
    script = (f"for j in a b c; do {launch} $j & done; "
              f"while [ $(ls {tmp_path}/*.cvd 2>/dev/null | wc -l) -lt 3 ]; do sleep 0.2; done; "
              f"touch {tmp_path}/go; wait")
    out = subprocess.run(["salloc", "--gpus=3", "--cpus-per-task=1", "--mem=300", "srun", "sh", "-c", script],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    ids = sorted((tmp_path / f"{j}.cvd").read_text().strip() for j in "abc")
    assert ids == ["0", "1", "2"], ids  # each job its own GPU of the allocation, none on another's
    bare = subprocess.run(["salloc", "--gpus=1", "--cpus-per-task=1", "--mem=300", "sh", "-c", launch.replace("$0", "x")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert bare.returncode == 2 and "CUDA_VISIBLE_DEVICES is not set" in bare.stderr, bare.stderr[-2000:]
    assert not (tmp_path / "x.cvd").exists()
