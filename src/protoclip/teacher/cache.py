"""The `teacher` stage: cache PCA-reduced external-teacher features of every training caption (Sec. IV-A3).

The paper extracts RoBERTa-large features once, offline (the teacher is frozen), and reduces them from 1024
to 64 dimensions by PCA. This stage does the same for ``cfg.teacher.name``:

1. read the training captions of the manifest (``split == 'train'``), in manifest order;
2. encode them in chunks of ``cfg.teacher.chunk_size`` captions, each saved to
   ``data/teacher/.partial/<teacher>-<key>/chunk_NNNNN.npy``; a restarted run skips finished chunks;
3. fit PCA (scikit-learn, no whitening -- the official code uses faiss ``PCAMatrix`` with its default
   eigen_power 0, i.e. also no whitening) on all training features and project them;
4. write ``data/teacher/<teacher>.npz`` (``ids`` str [N], ``features`` float32 [N, pca_dim], ``pca_mean``
   [D], ``pca_components`` [pca_dim, D], ``explained_variance_ratio`` [pca_dim]) and a ``.json`` beside it
   (teacher, raw/PCA dims, explained variance, manifest / caption / weights sha256, created time, key).

Projected features are not re-normalised (as in the official ``RoBERTa.py``); consumers normalise if they
need to. A re-run whose key (teacher, weights hash, captions hash, pca_dim, max_length, seed) matches the
existing ``.json`` does no work.

    protoclip teacher                                  # via the CLI, or:
    from protoclip.teacher.cache import run_teacher, load_teacher_features
    ids, feats, meta = load_teacher_features(run_teacher(cfg))
"""
from __future__ import annotations

import hashlib
import json
import logging
import shutil
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.decomposition import PCA
from tqdm.auto import tqdm

from protoclip.atomic import atomic_path, write_json
from protoclip.atomic import clean_stale_temps_of
from protoclip.layout import Layout
from protoclip.teacher.encoders import (
    PACKAGED, TextTeacher, cached_weights, find_weights, packaged_path, load_text_teacher, sha256_file,
)

log = logging.getLogger(__name__)

FORMAT = "protoclip-teacher/1"


# --------------------------------------------------------------------------- inputs
def train_captions(layout: Layout) -> tuple[list[str], list[str]]:
    """(ids, captions) of the manifest's training split, in manifest order."""
    try:
        from protoclip.data.pairs import load_manifest
    except ImportError:  # the data package may not provide it yet: read the parquet directly
        load_manifest = None
    if load_manifest is not None:
        df = load_manifest(layout, split="train")
    else:
        if not layout.manifest.is_file():
            raise FileNotFoundError(f"manifest not found: {layout.manifest} (run `protoclip prepare` first)")
        df = pd.read_parquet(layout.manifest, columns=["id", "caption", "split"])
        df = df[df["split"] == "train"]
    if len(df) == 0:
        raise ValueError(f"{layout.manifest}: no training captions (split == 'train')")
    ids = df["id"].astype(str).tolist()
    if len(set(ids)) != len(ids):
        raise ValueError(f"{layout.manifest}: sample ids are not unique")
    return ids, df["caption"].fillna("").astype(str).tolist()


def captions_sha256(ids: list[str], captions: list[str]) -> str:
    h = hashlib.sha256()
    for i, c in zip(ids, captions):
        h.update(i.encode() + b"\x00" + c.encode() + b"\x01")
    return h.hexdigest()


def weights_path(name: str) -> Path | None:
    """The local weights file of teacher ``name`` without loading it (None when unknown)."""
    if name in PACKAGED:
        return find_weights(packaged_path(name))
    if Path(name).expanduser().is_dir():
        return find_weights(Path(name).expanduser())
    return cached_weights(name)


# --------------------------------------------------------------------------- encoding (resumable)
def encode_in_chunks(teacher: TextTeacher, captions: list[str], partial_dir: Path, chunk_size: int,
                     batch_size: int, max_length: int) -> np.ndarray:
    """Encode ``captions`` chunk by chunk, keeping finished chunks in ``partial_dir``; float32 [N, D]."""
    partial_dir.mkdir(parents=True, exist_ok=True)
    n_chunks = (len(captions) + chunk_size - 1) // chunk_size
    parts = []
    done = 0
    for c in tqdm(range(n_chunks), desc=f"teacher {teacher.name} chunks", unit="chunk", disable=n_chunks < 2):
        path = partial_dir / f"chunk_{c:05d}.npy"
        lo, hi = c * chunk_size, min(len(captions), (c + 1) * chunk_size)
        if path.is_file():
            feats = np.load(path)
            if feats.shape[0] != hi - lo:
                raise ValueError(f"{path}: {feats.shape[0]} rows, expected {hi - lo}; delete {partial_dir}")
            done += 1
        else:
            feats = teacher.encode(captions[lo:hi], batch_size=batch_size, max_length=max_length,
                                   progress=n_chunks == 1).astype(np.float32)
            with atomic_path(path) as tmp, open(tmp, "wb") as f:
                np.save(f, feats)
        parts.append(feats)
    if done:
        log.info("resumed: %d of %d chunks were already encoded in %s", done, n_chunks, partial_dir)
    return np.concatenate(parts, axis=0)


