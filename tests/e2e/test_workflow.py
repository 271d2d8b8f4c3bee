"""The Snakemake DAG and dvc.yaml run the same stage commands on the same files; config overrides take effect
in every command or stop the run naming the key; the workflow lints clean."""
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from protoclip.project import load_config
from protoclip.dag.stages import dvc_yaml_text
from testkit import REPO
from testkit.processes import snakemake as run_snakemake

CONFIG = "config/config.yaml"


def snakemake(*args: str) -> subprocess.CompletedProcess:
    """Snakemake on the repository itself, in the caller's environment; the caller reads the exit code."""
    return run_snakemake(REPO, *args, env=dict(os.environ), check=False)


def test_dvc_yaml_is_generated_from_the_config(monkeypatch):
    monkeypatch.chdir(REPO)  # dvc.yaml holds paths relative to the repository root
    expected = dvc_yaml_text(load_config(CONFIG), CONFIG)
    assert (REPO / "dvc.yaml").read_text() == expected, "dvc.yaml is stale: run `protoclip dvc-yaml`"


def dry_jobs(*args: str) -> dict[str, dict[str, list[str]]]:
    """``snakemake -n -p`` -> {stage command: {"input": [...], "output": [...]}} of every job."""
    dry = snakemake("-n", "-p", "--cores", "1", *args)
    assert dry.returncode == 0, dry.stderr + dry.stdout
    jobs = {}
    for block in (dry.stdout + dry.stderr).split("\nrule ")[1:]:
        fields = dict(re.findall(r"^    (input|output): (.*)$", block, flags=re.M))
        # the command, after any environment assignments the rule adds (train: PROTOCLIP_JOB_PID=$PPID)
        cmd = re.search(r"^(?:Shell command: )?(?:[A-Z_]+=\S+ )*(protoclip .*?)(?: 2>&1 \| tee \S+)?$", block,
                        flags=re.M)
        if cmd:
            jobs[cmd.group(1).strip()] = {k: v.split(", ") for k, v in fields.items()}
    return jobs


def test_snakemake_and_dvc_run_the_same_commands_on_the_same_files():
    jobs = dry_jobs("--forceall")
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    assert set(jobs) == {stage["cmd"] for stage in stages.values()}
    for stage in stages.values():
        job = jobs[stage["cmd"]]
        # inputs: DVC's deps are Snakemake's; the code is a param of both (its command's code fingerprint, the
        # rule's `code` param; tests/e2e/test_dvc_fresh_clone.py checks that both tools rerun on it alike)
        assert sorted(job.get("input", [])) == sorted(stage.get("deps", [])), stage["cmd"]
        assert {"code-fingerprints.yaml": [stage["cmd"].split()[1]]} in stage["params"], stage["cmd"]
        # outputs: each Snakemake output is (inside) a DVC out, each DVC out holds a Snakemake output
        outs = [Path(o if isinstance(o, str) else next(iter(o))) for o in stage.get("outs", []) + stage.get("metrics", [])]
        made = [Path(o) for o in job["output"]]
        assert all(any(m == o or o in m.parents for o in outs) for m in made), (stage["cmd"], made, outs)
        assert all(any(m == o or o in m.parents for m in made) for o in outs), (stage["cmd"], made, outs)
    cfg = load_config(REPO / CONFIG)
    for run in cfg.run_names():  # every configured run is trained, evaluated on what its targets show, collected
        assert f"protoclip train --config {CONFIG} --run {run} --resume" in jobs
        assert f"protoclip collect --config {CONFIG} --run {run}" in jobs
    from protoclip.dag.stages import evaluations

    for run, sets in evaluations(cfg).items():
        for dataset, tasks in sets.items():
            tail = "".join(f" --task {t}" for t in tasks or [])
            assert f"protoclip evaluate --config {CONFIG} --run {run} --dataset {dataset}{tail}" in jobs
    assert evaluations(cfg)["clip_tiny_s0"]["fashion_mnist"]  # the main runs are evaluated ...
    # ... a temperature-study run only for its figure's diagnostics (evaluation task `temperature`)
    assert evaluations(cfg)["temp_sphere_init1"] == {"heldout_pairs": ["temperature"]}
    # `collect` reports a set whose data is missing as "not found": even with no evaluation to wait for, it runs
    # after `prepare` made the offline sets (it used to run first and list digits / Fashion-MNIST as not found)
    collect = jobs[f"protoclip collect --config {CONFIG} --run temp_sphere_init1"]["input"]
    assert {"data/prepared/manifest.parquet", "data/prepared/eval/digits.npz",
            "data/prepared/eval/fashion_mnist.npz"} <= set(collect)


