"""`run_evaluate` end to end on a tiny untrained model and tiny fixture sets; feature cache behaviour."""
from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from protoclip import models

from protoclip.files import records
from protoclip.errors import ConfigError
from protoclip.evaluate.config import EvalDatasetConfig
from protoclip.evaluate.datasets import LabelledSet, load_eval_set
from protoclip.evaluate.features import FeatureExtractor, encode_images
from protoclip.evaluate.adapters import SetInput, zeroshot_classifier
from protoclip.evaluate.collect import run_collect, summary_table
from protoclip.evaluate.plan import not_applicable, static_tasks
from protoclip.evaluate.stage import run_evaluate
from protoclip.files.hashing import sha256_file
from protoclip.files.layout import Layout
from testkit.evaluation import RUN, RecordingTracker
from testkit.handoffs import WatchedConfig, protocol_members, spy_handoffs
from testkit.training import one_thread

_threads = pytest.fixture(autouse=True)(one_thread)


def test_run_evaluate_end_to_end(project):
    cfg, layout = project
    written = run_evaluate(cfg, RUN) + [run_collect(cfg, RUN)]  # what `protoclip evaluate` without --dataset does
    expect = {("zeroshot", "digits"), ("linear", "digits"), ("knn", "digits"), ("clustering", "digits"),
              ("nemd", "digits"), ("tsne", "digits"),
              ("zeroshot", "heldout_pairs"), ("linear", "heldout_pairs"), ("knn", "heldout_pairs"), ("retrieval", "heldout_pairs"),
              ("clustering", "heldout_pairs"), ("nemd", "heldout_pairs"), ("tsne", "heldout_pairs"),
              ("temperature", "heldout_pairs"),  # digits: a single-token run without captions, not run
              ("retrieval", "coco"), ("temperature", "coco")} | {(t, "cifar10") for t in
                                       ("zeroshot", "linear", "knn", "clustering", "nemd", "tsne", "temperature")}
    files = {(task, ds) for task, ds, _ in records.metrics_files(layout, RUN)}
    assert files == expect
    assert layout.metrics_summary(RUN) in written
    for task, ds in expect:
        data = json.loads(layout.metrics(RUN, task, ds).read_text())
        assert data["run"] == RUN and data["dataset"] == ds and data["task"] == task
        if ds == "cifar10":
            assert data["skipped"] == "skipped: cifar10 path not configured"
            continue
        if ds == "coco":
            assert data["skipped"] == f"skipped: coco not found at {cfg.evaluate.datasets['coco'].path}"
            continue
        m = data["metrics"]
        assert "git_commit" in data["provenance"] and data["features"]
        if task in ("zeroshot", "linear", "knn"):
            assert 0.0 <= m["top1"] <= 100.0 and data["n_test"] == (20 if ds == "digits" else 6)
        if task in ("linear", "knn"):
            assert data["n_train"] == (20 if ds == "digits" else 10)
        if task == "retrieval":
            assert (data["n_images"], data["n_texts"]) == (6, 6)
            assert all(0.0 <= m[k] <= 100.0 for k in m if "R@" in k)
            assert m["image_to_text_R@10"] == 100.0  # only 6 candidates: every query hits within 10
        if task == "clustering":
            assert -1.0 <= m["ari"] <= 1.0 and -1.0 <= m["ami"] <= 1.0
        if task == "nemd":
            assert 0.0 <= m["nemd"] <= 2.0 and 0.0 <= m["z_image"]["nemd"] <= 2.0
        if task == "tsne":
            assert Path(m["figure"]) == layout.tsne_figure(RUN, ds) and Path(m["figure"]).stat().st_size > 0
    zs = json.loads(layout.metrics(RUN, "zeroshot", "digits").read_text())["metrics"]
    assert zs["n_classes"] == 10 and zs["top1"] <= zs["top5"]
    check_examples_reproduce_metrics(layout, RUN, expect)
    summary = json.loads(layout.metrics_summary(RUN).read_text())
    assert summary["knn"]["digits"]["top1"] == json.loads(layout.metrics(RUN, "knn", "digits").read_text())[
        "metrics"]["top1"]
    assert records.skip_line(summary["zeroshot"]["cifar10"]) == "skipped: cifar10 path not configured"
    assert records.status_of(summary["zeroshot"]["cifar10"]).state == "missing"
    assert layout.features(RUN, "digits").exists() and layout.features(RUN, "heldout_pairs").exists()

    import mlflow  # the numbers also landed in the run's MLflow run (found by its protoclip.run tag)

    mlflow.set_tracking_uri(cfg.paths.mlflow_uri)
    found = mlflow.search_runs(experiment_names=[cfg.paths.mlflow_experiment],
                               filter_string=f"tags.`protoclip.run` = '{RUN}'", output_format="list")
    logged = found[0].data.metrics
    assert logged["eval/knn/digits/top1"] == pytest.approx(summary["knn"]["digits"]["top1"])
    assert "eval/retrieval/heldout_pairs/image_to_text_R_at_1" in logged