# --------------------------------------------------------------------------- PCA
def fit_pca(features: np.ndarray, dim: int, seed: int = 0) -> PCA:
    """PCA to ``dim`` components without whitening, fitted on ``features`` [N, D].

    ``covariance_eigh`` (eigendecomposition of the D x D covariance) when N >= D -- exact, deterministic and
    cheap for millions of captions -- else a full SVD. Component signs are fixed by scikit-learn's svd_flip.
    """
    n, d = features.shape
    if not 1 <= dim <= min(n, d):
        raise ValueError(f"teacher.pca_dim = {dim} must be between 1 and min(#captions, teacher dim) = "
                         f"min({n}, {d})")
    solver = "covariance_eigh" if n >= d else "full"
    return PCA(n_components=dim, whiten=False, svd_solver=solver, random_state=seed).fit(features)


# --------------------------------------------------------------------------- stage
def run_teacher(cfg, teacher: TextTeacher | None = None) -> Path:
    """Write ``layout.teacher_features(cfg.teacher.name)`` (+ .json); skip when it is up to date.

    ``teacher`` overrides loading ``cfg.teacher.name`` (tests, or a model already in memory).
    """
    tc = cfg.teacher
    layout = Layout.from_config(cfg)
    out = layout.teacher_features(tc.name)
    meta_path = out.with_suffix(".json")
    clean_stale_temps_of([out, meta_path])  # a killed run's half-written cache (other teachers' jobs share the folder)
    ids, captions = train_captions(layout)

    weights = teacher.weights if teacher is not None else weights_path(tc.name)
    weights_sha = sha256_file(weights) if weights is not None and Path(weights).is_file() else None
    key_fields = {"format": FORMAT, "teacher": tc.name, "weights_sha256": weights_sha,
                  "captions_sha256": captions_sha256(ids, captions), "n": len(ids),
                  "pca_dim": tc.pca_dim, "max_length": tc.max_length, "seed": tc.seed}
    key = hashlib.sha256(json.dumps(key_fields, sort_keys=True).encode()).hexdigest()
    if out.is_file() and meta_path.is_file():
        try:
            if json.loads(meta_path.read_text()).get("key") == key:
                log.info("teacher features up to date: %s", out)
                return out
        except json.JSONDecodeError:
            pass

    if teacher is None:
        teacher = load_text_teacher(tc.name, tc.device)
    partial_dir = out.parent / ".partial" / f"{out.stem}-{key[:12]}-c{tc.chunk_size}"
    log.info("encoding %d training captions with %s (%d-d)", len(ids), tc.name, teacher.dim)
    raw = encode_in_chunks(teacher, captions, partial_dir, tc.chunk_size, tc.batch_size, tc.max_length)

    pca = fit_pca(raw, tc.pca_dim, tc.seed)
    feats = pca.transform(raw).astype(np.float32)
    explained = float(pca.explained_variance_ratio_.sum())
    log.info("PCA %d -> %d keeps %.1f%% of the variance", raw.shape[1], tc.pca_dim, 100 * explained)

    with atomic_path(out) as tmp, open(tmp, "wb") as f:
        np.savez(f, ids=np.asarray(ids, dtype=str), features=feats,
                 pca_mean=pca.mean_.astype(np.float32), pca_components=pca.components_.astype(np.float32),
                 explained_variance_ratio=pca.explained_variance_ratio_.astype(np.float32))
    manifest_sha = sha256_file(layout.manifest) if layout.manifest.is_file() else None
    write_json(meta_path, {
        **key_fields, "key": key, "raw_dim": int(raw.shape[1]), "explained_variance": explained,
        "manifest_sha256": manifest_sha, "weights_file": str(weights) if weights else None,
        "features_file": out.name, "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    })
    shutil.rmtree(partial_dir, ignore_errors=True)
    return out


# --------------------------------------------------------------------------- readers
def load_teacher_features(path: str | Path) -> tuple[np.ndarray, np.ndarray, dict]:
    """``(ids str [N], features float32 [N, pca_dim], meta)`` of a cache written by :func:`run_teacher`.

    ``meta`` is the ``.json`` beside the file ({} if absent) plus ``pca_mean``, ``pca_components`` (arrays),
    with which ``(raw - pca_mean) @ pca_components.T`` reproduces the features from raw teacher outputs.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"teacher features not found: {path} (run `protoclip teacher`)")
    with np.load(path, allow_pickle=False) as z:
        ids, feats = z["ids"].astype(str), z["features"].astype(np.float32, copy=False)
        extra = {k: z[k] for k in ("pca_mean", "pca_components", "explained_variance_ratio") if k in z}
    if feats.ndim != 2 or len(ids) != len(feats):
        raise ValueError(f"{path}: ids {ids.shape} and features {feats.shape} do not match")
    meta_path = path.with_suffix(".json")
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    return ids, feats, {**meta, **extra}


def lookup(cache_ids: np.ndarray, features: np.ndarray, ids: list[str] | np.ndarray) -> np.ndarray:
    """Rows of ``features`` for sample ``ids`` (KeyError naming the first missing ids)."""
    index = {k: i for i, k in enumerate(np.asarray(cache_ids).tolist())}
    missing = [i for i in ids if i not in index]
    if missing:
        raise KeyError(f"{len(missing)} sample ids have no teacher features (e.g. {missing[:3]}); "
                       f"re-run `protoclip teacher`")
    return features[np.fromiter((index[i] for i in ids), dtype=np.int64, count=len(ids))]
