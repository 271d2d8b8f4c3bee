"""PAUC's NEMD toy experiment (protoclip.toy.pauc_nemd): runs end to end on a tiny config, writes its outputs, and
its NEMD is the evaluation suite's own function."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from protoclip.project import load_config
from protoclip.evaluate.metrics import nemd as nemd_metric
from protoclip.files.layout import Layout
from protoclip.toy import pauc_nemd
from protoclip.toy.config import ToyConfig
from protoclip.toy.stage import run_toy_nemd

TINY = {"n_classes": [3, 5], "samples_per_class": 30, "epochs": 3, "warmup_epochs": 1, "batch_size": 32,
        "queue_size": 64, "kmeans_iters": 5, "kmeans_redo": 1, "nemd_n_max": 20, "hidden": 16}


def test_blobs_shape_and_labels():
    x, y = pauc_nemd.make_blobs3d(4, ToyConfig(samples_per_class=10))
    assert x.shape == (40, 3) and x.dtype == np.float32 and sorted(np.unique(y)) == [0, 1, 2, 3]


def test_toy_stage_uses_the_suite_nemd_and_writes_outputs(tmp_path, monkeypatch):
    cfg_file = tmp_path / "config.yaml"
    cfg_file.write_text(f"paths: {{results_dir: {tmp_path / 'results'}}}\ntoy: {TINY}\n")
    cfg = load_config(cfg_file)
    calls = []
    real = nemd_metric.nemd

    def spy(features, labels, **kw):
        out = real(features, labels, **kw)
        calls.append((np.asarray(features).copy(), np.asarray(labels).copy(), kw, out["nemd"]))
        return out

    monkeypatch.setattr(nemd_metric, "nemd", spy)
    png = run_toy_nemd(cfg)
    assert len(calls) == 4  # 2 class counts x {PCL, PAUC}
    table = pd.read_csv(tmp_path / "results" / "toy" / "pauc_toy.csv")
    assert list(table.method) == ["pcl", "pauc", "pcl", "pauc"] and list(table.n_classes) == [3, 3, 5, 5]
    for (z, y, kw, value), row in zip(calls, table.itertuples()):
        assert z.shape == (30 * row.n_classes, 2)
        np.testing.assert_allclose(np.linalg.norm(z, axis=1), 1.0, rtol=1e-5)  # on the unit circle
        assert kw["n_max"] == 20 and row.nemd == pytest.approx(value)
        # the same value from the unpatched suite function on the same embeddings
        assert real(z, y, n_max=20, seed=0)["nemd"] == pytest.approx(row.nemd)
    assert png.exists() and png.stat().st_size > 1000
    assert (tmp_path / "results" / "toy" / "pauc_toy.md").read_text().count("| pauc |") == 2
    assert set(Layout.from_config(cfg).toy_files().values()) == {
        png, tmp_path / "results" / "toy" / "pauc_toy.csv", tmp_path / "results" / "toy" / "pauc_toy.md"}


def test_toy_pcl_and_pauc_differ_only_by_the_regularisers():
    cfg = ToyConfig(**{**TINY, "pauc_alpha": 0.0, "pauc_beta": 0.0, "pauc_gamma": 0.0})
    x, _ = pauc_nemd.make_blobs3d(3, cfg)
    z1, h1 = pauc_nemd.train_toy(x, 3, "pcl", cfg)
    z2, h2 = pauc_nemd.train_toy(x, 3, "pauc", cfg)
    np.testing.assert_array_equal(z1, z2)  # zero weights: PAUC is PCL exactly (same seeds, same draws)
    assert "pauc_unif" in h2[-1] and "pauc_unif" not in h1[-1] and "protonce" in h1[-1]
    assert "protonce" not in h1[0]  # warm-up epoch: InfoNCE only