def test_one_evaluation_job_per_run_and_existing_set(tmp_path):
    ext = tmp_path / "cifar10"
    ext.mkdir()
    conf = tmp_path / "c.yaml"
    conf.write_text(yaml.safe_dump({"evaluate": {"datasets": {"cifar10": {"kind": "torchvision", "path": str(ext)},
                                                              "dtd": {"kind": "torchvision", "path": str(tmp_path / "no")}}}}))
    exp = tmp_path / "exp.yaml"  # a run no target shows: every task on every set whose data exists
    exp.write_text(yaml.safe_dump({"runs": {"solo": {"method": "clip", "teacher": None}}}))
    conf.write_text(yaml.safe_dump({"experiments": [exp.name], "evaluate": {"datasets": {
        "cifar10": {"kind": "torchvision", "path": str(ext)}, "dtd": {"kind": "torchvision", "path": str(tmp_path / "no")},
        "digits": {"kind": "offline"}}}}))
    jobs = dry_jobs("--forceall", "--configfile", str(conf))
    evals = sorted(c.split("--dataset ")[1] for c in jobs if c.startswith("protoclip evaluate") and "--run solo " in c)
    assert evals == ["cifar10", "digits"]  # dtd's path does not exist: no job
    cifar = next(j for c, j in jobs.items() if c.endswith("--run solo --dataset cifar10"))
    assert str(ext) in cifar["input"]  # a set added later is an input: its job appears, the others stay


def test_config_override_reaches_every_command():
    jobs = dry_jobs("--forceall", "--config", 'paths={"results_dir": "elsewhere"}')
    resolved = REPO / ".snakemake/protoclip/config.yaml"
    assert all(f"--config {resolved.relative_to(REPO)}" in cmd for cmd in jobs), list(jobs)
    data = yaml.safe_load(resolved.read_text())
    assert data["paths"]["results_dir"] == "elsewhere" and data["paths"]["data_dir"] == "data"
    cfg = load_config(resolved)  # experiments still resolve (relative to the resolved file)
    assert cfg.run_names() == load_config(REPO / CONFIG).run_names()
    outputs = [o for j in jobs.values() for o in j["output"]]
    assert "elsewhere/runs/clip_tiny_s0/model.pt" in outputs and not any(o.startswith("results/") for o in outputs)


def test_a_configfile_is_read_alone_and_several_merge_in_order(tmp_path):
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump({"runs": {"solo": {"method": "clip", "teacher": None}}}))
    conf = tmp_path / "other.yaml"
    conf.write_text(yaml.safe_dump({"experiments": [exp.name], "teacher": {"pca_dim": 32}}))
    # alone: the jobs read the file itself, nothing of config/config.yaml under it (no evaluation set configured)
    jobs = dry_jobs("--forceall", "--configfile", str(conf))
    assert f"protoclip train --config {conf} --run solo --resume" in jobs
    assert not any(c.startswith("protoclip evaluate") for c in jobs)
    # on top of the default, given after one --configfile: the merge, in order
    jobs = dry_jobs("--forceall", "--configfile", CONFIG, str(conf))
    assert "protoclip train --config .snakemake/protoclip/config.yaml --run solo --resume" in jobs
    cfg = load_config(REPO / ".snakemake/protoclip/config.yaml")
    assert cfg.run_names() == ["solo"] and cfg.teacher.pca_dim == 32
    assert cfg.evaluate.datasets.keys() == load_config(REPO / CONFIG).evaluate.datasets.keys()  # from the default


def test_bad_override_stops_naming_the_key():
    dry = snakemake("-n", "--cores", "1", "--config", 'train={"lrr": 0.1}')
    assert dry.returncode != 0
    assert "unknown key 'train.lrr'" in dry.stdout + dry.stderr
    # one line, as the protoclip CLI prints it: no traceback of the Snakefile's frames
    assert "protoclip: config error: " in dry.stderr and 'File "' not in dry.stdout + dry.stderr


def test_snakefile_validates_its_config_against_the_schema_first():
    # a wrong type is caught by the schema the Snakefile validates against (workflow/schemas/), before the loader
    dry = snakemake("-n", "--cores", "1", "--config", 'prepare={"seed": "abc"}')
    assert dry.returncode != 0
    assert ("protoclip: config error: workflow/schemas/config.schema.yaml: 'prepare.seed' must be an integer, "
            "got 'abc'") in dry.stderr
    assert 'File "' not in dry.stdout + dry.stderr


