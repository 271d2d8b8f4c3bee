"""The Snakemake DAG and dvc.yaml run the same stage commands; the workflow lints clean."""
import re
import subprocess
import sys
from pathlib import Path

import yaml

from protoclip.config import load_config
from protoclip.pipeline import dvc_yaml_text

REPO = Path(__file__).resolve().parents[1]
CONFIG = "config/config.yaml"


def snakemake(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=REPO, capture_output=True, text=True)


def test_dvc_yaml_is_generated_from_the_config(monkeypatch):
    monkeypatch.chdir(REPO)  # dvc.yaml holds paths relative to the repository root
    expected = dvc_yaml_text(load_config(CONFIG), CONFIG)
    assert (REPO / "dvc.yaml").read_text() == expected, "dvc.yaml is stale: run `protoclip dvc-yaml`"


def test_snakemake_and_dvc_run_the_same_commands():
    dry = snakemake("-n", "-p", "--forceall", "--cores", "1")
    assert dry.returncode == 0, dry.stderr + dry.stdout
    # each rule's shell command is '<stage command> 2>&1 | tee <log>'
    smk = {re.sub(r" 2>&1 \| tee \S+$", "", line.split("Shell command: ", 1)[1].strip())
           for line in (dry.stdout + dry.stderr).splitlines() if "Shell command: protoclip" in line}
    dvc = {stage["cmd"] for stage in yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"].values()}
    assert smk == dvc
    cfg = load_config(REPO / CONFIG)
    for run in cfg.run_names():  # every configured run is trained and evaluated
        assert f"protoclip train --config {CONFIG} --run {run} --resume" in smk
        assert f"protoclip evaluate --config {CONFIG} --run {run}" in smk


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


def test_gpu_runs_request_a_gpu(tmp_path):
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump({"runs": {"big": {"method": "clip", "gpu": True},
                                            "small": {"method": "clip"}}}))
    conf = tmp_path / "config.yaml"
    conf.write_text(yaml.safe_dump({"experiments": [str(exp)], "prepare": {"eval_sets": ["digits"]}}))
    dry = snakemake("-n", "--forceall", "--cores", "1", "--configfile", str(conf), "--resources", "gpu=1",
                    "--", "results/runs/big/model.pt", "results/runs/small/model.pt")
    out = dry.stdout + dry.stderr
    assert dry.returncode == 0, out
    jobs = out.split("rule train:")[1:]
    res = {re.search(r"run=(\w+)", j).group(1): re.search(r"gpu=(\d)", j).group(1) for j in jobs}
    assert res == {"big": "1", "small": "0"}
