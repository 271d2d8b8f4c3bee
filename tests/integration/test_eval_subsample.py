"""The fixed probe subsample of evaluation sets (evaluate.datasets.<set>.max_train / max_test).

Deterministic, class-stratified (each class within 1 of proportional), the same images for every run, small
splits left whole, caption retrieval untouched, recorded in the metrics files and in the feature cache key.
"""
from __future__ import annotations

import json
from contextlib import contextmanager

import numpy as np
import pandas as pd
import pytest
import torch

from protoclip.project import PathsConfig, ProjectConfig
from protoclip.errors import ConfigError
from protoclip.evaluate.config import EvalDatasetConfig, EvaluateConfig
from protoclip.evaluate.datasets import (
    ArraySplit,
    FileSplit,
    LabelledSet,
    SubsetSplit,
    TorchvisionSplit,
    load_eval_set,
    stratified_indices,
    subsample_indices,
    subsample_set,
)
from protoclip.files.layout import Layout
from protoclip.config.strict import build
from testkit import REPO


# --------------------------------------------------------------------------- fixtures
def _npz(layout: Layout, name: str = "digits", n_train_per_class: int = 8, n_test_per_class: int = 4) -> dict:
    """A 10-class offline set whose every image is distinct (its first pixel holds the row number)."""
    labels = np.concatenate([np.repeat(np.arange(10), n_train_per_class), np.repeat(np.arange(10), n_test_per_class)])
    split = np.array(["train"] * (10 * n_train_per_class) + ["test"] * (10 * n_test_per_class))
    rng = np.random.default_rng(0)
    images = np.clip(labels[:, None, None, None] * 20 + rng.integers(0, 30, (len(labels), 16, 16, 3)), 0, 255)
    images = images.astype(np.uint8)
    images[:, 0, 0, 0] = np.arange(len(labels)) % 256  # row id, so images can be matched back to rows
    images[:, 0, 0, 1] = np.arange(len(labels)) // 256
    layout.eval_set(name).parent.mkdir(parents=True, exist_ok=True)
    np.savez(layout.eval_set(name), images=images, labels=labels, split=split,
             classnames=np.array([str(i) for i in range(10)]))
    return {"images": images, "labels": labels, "split": split}


def _row_ids(split: ArraySplit) -> np.ndarray:
    return split.images[:, 0, 0, 0].astype(np.int64) + 256 * split.images[:, 0, 0, 1].astype(np.int64)


# --------------------------------------------------------------------------- indices
def test_stratified_within_one_of_proportional_and_deterministic():
    labels = np.repeat([0, 1, 2, 3, 4], [50, 30, 15, 4, 1])  # imbalanced, 100 items
    rng_labels = np.random.default_rng(3).permutation(labels)  # classes interleaved, as real splits are
    for n in (1, 7, 37, 60, 99):
        idx = subsample_indices("fashion_mnist", "train", len(rng_labels), n, seed=0, labels=rng_labels)
        again = subsample_indices("fashion_mnist", "train", len(rng_labels), n, seed=0, labels=rng_labels)
        np.testing.assert_array_equal(idx, again)  # same indices twice
        assert len(idx) == n == len(np.unique(idx)) and np.all(np.diff(idx) > 0)  # distinct, original order
        got = np.bincount(rng_labels[idx], minlength=5)
        proportional = n * np.bincount(rng_labels, minlength=5) / len(rng_labels)  # float64 oracle
        assert np.all(np.abs(got - proportional) < 1), (n, got, proportional)
    # another seed or another set name draws other items (same class counts)
    a = subsample_indices("fashion_mnist", "train", 100, 37, seed=0, labels=rng_labels)
    assert not np.array_equal(a, subsample_indices("fashion_mnist", "train", 100, 37, seed=1, labels=rng_labels))
    assert not np.array_equal(a, subsample_indices("digits", "train", 100, 37, seed=0, labels=rng_labels))


def test_largest_remainder_quota_known_answer():
    # 3 classes of 5, 3, 2 items, n = 5: exact 2.5, 1.5, 1.0 -> floors 2, 1, 1 and the one left over goes to
    # the largest remainder, ties to the lower class id: 3, 1, 1
    labels = np.array([0] * 5 + [1] * 3 + [2] * 2)
    idx = stratified_indices(labels, 5, np.random.default_rng(0))
    assert list(np.bincount(labels[idx], minlength=3)) == [3, 1, 1]