def check_examples_reproduce_metrics(layout: Layout, run: str, evaluated: set) -> None:
    """Each task that scores examples kept them, vouched for by tasks.json, and they give the metrics file's
    numbers to the last bit (the claims ledger bootstraps these arrays, never the features again)."""
    for task, ds in sorted(evaluated):
        m = records.read_metrics(layout.metrics(run, task, ds))
        ex = records.read_examples(layout, run, task, ds)
        if records.skip_line(m) is not None or task not in ("zeroshot", "linear", "knn", "retrieval", "clustering"):
            assert ex is None and not layout.examples(run, task, ds).exists(), (task, ds)
            continue
        assert ex is not None, (task, ds)
        if task == "clustering":  # the chosen k-means run's assignments: its ARI and AMI again
            from sklearn.metrics import adjusted_mutual_info_score, adjusted_rand_score

            assert m["ari"] == adjusted_rand_score(ex["labels"], ex["cluster"])
            assert m["ami"] == adjusted_mutual_info_score(ex["labels"], ex["cluster"])
            continue
        if task == "retrieval":
            assert len(ex["image_to_text_rank"]) == json.loads(layout.metrics(run, task, ds).read_text())["n_images"]
            recalls = []
            for direction in ("image_to_text", "text_to_image"):
                rank = ex[f"{direction}_rank"]
                for k in (1, 5, 10):
                    assert m[f"{direction}_R@{k}"] == 100.0 * int((rank < k).sum()) / len(rank)
                    recalls.append(m[f"{direction}_R@{k}"])
            assert m["mean_recall"] == float(np.mean(recalls))
            assert np.array_equal(np.unique(ex["text_to_image"]), np.arange(len(ex["image_to_text_rank"])))
            continue
        assert len(ex["labels"]) == len(ex["top1"]) == json.loads(layout.metrics(run, task, ds).read_text())["n_test"]
        for key in ("top1", "top5"):
            if key not in m:
                assert key not in ex
                continue
            hits = ex[key]
            assert hits.dtype == bool
            # the L-BFGS probe reports 100 * mean (unchanged); the others 100 * hits / n
            assert m[key] == (100.0 * float(hits.mean()) if task == "linear" else 100.0 * int(hits.sum()) / len(hits))


def test_subset_logs_through_tracker(project, monkeypatch):
    cfg, layout = project
    tracker = RecordingTracker()
    calls = []

    @contextmanager
    def fake_evaluation_run(paths, run, model_sha256, targets):
        calls.append((run, model_sha256))
        yield tracker

    monkeypatch.setattr("protoclip.evaluate.stage.evaluation_run", fake_evaluation_run)
    written = run_evaluate(cfg, RUN, tasks=["knn", "retrieval"], datasets=["digits", "heldout_pairs"])
    # the MLflow run is the one of the evaluated model (found by its sha256)
    assert calls == [(RUN, sha256_file(layout.model(RUN)))]
    # a job per set writes only its set's files; `protoclip collect` writes metrics.json
    assert {p.relative_to(layout.run_dir(RUN)).as_posix() for p in written} == {
        "eval/digits/knn.json", "eval/heldout_pairs/knn.json", "eval/heldout_pairs/retrieval.json"}
    assert not layout.metrics_summary(RUN).exists()
    assert json.loads(layout.eval_tasks(RUN, "heldout_pairs").read_text())["tasks"] == {"knn": "ran", "retrieval": "ran"}
    run_collect(cfg, RUN)
    summary = json.loads(layout.metrics_summary(RUN).read_text())
    assert summary["knn"]["digits"]["top1"] == json.loads(layout.metrics(RUN, "knn", "digits").read_text())[
        "metrics"]["top1"] and "top1" in summary["knn"]["heldout_pairs"]
    # sets with no evaluation folder are reported skipped, with the reason
    assert summary["zeroshot"]["cifar10"] == {"skipped": "skipped: cifar10 path not configured", "status": {
        "state": "missing", "reason": "skipped: cifar10 path not configured", "detail": ""}}
    knn = json.loads(layout.metrics(RUN, "knn", "digits").read_text())["metrics"]
    assert tracker.metrics["eval/knn/digits/top1"] == knn["top1"]
    assert "eval/retrieval/heldout_pairs/image_to_text_R_at_1" in tracker.metrics  # '@' is not allowed in MLflow


