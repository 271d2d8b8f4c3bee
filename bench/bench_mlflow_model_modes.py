"""The MLflow artifact store's size after one tiny training run, per ``paths.mlflow_log_models`` mode.

Each mode trains the same run (method clip, model tiny-rn with the offline default's head_hidden 512, image_size
32, 1 epoch of 32-pair episodes on 48 random 32 px pairs made by the tests' helper
``testkit.training.tiny_project``) into its own project and SQLite store, and prints the bytes under the store's
artifact folder (``mlartifacts/``, beside the database), its weights files (*.pt, *.safetensors) and the run's
``model.pt``. Model sizes do not depend on the data.

    PYTHONPATH=tests .venv/bin/python bench/bench_mlflow_model_modes.py [--modes copy reference false]
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import yaml

WEIGHTS = (".pt", ".safetensors")


def measure(root: Path, mode: str) -> dict[str, int]:
    from protoclip.files.layout import Layout
    from protoclip.project import load_config
    from protoclip.train.stage import run_train
    from testkit.training import tiny_project

    value = {"true": True, "false": False}.get(mode, mode)
    run = {"method": "clip", "teacher": None, "model": "tiny-rn", "head_hidden": 512,
           "epochs": 1.0, "episode_size": 32, "batch_size": 16, "warmup_episodes": 1, "num_workers": 0,
           "device": "cpu", "data": ["offline"], "image_size": 32}
    cfg = load_config(tiny_project(root, {
        "paths": {"mlflow_log_models": value, "mlflow_system_metrics": False, "keep_finished_checkpoints": False},
        "prepare": {"eval_sets": []}, "train": run, "runs": {"clip": {}}}, n=48, size=32))
    run_train(cfg, "clip")
    files = [p for p in (root / "mlartifacts").rglob("*") if p.is_file()]
    return {"artifacts": sum(p.stat().st_size for p in files),
            "weights": sum(p.stat().st_size for p in files if p.suffix in WEIGHTS),
            "files": len(files), "model_pt": Layout.from_config(cfg).model("clip").stat().st_size}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--modes", nargs="+", default=["copy", "reference", "false"])
    modes = ap.parse_args().modes
    for mode in modes:  # a store per mode (absolute paths: MLflow keeps one engine per store URI)
        with tempfile.TemporaryDirectory(prefix=f"mlflow-{mode}-") as tmp:
            out = measure(Path(tmp), mode)
        print(yaml.safe_dump({f"mlflow_log_models: {mode}": out}, sort_keys=False).strip(), flush=True)


if __name__ == "__main__":
    main()
