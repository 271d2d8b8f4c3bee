"""GPU placement through Snakemake with 4 fake GPU ids: Snakemake hands out counts (``--resources gpu=N``),
``protoclip launch`` (the placement `protoclip train` / `evaluate` run first) hands out ids.

A tiny Snakefile's jobs each write the ``CUDA_VISIBLE_DEVICES`` they got and their pid, then wait for a
``go`` file, so the test sees which jobs run at once and on what.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from testkit import REPO

SNAKEFILE = """
rule all:
    input: {targets}

rule job:
    output: "out/{{name}}.txt"
    resources: gpu=lambda wc: int(wc.name.split("g")[-1])
    shell:
        "while [ -e hold_{{wildcards.name}} ]; do sleep 0.05; done; "  # the test orders the jobs with hold files
        "protoclip launch --config c.yaml --gpus {{resources.gpu}} -- bash -c "
        "'echo $CUDA_VISIBLE_DEVICES $$ > out/{{wildcards.name}}.cvd; while [ ! -e go ]; do sleep 0.05; done; "
        "echo ok > {{output}}'"
"""


def start(tmp_path: Path, names: list[str], hold: tuple[str, ...] = ()) -> subprocess.Popen:
    """Snakemake with more GPU count than slots (8 > 4), so jobs start and wait in the allocator, not in
    Snakemake's queue."""
    (tmp_path / "Snakefile").write_text(SNAKEFILE.format(targets=", ".join(f'"out/{n}.txt"' for n in names)))
    (tmp_path / "c.yaml").write_text(f"gpus: {{ids: [0, 1, 2, 3], lock_dir: {tmp_path / 'locks'}, poll_s: 0.05}}\n")
    (tmp_path / "out").mkdir()
    for name in hold:
        (tmp_path / f"hold_{name}").touch()
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    log = open(tmp_path / "snakemake.log", "w")
    return subprocess.Popen([sys.executable, "-m", "snakemake", "--cores", "8", "--resources", "gpu=8",
                             "--keep-going", "--quiet", "rules"], cwd=tmp_path, env=env, stdout=log, stderr=log)


def placed(tmp_path: Path) -> dict[str, tuple[list[str], int]]:
    """{job name: (its CUDA_VISIBLE_DEVICES ids, its pid)} of the jobs that have their GPUs."""
    out = {}
    for f in (tmp_path / "out").glob("*.cvd"):
        text = f.read_text()
        if text.endswith("\n"):
            cvd, pid = text.split()
            out[f.stem] = (cvd.split(","), int(pid))
    return out


def placed_at_least(tmp_path: Path, n: int):
    return lambda: p if len(p := placed(tmp_path)) >= n else None


def wait_until(cond, what: str, timeout: float = 120.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if (got := cond()):
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def finish(tmp_path: Path, proc: subprocess.Popen) -> int:
    (tmp_path / "go").touch()
    try:
        return proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_four_one_gpu_jobs_get_four_ids_a_fifth_waits_and_sigkill_frees_a_slot(tmp_path):
    names = [f"j{i}_g1" for i in range(5)]
    proc = start(tmp_path, names)
    try:
        first = wait_until(placed_at_least(tmp_path, 4), "4 placed jobs")
        time.sleep(1.0)  # the fifth is running too (8 cores, gpu=8) but must still wait for a slot
        assert len(placed(tmp_path)) == 4
        assert sorted(ids[0] for ids, _ in first.values()) == ["0", "1", "2", "3"]
        assert all(len(ids) == 1 for ids, _ in first.values())
        assert "waiting for 1 free GPU slot(s) of 0, 1, 2, 3" in (tmp_path / "snakemake.log").read_text()
        victim = sorted(first)[1]
        ids, pid = first[victim]
        os.kill(pid, signal.SIGKILL)
        now = wait_until(placed_at_least(tmp_path, 5), "the fifth job placed")
        (fifth,) = set(now) - set(first)
        assert now[fifth][0] == ids  # the killed job's GPU, and only it, was free
    finally:
        rc = finish(tmp_path, proc)
    assert rc != 0  # the killed job failed; --keep-going finished the others
    assert sorted(p.stem for p in (tmp_path / "out").glob("*.txt")) == sorted(set(names) - {victim})


def test_a_two_gpu_job_gets_two_ids_no_other_job_holds(tmp_path):
    singles = ["a_g1", "b_g1", "c_g1"]
    proc = start(tmp_path, ["pair_g2", *singles], hold=tuple(singles))
    try:
        pair = wait_until(lambda: placed(tmp_path).get("pair_g2"), "the 2-GPU job placed")[0]
        assert len(pair) == 2 and set(pair) <= {"0", "1", "2", "3"} and len(set(pair)) == 2
        for name in singles:  # now the 1-GPU jobs: two get the other two GPUs, the third waits
            (tmp_path / f"hold_{name}").unlink()
        got = wait_until(placed_at_least(tmp_path, 3), "two 1-GPU jobs placed beside the pair")
        time.sleep(1.0)
        got = placed(tmp_path)
        assert len(got) == 3
        held = [i for ids, _ in got.values() for i in ids]
        assert sorted(held) == ["0", "1", "2", "3"]  # 2 + 1 + 1: every GPU held once, nobody shares one
    finally:
        rc = finish(tmp_path, proc)
    assert rc == 0 and len(placed(tmp_path)) == 4  # the third 1-GPU job ran once a GPU was free