def test_unknown_names(project):
    cfg, layout = project
    with pytest.raises(ConfigError, match="not under evaluate.datasets"):
        run_evaluate(cfg, RUN, datasets=["nope"])
    with pytest.raises(ConfigError, match="unknown evaluation task"):
        run_evaluate(cfg, RUN, tasks=["bogus"])


def test_feature_cache_reused_and_invalidated(project, monkeypatch, tmp_path):
    cfg, layout = project
    ds = load_eval_set("digits", cfg.evaluate.datasets["digits"], layout)
    cache = layout.features(RUN, "digits")
    ex = FeatureExtractor(layout.model(RUN), device="cpu", batch_size=4)
    first = ex.features(cache, ds)
    # no zero-shot classifier: the zero-shot task builds it
    assert set(first.arrays()) == {"test_z", "test_h", "test_y", "train_z", "train_h", "train_y"}
    assert first.test_z.shape == (20, 128) and first.test_h.shape == (20, 16)
    x = SetInput(first, ds, cfg.evaluate, tmp_path / "f.png", ex.similarity, ex)
    classes = zeroshot_classifier(x)
    assert classes.shape == (10, 128) and zeroshot_classifier(x) is classes  # built once per set
    np.testing.assert_allclose(np.linalg.norm(classes, axis=1), 1.0, rtol=1e-5)

    # independent oracle: batch size 1 must give the same z and h as the batched pass
    z1, h1, y1 = encode_images(ex.model, ds.test, ex.transform, ex.device, batch_size=1)
    np.testing.assert_allclose(first.test_z, z1, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(first.test_h, h1, rtol=1e-4, atol=1e-5)
    assert list(y1) == [y for _, y in ds.test]

    # a cache hit never loads the model
    ex2 = FeatureExtractor(layout.model(RUN), device="cpu")
    monkeypatch.setattr(ex2, "extract", lambda _ds: pytest.fail("cache miss on unchanged model"))
    np.testing.assert_array_equal(ex2.features(cache, ds).test_z, first.test_z)

    # a retrained model.pt (different bytes) invalidates the cache
    torch.manual_seed(1)
    models.save_model(layout.model(RUN), models.build_model("tiny-rn", head_hidden=32, head_out=16), {})
    ex3 = FeatureExtractor(layout.model(RUN), device="cpu")
    assert ex3.model_sha256 != ex.model_sha256
    third = ex3.features(cache, ds)
    assert not np.allclose(third.test_z, first.test_z)


def test_applicability_rules():
    off = EvalDatasetConfig(kind="offline")
    assert "retrieval" not in static_tasks("digits", off) and "zeroshot" in static_tasks("digits", off)
    assert "zeroshot" in static_tasks("heldout_pairs", off) and "retrieval" in static_tasks("heldout_pairs", off)
    assert static_tasks("coco", EvalDatasetConfig(kind="coco", path="/x")) == ["retrieval", "temperature"]
    ds = LabelledSet("x", ["a", "b"], [], test=[(None, 0)], train=None)
    assert not_applicable("zeroshot", ds) == "no prompt templates"
    assert not_applicable("knn", ds) == "no train split"
    assert not_applicable("retrieval", ds) == "no captions"
    assert not_applicable("clustering", ds) is None


def test_summary_table_lines():
    table = summary_table({"knn": {"digits": {"top1": 91.23456}}, "zeroshot": {"cifar10": {"skipped": "skipped: x"}}})
    lines = table.splitlines()  # sorted by data set, then task
    assert lines[0].split() == ["dataset", "task", "result"]
    assert lines[1].split()[:2] == ["cifar10", "zeroshot"] and lines[1].endswith("skipped: x")
    assert lines[2].split() == ["digits", "knn", "top1", "=", "91.23"]


def test_heldout_without_labels_runs_retrieval_only(project, monkeypatch):
    cfg, layout = project
    df = pd.read_parquet(layout.manifest)
    df["label"] = ""
    df.to_parquet(layout.manifest)

    @contextmanager
    def fake_evaluation_run(paths, run, model_sha256, targets):
        yield RecordingTracker()

    monkeypatch.setattr("protoclip.evaluate.stage.evaluation_run", fake_evaluation_run)
    written = run_evaluate(cfg, RUN, tasks=["knn", "clustering", "retrieval"], datasets=["heldout_pairs"])
    assert {p.relative_to(layout.run_dir(RUN)).as_posix() for p in written} == {"eval/heldout_pairs/retrieval.json"}
    status = json.loads(layout.eval_tasks(RUN, "heldout_pairs").read_text())["tasks"]
    assert status == {"retrieval": "ran", "knn": "not applicable: no train split",
                      "clustering": "not applicable: empty test split"}


def test_test_only_copy_keeps_the_set_and_skips_the_probes_with_the_reason(project, monkeypatch, tmp_path):
    """A Rendered SST2 copy in torchvision's layout with its test split only: zero-shot and clustering run, the
    probes' cells carry why they did not (the train split is not there)."""
    cfg, layout = project
    root = tmp_path / "sst2"
    for c, cls in enumerate(("negative", "positive")):
        for i in range(3):
            path = root / "rendered-sst2" / "test" / cls / f"{i}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.full((16, 16, 3), 60 + 100 * c + 5 * i, np.uint8)).save(path)
    cfg.evaluate.datasets["rendered_sst2"] = EvalDatasetConfig(kind="torchvision", path=str(root))

    @contextmanager
    def fake_evaluation_run(paths, run, model_sha256, targets):
        yield RecordingTracker()

    monkeypatch.setattr("protoclip.evaluate.stage.evaluation_run", fake_evaluation_run)
    run_evaluate(cfg, RUN, tasks=["zeroshot", "knn", "clustering"], datasets=["rendered_sst2"])
    zs = json.loads(layout.metrics(RUN, "zeroshot", "rendered_sst2").read_text())
    assert zs["n_test"] == 6 and zs["metrics"]["n_classes"] == 2
    knn = json.loads(layout.metrics(RUN, "knn", "rendered_sst2").read_text())
    assert knn["skipped"].startswith(f"skipped: rendered_sst2: no train split in {root / 'rendered-sst2'}")
    status = json.loads(layout.eval_tasks(RUN, "rendered_sst2").read_text())["tasks"]
    assert status["zeroshot"] == status["clustering"] == "ran" and status["knn"] == knn["skipped"]


def test_collect_starts_without_torch():
    """`protoclip collect` runs once per run on the main node: its imports must not pull torch / open_clip
    (~8 s per job on 2 cores, 48 jobs in the offline default)."""
    import subprocess
    import sys

    code = ("import sys; from protoclip.evaluate.collect import run_collect; "
            "print(sorted(m for m in ('torch', 'open_clip', 'sklearn') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_an_evaluation_without_probe_or_kmeans_leaves_sklearn_unimported():
    """scikit-learn is imported where a linear probe or k-means runs, not with the metrics package: a kNN,
    zero-shot or retrieval job does not pay for it (~1.7 CPU s per process on 2 cores). The kNN run here scores
    test points equal to their training points: 100 %."""
    import subprocess
    import sys

    code = ("import sys, numpy as np; import protoclip.evaluate.metrics, protoclip.evaluate.adapters, "
            "protoclip.evaluate.stage; from protoclip.evaluate.metrics import knn_classifier; "
            "x = np.eye(2, dtype=np.float32).repeat(3, axis=0); y = np.array([0, 0, 0, 1, 1, 1]); "
            "print(knn_classifier(x, y, x, y, k=3)['top1'], 'sklearn' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["100.0", "False"]


def test_the_stage_reads_its_protocol_and_hands_on_no_project_config(project, monkeypatch):
    """run_evaluate reads of the project config only what EvaluateProject names, and none of its parts receives
    the config: the request check, the task params, the feature extractor, the per-set evaluation and the MLflow
    run (tracking.evaluation_run: the ``paths`` section and the run's paper targets) get their own values."""
    import protoclip.evaluate.stage as stage
    from protoclip.evaluate.config import EvaluateProject

    cfg, layout = project
    watched = WatchedConfig(cfg)
    handed = spy_handoffs(monkeypatch, stage, ["_requested", "task_params", "_extractor", "SetEvaluation"], watched)
    tracked: list[tuple] = []

    @contextmanager
    def fake_evaluation_run(paths, run, model_sha256, targets):
        tracked.append((paths is cfg.paths, run, targets))
        yield RecordingTracker()

    monkeypatch.setattr(stage, "evaluation_run", fake_evaluation_run)
    written = stage.run_evaluate(watched, RUN, tasks=["knn"], datasets=["digits"])
    assert [p.relative_to(layout.run_dir(RUN)).as_posix() for p in written] == ["eval/digits/knn.json"]
    members = protocol_members(EvaluateProject)
    assert watched.read and watched.read <= members, watched.read - members
    assert handed == [] and tracked == [(True, RUN, cfg.run_targets(RUN))]
    assert "git_commit" in json.loads(layout.metrics(RUN, "knn", "digits").read_text())["provenance"]