def test_dvc_outputs_do_not_overlap():
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    outs = []
    for stage in stages.values():
        for out in stage.get("outs", []) + stage.get("metrics", []):
            outs.append(Path(out if isinstance(out, str) else next(iter(out))))
    for a in outs:
        for b in outs:
            assert a == b or a not in b.parents, f"{b} lies inside another stage's output {a}"
    assert len(outs) == len(set(outs))


def test_snakemake_lint_is_clean():
    lint = snakemake("--lint")
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_the_workflow_starts_without_torch():
    """Every Snakemake start parses the Snakefile: the login node's call and, on SLURM, each job's own inside its
    allocation. Parsing imports no torch, open_clip or scikit-learn (seconds each; the jobs' commands import them)."""
    probe = ("import sys\nfrom snakemake.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n"
             "    assert not e.code, e.code\n"
             "print([m for m in ('torch', 'torchvision', 'open_clip', 'sklearn') if m in sys.modules])")
    for config in ([], ["--configfile", "config/paper.yaml"]):
        out = subprocess.run([sys.executable, "-c", probe, *config, "-n", "--cores", "1", "--quiet", "rules"],
                             cwd=REPO, env=dict(os.environ), capture_output=True, text=True)
        assert out.returncode == 0, out.stderr[-3000:]
        assert out.stdout.strip().splitlines()[-1] == "[]", (config, out.stdout[-500:])


def test_gpu_runs_request_a_gpu(tmp_path):
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump({"runs": {"big": {"method": "clip", "gpu": True},
                                            "wide": {"method": "clip", "gpu": 4, "batch_size": 128},
                                            "small": {"method": "clip"}}}))
    conf = tmp_path / "config.yaml"
    conf.write_text(yaml.safe_dump({"experiments": [str(exp)], "prepare": {"eval_sets": ["digits"]},
                                    "evaluate": {"datasets": {"digits": {"kind": "offline"}}}}))
    dry = snakemake("-n", "--forceall", "--cores", "8", "--configfile", str(conf), "--resources", "gpu=4",
                    "--", *(f"results/runs/{r}/eval/digits" for r in ("big", "wide", "small")))
    out = dry.stdout + dry.stderr
    assert dry.returncode == 0, out

    def jobs(rule: str) -> list[str]:
        """Each dry-run job block of ``rule``: from its header to the next blank line, job header or timestamp
        (a job without a threads: line must not read the next job's)."""
        parts = out.split(f"rule {rule}:")[1:]
        return [re.split(r"\n[ \t]*\n|\n(?:local)?rule \w+:|\n\[", j)[0] for j in parts]

    def gpus(rule: str) -> dict[str, str]:
        return {re.search(r"run=(\w+)", j).group(1): re.search(r"gpu=(\d)", j).group(1) for j in jobs(rule)}

    def threads(rule: str) -> dict[str, int]:
        return {re.search(r"run=(\w+)", j).group(1): int(m.group(1)) if (m := re.search(r"threads: (\d+)", j)) else 1
                for j in jobs(rule)}

    # a `gpu: 4` run's train job takes 4 slots (torchrun, 4 ranks); its evaluation, one process, takes 1
    assert gpus("train") == {"big": "1", "wide": "4", "small": "0"}
    assert gpus("evaluate") == {"big": "1", "wide": "1", "small": "0"}
    # threads per GPU: --cores 8 / --resources gpu=4 = 2 (4 one-GPU jobs fit the cores); no GPU: 1
    assert threads("train") == {"big": 2, "wide": 8, "small": 1}
    assert threads("evaluate") == {"big": 2, "wide": 2, "small": 1}