def test_uniform_when_labels_are_not_cheap():
    class NoTargets:  # a torchvision-like set without targets / _labels / labels: labels need decoding
        def __len__(self):
            return 30

        def __getitem__(self, i):
            return np.full((4, 4, 3), i, np.uint8), i % 3

    ds = LabelledSet("odd", ["a", "b", "c"], [], test=TorchvisionSplit(NoTargets()), train=None)
    out = subsample_set(ds, max_train=None, max_test=12, seed=0)
    assert isinstance(out.test, SubsetSplit) and len(out.test) == 12
    assert out.subsample["test"] == {"n": 12, "of": 30, "how": "uniform"}
    picked = [int(np.asarray(img)[0, 0, 0]) for img, _ in out.test]
    assert picked == sorted(set(picked)) and picked == list(out.test.indices)
    np.testing.assert_array_equal(out.test.indices, subsample_indices("odd", "test", 30, 12, seed=0))


def test_torchvision_targets_and_file_lists_are_stratified():
    class WithTargets:
        targets = [i % 4 for i in range(40)]

        def __len__(self):
            return 40

        def __getitem__(self, i):
            return np.zeros((2, 2, 3), np.uint8), self.targets[i]

    ds = LabelledSet("tv", list("abcd"), [], test=TorchvisionSplit(WithTargets()),
                     train=FileSplit([f"/x/{i}.png" for i in range(40)], [i % 4 for i in range(40)]))
    out = subsample_set(ds, max_train=8, max_test=12, seed=0)
    assert out.subsample["test"]["how"] == out.subsample["train"]["how"] == "class-stratified"
    assert np.bincount([y for _, y in out.test]).tolist() == [3, 3, 3, 3]
    assert isinstance(out.train, FileSplit) and np.bincount(out.train.labels).tolist() == [2, 2, 2, 2]
    assert all(out.train.paths[j] == f"/x/{i}.png" for j, i in enumerate(
        subsample_indices("tv", "train", 40, 8, seed=0, labels=np.arange(40) % 4)))


# --------------------------------------------------------------------------- load_eval_set
def test_load_eval_set_subsample_small_splits_whole_and_deterministic(tmp_path):
    layout = Layout(tmp_path / "data", tmp_path / "results")
    arrays = _npz(layout)
    cfg = EvalDatasetConfig(kind="offline", max_train=20, max_test=1000)
    ds = load_eval_set("digits", cfg, layout, seed=0)
    assert (len(ds.train), len(ds.test)) == (20, 40)
    assert np.bincount(ds.train.labels).tolist() == [2] * 10  # stratified: 2 of the 8 per class
    assert ds.subsample == {"max_train": 20, "max_test": 1000, "seed": 0,
                            "train": {"n": 20, "of": 80, "how": "class-stratified"},
                            "test": {"n": 40, "of": 40, "how": "whole"}}  # the small split stays whole
    rows = _row_ids(ds.train)
    assert np.all(np.diff(rows) > 0) and np.all(arrays["split"][rows] == "train")  # original order
    np.testing.assert_array_equal(arrays["labels"][rows], ds.train.labels)  # labels follow their images
    np.testing.assert_array_equal(arrays["images"][rows], ds.train.images)
    again = load_eval_set("digits", cfg, layout, seed=0)
    np.testing.assert_array_equal(_row_ids(again.train), rows)  # same images on every load
    other = load_eval_set("digits", cfg, layout, seed=1)
    assert not np.array_equal(_row_ids(other.train), rows)  # evaluate.seed picks the subset
    whole = load_eval_set("digits", EvalDatasetConfig(kind="offline"), layout)
    assert whole.subsample is None and (len(whole.train), len(whole.test)) == (80, 40)


def test_heldout_pairs_captions_are_not_cut(tiny_manifest):
    df = pd.read_parquet(tiny_manifest.manifest)
    n_held = int((df["split"] == "heldout").sum())
    ds = load_eval_set("heldout_pairs", EvalDatasetConfig(kind="offline", max_train=6, max_test=3), tiny_manifest)
    assert (len(ds.train), len(ds.test)) == (6, 3)
    assert len(ds.captions.images) == len(ds.captions.captions) == n_held  # retrieval keeps every pair


@pytest.mark.parametrize("key", ["max_train", "max_test"])
def test_max_zero_is_rejected_naming_the_key(key):
    with pytest.raises(ConfigError, match=rf"evaluate\.datasets\.digits\.{key} must be >= 1"):
        build(EvaluateConfig, {"datasets": {"digits": {"kind": "offline", key: 0}}}, "cfg.yaml", "evaluate.")
    with pytest.raises(ConfigError, match=rf"'evaluate\.datasets\.digits\.{key}' must be"):
        build(EvaluateConfig, {"datasets": {"digits": {"kind": "offline", key: "many"}}}, "cfg.yaml", "evaluate.")
    ok = build(EvaluateConfig, {"datasets": {"digits": {"kind": "offline", key: 1}}}, "cfg.yaml", "evaluate.")
    assert getattr(ok.datasets["digits"], key) == 1


