"""Synthetic results for the runs of a shipped config: metrics files, train logs, feature caches with known values."""
from __future__ import annotations

import json
import shutil
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from protoclip.files import records
from protoclip.dag.stages import evaluation_requests
from protoclip.files.layout import Layout
from testkit import REPO as ROOT
from testkit import SHARED
from testkit.results import mark_evaluated

PAPER_TXT = SHARED / "papers" / "protoclip.txt"
ALL_TARGETS = ["table_III", "table_IV", "table_V", "table_VI", "table_VII", "table_VIII", "table_X", "table_XI",
               "table_XII", "fig_6a", "fig_6b", "fig_6c", "fig_6d", "fig_7", "fig_8", "fig_9", "table_methods",
               "fig_temperature"]


def write(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False) if path.suffix == ".yaml" else json.dumps(data))
    return path


def project_copy(tmp_path: Path, config: str = "config.yaml") -> Path:
    """The shipped config folder copied under tmp_path, results going to tmp_path/results."""
    shutil.copytree(ROOT / "config", tmp_path / "config")
    cfg_file = tmp_path / "config" / config
    data = yaml.safe_load(cfg_file.read_text())
    data["paths"] = {**data.get("paths", {}), "results_dir": str(tmp_path / "results"),
                     "data_dir": str(tmp_path / "data"), "mlflow_uri": f"sqlite:///{tmp_path}/mlflow.db"}
    cfg_file.write_text(yaml.safe_dump(data, sort_keys=False))
    return cfg_file


def metric_value(run: str, task: str, dataset: str, metric: str) -> float:
    """A deterministic synthetic value per (run, task, set, metric) in [10, 90] (ARI/AMI in [0.1, 0.9])."""
    h = sum(ord(c) * (i + 1) for i, c in enumerate(f"{run}|{task}|{dataset}|{metric}")) % 800
    v = 10.0 + h / 10.0
    return v / 100.0 if metric in ("ari", "ami") else v


def synthesize(cfg, examples: bool = False) -> None:
    """Metrics files (the paper sets skipped, as offline), train logs, and feature caches for every run; with
    ``examples``, zero-shot / linear / kNN per-example results on 1,000 test images whose accuracy is exactly
    the metrics file's top1 and top5 (the claims ledger and the tables' difference rows then have intervals)."""
    layout = Layout.from_config(cfg)
    metrics = {"zeroshot": ["top1", "top5"], "linear": ["top1"], "knn": ["top1"], "clustering": ["ari", "ami"],
               "nemd": ["nemd"], "temperature": ["n_pairs", "tokens"],
               "retrieval": ["mean_recall"] + [f"{d}_R@{k}" for d in ("image_to_text", "text_to_image")
                                               for k in (1, 5, 10)]}
    offline = {"heldout_pairs", "fashion_mnist", "digits"}
    for run, sets in evaluation_requests(cfg).items():
        for dataset, tasks in sets.items():
            for task in tasks:
                path = layout.metrics(run, task, dataset)
                if dataset not in offline:
                    line = f"skipped: {dataset} not found at data/external/{dataset}"
                    write(path, {"run": run, "task": task, "dataset": dataset, "skipped": line,
                                 "status": {"state": "missing", "reason": line}})
                    continue
                m = {k: metric_value(run, task, dataset, k) for k in metrics[task]}
                if task == "zeroshot":
                    m["n_classes"] = 10 if dataset != "heldout_pairs" else 40
                write(path, {"run": run, "task": task, "dataset": dataset, "metrics": m})
                if examples and task in ("zeroshot", "linear", "knn"):
                    rng_ex = np.random.default_rng(zlib.crc32(f"{run}|{task}|{dataset}".encode()))
                    hits = {k: rng_ex.permutation(np.arange(1000) < round(10 * m[k])) for k in ("top1", "top5")
                            if k in m}  # metric_value has one decimal: exactly m[k] % of 1,000
                    records.write_examples(layout.examples(run, task, dataset),
                                           {**hits, "labels": np.arange(1000) % 10})
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(4), 30)
    for i, run in enumerate(cfg.run_names()):
        episodes = [{"kind": "episode", "episode": e, "time/extract": 1.0 + i, "time/kmeans": 0.1,
                     "time/pbt": 0.01, "time/train": 3.0 + i} for e in range(3)]
        if cfg.run(run).method == "clip":
            for e in episodes:
                e["time/extract"], e["time/kmeans"], e["time/pbt"] = 0.0, 0.0, 0.0
        log = layout.train_log(run)
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("".join(json.dumps(r) + "\n" for r in [{"kind": "start"}] + episodes))
        feats = layout.features(run, "fashion_mnist")
        feats.parent.mkdir(parents=True, exist_ok=True)
        np.savez(feats, test_z=rng.normal(size=(len(y), 8)).astype(np.float32) + y[:, None], test_y=y)
    toy = layout.toy_files()["csv"]  # the toy-nemd stage's table, a report input (the ledger's PAUC toy claim)
    toy.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([{"n_classes": n, "method": m, "nemd": metric_value(m, "toy", str(n), "nemd") / 100}
                  for n in (10, 20, 30, 40, 50) for m in ("pcl", "pauc")]).to_csv(toy, index=False)
    mark_evaluated(layout.results_dir)