def test_resolved_config_keeps_targets_relative_to_the_file_that_lists_them(tmp_path, monkeypatch):
    """`--configfile sub/x.yaml` whose `targets:` (and `experiments:`) name files next to it, merged with a
    --config key: the merged config written under .snakemake/ still finds them (config/paper.yaml style)."""
    from protoclip.dag.snakemake import resolve_config

    monkeypatch.chdir(tmp_path)
    (tmp_path / "config" / "experiments").mkdir(parents=True)
    exp = {"target": {"id": "t_only", "kind": "table", "caption": "c", "rows": [{"label": "A", "run": "a"}],
                      "columns": [{"label": "L", "task": "linear", "offline": ["digits"]}]},
           "runs": {"a": {"method": "clip", "teacher": None}}}
    (tmp_path / "config" / "experiments" / "t.yaml").write_text(yaml.safe_dump(exp))
    (tmp_path / "config" / "experiments" / "r.yaml").write_text(yaml.safe_dump({"runs": {"b": {"method": "clip"}}}))
    (tmp_path / "config" / "config.yaml").write_text(yaml.safe_dump({"experiments": []}))
    claim = {"id": "c", "paper": "P", "source": "p.txt", "line": 1, "where": "w", "quote": "q", "paper_value": 1.0,
             "paper_text": "+1", "target": "t_only", "a": "A", "b": "A", "columns": ["L"], "magnitude": "none"}
    (tmp_path / "config" / "claims.yaml").write_text(yaml.safe_dump({"claims": [claim]}))
    cli = {"experiments": ["experiments/r.yaml"], "targets": ["experiments/t.yaml"],
           "claims": {"files": ["claims.yaml"], "resamples": 500}}  # a nested list of files: rewritten too
    (tmp_path / "config" / "over.yaml").write_text(yaml.safe_dump(cli))
    # the file alone is read as it is; with a --config key on top, the merge is written
    assert resolve_config(cli, "config/config.yaml", ["config/over.yaml"], {}) == "config/over.yaml"
    merged = {**cli, "teacher": {"pca_dim": 8}}
    path = resolve_config(merged, "config/config.yaml", ["config/over.yaml"], {"teacher": {"pca_dim": 8}})
    assert path == ".snakemake/protoclip/config.yaml"
    data = yaml.safe_load(Path(path).read_text())
    assert data["targets"] == ["../../config/experiments/t.yaml"]
    assert data["claims"] == {"files": ["../../config/claims.yaml"], "resamples": 500}
    assert cli["claims"]["files"] == ["claims.yaml"]  # Snakemake's own config is left as it was
    cfg = load_config(path)
    assert cfg.run_names() == ["b"] and list(cfg._targets) == ["t_only"]  # the target, without its runs
    assert [c.id for c in cfg.paper_claims()] == ["c"]


def test_stages_to_commit_takes_what_ran_what_the_lock_lacks_and_their_downstream(tmp_path, monkeypatch):
    """onsuccess commits only the stages whose jobs ran, plus stages missing from dvc.lock and everything
    downstream of them; stages whose outputs or inputs do not exist are never committed."""
    from protoclip.dag.dvc_sync import stages_to_commit
    from protoclip.dag.stages import Out, Stage

    monkeypatch.chdir(tmp_path)

    def stage(name, deps, outs):
        for o in outs:
            Path(o).parent.mkdir(parents=True, exist_ok=True)
            Path(o).write_text(name)
        return Stage(name=name, command=name, config_file="c.yaml", args="", deps={"in": deps},
                     outs=[Out(o) for o in outs],
                     targets={"out": Out(outs[0])})

    prep = stage("prepare", [], ["data/prepared/manifest.parquet"])
    train_a = stage("train_a", ["data/prepared/manifest.parquet"], ["runs/a/model.pt"])
    eval_a = stage("evaluate_a", ["runs/a/model.pt"], ["runs/a/eval.json"])
    train_b = stage("train_b", ["data/prepared/manifest.parquet"], ["runs/b/model.pt"])
    eval_b = stage("evaluate_b", ["runs/b/model.pt"], ["runs/b/eval.json"])
    report = stage("report", ["runs/a/eval.json", "runs/b/eval.json"], ["tables/t.md"])
    dag = [prep, train_a, eval_a, train_b, eval_b, report]
    everything = {s.name for s in dag}

    # an incremental run that redid evaluate_b (and so report): just those two
    assert stages_to_commit(dag, {"runs/b/eval.json", "tables/t.md"}, everything) == ["evaluate_b", "report"]
    # nothing ran, all recorded: nothing to commit
    assert stages_to_commit(dag, set(), everything) == []
    # train_a missing from the lock (e.g. an earlier run under overrides): it and its downstream, in DAG order
    assert stages_to_commit(dag, set(), everything - {"train_a"}) == ["train_a", "evaluate_a", "report"]
    # made=None: every stage whose files exist; a missing output keeps a stage (and nothing else) out
    Path("runs/b/eval.json").unlink()
    assert stages_to_commit(dag, None, set()) == ["prepare", "train_a", "evaluate_a", "train_b"]