# --------------------------------------------------------------------------- end to end
@pytest.fixture
def two_runs(tmp_path):
    """Two runs with different (untrained) models, and digits with a subsample configured."""
    from protoclip import models
    cfg = ProjectConfig()
    cfg.paths = PathsConfig(data_dir=tmp_path / "data", results_dir=tmp_path / "results",
                            mlflow_uri=f"sqlite:///{tmp_path}/mlflow.db")
    cfg.evaluate = EvaluateConfig(datasets={"digits": EvalDatasetConfig(kind="offline", max_train=30, max_test=10)},
                                  batch_size=16, device="cpu", seed=0)
    cfg._runs = {run: ({"method": "clip"}, "<test>") for run in ("run_a", "run_b")}  # their model files decide how
    layout = Layout.from_config(cfg)
    _npz(layout)
    for seed, run in enumerate(("run_a", "run_b")):
        torch.manual_seed(seed)
        models.save_model(layout.model(run), models.build_model("tiny-rn", head_hidden=32, head_out=16),
                          {"model": "tiny-rn"})
    return cfg, layout


class _Tracker:
    def log_params(self, params): ...

    def log_metrics(self, metrics, step=None): ...

    def log_artifact(self, path, artifact_path=None): ...


def test_evaluation_records_subsample_same_images_for_every_run(two_runs, monkeypatch):
    from protoclip.evaluate import stage
    from protoclip.evaluate.features import FeatureExtractor

    cfg, layout = two_runs
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # 2 shared cores

    @contextmanager
    def fake_evaluation_run(paths, run, model_sha256, targets):
        yield _Tracker()

    seen: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    extract = FeatureExtractor.extract

    def recording_extract(self, ds, progress=None):
        seen[self.model_path.parent.name] = (_row_ids(ds.train), _row_ids(ds.test))
        return extract(self, ds, progress)

    monkeypatch.setattr(stage, "evaluation_run", fake_evaluation_run)
    monkeypatch.setattr(FeatureExtractor, "extract", recording_extract)
    try:
        for run in ("run_a", "run_b"):
            stage.run_evaluate(cfg, run, tasks=["linear", "knn", "clustering"], datasets=["digits"])
    finally:
        torch.set_num_threads(before)
    assert set(seen) == {"run_a", "run_b"}
    for a, b in zip(seen["run_a"], seen["run_b"]):
        np.testing.assert_array_equal(a, b)  # both runs are probed on the same images
    expected = {"max_train": 30, "max_test": 10, "seed": 0, "train": {"n": 30, "of": 80, "how": "class-stratified"},
                "test": {"n": 10, "of": 40, "how": "class-stratified"}}
    for run in ("run_a", "run_b"):
        for task in ("linear", "knn"):
            data = json.loads(layout.metrics(run, task, "digits").read_text())
            assert (data["n_train"], data["n_test"]) == (30, 10) and data["subsample"] == expected
        clustering = json.loads(layout.metrics(run, "clustering", "digits").read_text())
        assert clustering["n_test"] == 10 and clustering["subsample"] == expected
        assert json.loads(layout.eval_tasks(run, "digits").read_text())["subsample"] == expected
    a_feats = np.load(layout.features("run_a", "digits"))
    assert a_feats["train_z"].shape[0] == 30 and a_feats["test_z"].shape[0] == 10

    # the feature cache is not reused across a changed subsample, even at the same sizes (another seed)
    ex = FeatureExtractor(layout.model("run_a"), device="cpu")
    ds0 = load_eval_set("digits", cfg.evaluate.datasets["digits"], layout, seed=0)
    ds1 = load_eval_set("digits", cfg.evaluate.datasets["digits"], layout, seed=1)
    assert ex.cache_key(ds0)["subsample"] == expected and ex.cache_key(ds0) != ex.cache_key(ds1)
    assert json.loads(str(a_feats["meta_json"])) == ex.cache_key(ds0)
    assert "subsample" not in ex.cache_key(load_eval_set("digits", EvalDatasetConfig(kind="offline"), layout))
    seen.clear()
    cfg.evaluate.seed = 1
    torch.set_num_threads(1)
    try:
        stage.run_evaluate(cfg, "run_a", tasks=["knn"], datasets=["digits"])
    finally:
        torch.set_num_threads(before)
    assert "run_a" in seen  # re-extracted on the other subsample
    assert json.loads(layout.metrics("run_a", "knn", "digits").read_text())["subsample"]["seed"] == 1


def test_config_yaml_sets_the_offline_fashion_mnist_subsample():
    from protoclip.project import load_config

    root = REPO
    for name in ("config.yaml", "ci.yaml"):
        fm = load_config(root / "config" / name).evaluate.datasets["fashion_mnist"]
        assert (fm.kind, fm.max_train, fm.max_test) == ("offline", 5000, 5000), name
    paper = load_config(root / "config" / "paper.yaml").evaluate.datasets
    assert all(d.max_train is None and d.max_test is None for d in paper.values())  # paper: whole sets
