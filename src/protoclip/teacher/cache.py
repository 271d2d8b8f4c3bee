"""The `teacher` stage's work: cache PCA-reduced external-teacher features of every training caption (Sec. IV-A3).

As the paper (RoBERTa-large, frozen, 1024 -> 64 dims by PCA), for ``cfg.teacher.name``, resumable and in memory that
does not grow with the corpus; :func:`build_cache` gives the steps, :func:`pca_sample` the PCA's sample bound.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Sequence

import numpy as np
import pyarrow.compute as pc
from tqdm.auto import tqdm

from protoclip.errors import ConfigError
from protoclip.files.atomic import atomic_path, clean_stale_temps, clean_stale_temps_of, write_json
from protoclip.files.datafiles import TEACHER, reading
from protoclip.data.corpus.dedup import KeySpill
from protoclip.data.loading.manifest import manifest_batches
from protoclip.files.layout import Layout
from protoclip.teacher.config import TeacherConfig
from protoclip.teacher.encoders import (
    PACKAGED, TextTeacher, cached_weights, find_weights, packaged_path, load_text_teacher, sha256_file,
)

if TYPE_CHECKING:
    from sklearn.decomposition import PCA

log = logging.getLogger(__name__)

FORMAT = "protoclip-teacher/1"
PROJECT_ROWS = 16384  # rows projected at a time
# A block of a matrix product is computed by BLAS row by row the same way whatever the rows around it, from a
# couple of dozen rows on; below that OpenBLAS switches kernels (a single row differs in the last bit). Blocks are
# never smaller than this (the last one joins its neighbour), so the projection equals a whole-matrix transform.
MIN_BLOCK = 64


# --------------------------------------------------------------------------- inputs
@dataclass
class TrainCaptions:
    """The manifest's training captions, read as a stream (never all in memory)."""

    manifest: Path
    n: int  # training captions
    sha256: str  # of (id, caption) in order (the cache key)
    id_chars: int  # longest id, in characters (the ids array's dtype)

    def batches(self) -> Iterator[tuple[list[str], list[str]]]:
        """(ids, captions) of the training split, batch by batch, in manifest order."""
        for batch in manifest_batches(self.manifest, ["id", "caption", "split"]):
            batch = batch.filter(pc.equal(batch.column("split"), "train"))
            if batch.num_rows:
                yield ([str(i) for i in batch.column("id").to_pylist()],
                       [c if c is not None else "" for c in batch.column("caption").to_pylist()])

    def chunks(self, size: int) -> Iterator[list[str]]:
        """The captions in chunks of ``size`` (the last shorter)."""
        buf: list[str] = []
        for _ids, caps in self.batches():
            buf += caps
            while len(buf) >= size:
                yield buf[:size]
                buf = buf[size:]
        if buf:
            yield buf


def train_captions(layout: Layout) -> TrainCaptions:
    """Count, hash and check the training captions in one streamed pass (ids must be unique: checked with the
    keys spilled to disk, not a set of every id)."""
    h = hashlib.sha256()
    n, id_chars = 0, 1
    layout.scratch.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="teacher-ids-", dir=layout.scratch) as tmp:
        spill = KeySpill(Path(tmp))
        tc = TrainCaptions(layout.manifest, 0, "", 0)
        for ids, captions in tc.batches():
            for i, c in zip(ids, captions):
                h.update(i.encode() + b"\x00" + c.encode() + b"\x01")
            spill.add(np.arange(n, n + len(ids)), ids)
            id_chars = max(id_chars, max(map(len, ids)))
            n += len(ids)
        if n == 0:
            raise ValueError(f"{layout.manifest}: no training captions (split == 'train')")
        if len(spill.later_repeats()):
            raise ValueError(f"{layout.manifest}: sample ids are not unique")
    return TrainCaptions(layout.manifest, n, h.hexdigest(), id_chars)


def weights_path(name: str) -> Path | None:
    """The local weights file of teacher ``name`` without loading it (None when unknown)."""
    if name in PACKAGED:
        return find_weights(packaged_path(name))
    if Path(name).expanduser().is_dir():
        return find_weights(Path(name).expanduser())
    return cached_weights(name)


# --------------------------------------------------------------------------- encoding (resumable)
class RawFeatures:
    """The encoded chunks of a run, read from their files: ``rows(lo, hi)`` -> float32 [hi - lo, D].

    Plain reads into fresh arrays, not memory maps: the pages of a memory-mapped file count in the process's
    resident memory (and in a cgroup's limit) once touched, so projecting every chunk through a map would hold
    the whole raw corpus (N x D x 4 bytes) resident by the end.
    """

    def __init__(self, paths: list[Path], n: int, chunk_size: int):
        self.paths, self.n, self.chunk_size = paths, n, chunk_size
        self._data_at = []  # byte offset of each chunk's data (after its .npy header)
        for p in paths:
            with open(p, "rb") as f:
                version = np.lib.format.read_magic(f)
                read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                        else np.lib.format.read_array_header_2_0)
                shape, fortran, dtype = read(f)
                if fortran or dtype != np.float32 or len(shape) != 2:
                    raise ValueError(f"{p}: not a C-order float32 [rows, D] chunk")
                self._data_at.append(f.tell())
        self.dim = int(shape[1])

    def _read(self, c: int, lo: int, hi: int) -> np.ndarray:
        """Rows ``lo:hi`` of chunk ``c`` (chunk-local)."""
        out = np.empty((hi - lo, self.dim), np.float32)
        row = 4 * self.dim
        with open(self.paths[c], "rb") as f:
            got = os.preadv(f.fileno(), [memoryview(out).cast("B")], self._data_at[c] + lo * row)
        if got != out.nbytes:
            raise ValueError(f"{self.paths[c]}: cut (read {got} of {out.nbytes} bytes); delete it to re-encode")
        return out

    def rows(self, lo: int, hi: int) -> np.ndarray:
        out = np.empty((hi - lo, self.dim), np.float32)
        at = lo
        while at < hi:
            c = at // self.chunk_size
            start = c * self.chunk_size
            stop = min(hi, start + self.chunk_size)
            out[at - lo: stop - lo] = self._read(c, at - start, stop - start)
            at = stop
        return out

    def take(self, rows: np.ndarray) -> np.ndarray:
        """Rows at sorted positions ``rows``, one chunk read at a time."""
        out = np.empty((len(rows), self.dim), np.float32)
        chunk_of = rows // self.chunk_size
        for c in np.unique(chunk_of):
            sel = np.flatnonzero(chunk_of == c)
            local = rows[sel] - c * self.chunk_size
            out[sel] = self._read(c, int(local[0]), int(local[-1]) + 1)[local - local[0]]
        return out


def encode_in_chunks(teacher: TextTeacher | None, captions: TrainCaptions, partial_dir: Path, chunk_size: int,
                     batch_size: int, max_length: int) -> RawFeatures:
    """Encode the captions chunk by chunk into ``partial_dir`` (finished chunks are kept and skipped; ``teacher``
    may be None when every chunk is there)."""
    partial_dir.mkdir(parents=True, exist_ok=True)
    n_chunks = (captions.n + chunk_size - 1) // chunk_size
    paths, done = [], 0
    chunks = captions.chunks(chunk_size)
    for c in tqdm(range(n_chunks), desc=f"teacher {partial_dir.name} chunks", unit="chunk", disable=n_chunks < 2):
        path = partial_dir / f"chunk_{c:05d}.npy"
        texts = next(chunks)
        if path.is_file():
            with open(path, "rb") as f:
                version = np.lib.format.read_magic(f)
                rows = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                        else np.lib.format.read_array_header_2_0)(f)[0][0]
            if rows != len(texts):
                raise ValueError(f"{path}: {rows} rows, expected {len(texts)}; delete {partial_dir}")
            done += 1
        else:
            feats = teacher.encode(texts, batch_size=batch_size, max_length=max_length,
                                   progress=n_chunks == 1).astype(np.float32)
            with atomic_path(path) as tmp, open(tmp, "wb") as f:
                np.save(f, feats)
        paths.append(path)
    if done:
        log.info("resumed: %d of %d chunks were already encoded in %s", done, n_chunks, partial_dir)
    return RawFeatures(paths, captions.n, chunk_size)


# --------------------------------------------------------------------------- PCA
def fit_pca(features: np.ndarray, dim: int, seed: int = 0) -> PCA:
    """PCA to ``dim`` components without whitening (as faiss ``PCAMatrix``'s default in the official code), fitted
    on ``features`` [N, D].

    ``covariance_eigh`` (eigendecomposition of the D x D covariance) when N >= D -- exact, deterministic and
    cheap for millions of captions -- else a full SVD. Component signs are fixed by scikit-learn's svd_flip.
    """
    from sklearn.decomposition import PCA  # heavy: sklearn, only when a cache is built

    n, d = features.shape
    if not 1 <= dim <= min(n, d):
        raise ValueError(f"teacher.pca_dim = {dim} must be between 1 and min(#captions, teacher dim) = "
                         f"min({n}, {d})")
    solver = "covariance_eigh" if n >= d else "full"
    return PCA(n_components=dim, whiten=False, svd_solver=solver, random_state=seed).fit(features)


def pca_sample(n: int, dim: int, max_points_per_dim: int, seed: int) -> np.ndarray | None:
    """Sorted rows the PCA is fitted on: None (every row) when ``n`` is within faiss' bound
    ``max_points_per_dim * dim`` (or the bound is off, 0), else that many rows drawn without replacement.

    faiss' own bound (``PCAMatrix::train`` subsamples to ``max_points_per_d = 1000`` x d_in), which the official
    ``faiss.PCAMatrix(1024, 64)`` applied, so its PCA saw at most 1,024,000 captions; ours draws the sample with
    numpy seeded by ``teacher.seed``, not faiss' permutation. It costs ``pca_max_points_per_dim * D^2 * 4`` bytes
    (4 GiB at D = 1024): lower it on a small node.
    """
    cap = max_points_per_dim * dim
    if max_points_per_dim <= 0 or n <= cap:
        return None
    return np.sort(np.random.default_rng(seed).choice(n, size=cap, replace=False))


@dataclass
class Projection:
    """A fitted PCA as the arrays the cache stores; :meth:`apply` is scikit-learn's ``PCA.transform`` formula."""

    mean: np.ndarray  # [D] float32
    components: np.ndarray  # [pca_dim, D] float32
    explained_variance_ratio: np.ndarray  # [pca_dim] float32
    fit_rows: int  # captions it was fitted on

    @classmethod
    def of(cls, pca: PCA, fit_rows: int) -> "Projection":
        return cls(pca.mean_.astype(np.float32), pca.components_.astype(np.float32),
                   pca.explained_variance_ratio_.astype(np.float32), fit_rows)

    def apply(self, x: np.ndarray) -> np.ndarray:
        # scikit-learn (>= 1.5) projects as X @ C.T - mean @ C.T (not (X - mean) @ C.T): same bits as its transform
        return (x @ self.components.T - self.mean.reshape(1, -1) @ self.components.T).astype(np.float32)

    def save(self, path: Path) -> None:
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            np.savez(f, mean=self.mean, components=self.components,
                     explained_variance_ratio=self.explained_variance_ratio, fit_rows=np.int64(self.fit_rows))

    @classmethod
    def load(cls, path: Path) -> "Projection":
        with np.load(path) as z:
            return cls(z["mean"], z["components"], z["explained_variance_ratio"], int(z["fit_rows"]))


def fit_projection(raw: RawFeatures, dim: int, max_points_per_dim: int, seed: int) -> Projection:
    rows = pca_sample(raw.n, raw.dim, max_points_per_dim, seed)
    sample = raw.rows(0, raw.n) if rows is None else raw.take(rows)
    log.info("fitting PCA %d -> %d on %d of %d captions", raw.dim, dim, len(sample), raw.n)
    return Projection.of(fit_pca(sample, dim, seed), len(sample))


def blocks(n: int, size: int | None = None) -> list[tuple[int, int]]:
    """[lo, hi) row blocks of ``size`` rows (default ``PROJECT_ROWS``); a last block under ``MIN_BLOCK`` rows joins
    the one before."""
    edges = list(range(0, n, size or PROJECT_ROWS)) + [n]
    if len(edges) > 2 and edges[-1] - edges[-2] < MIN_BLOCK:
        del edges[-2]
    return list(zip(edges[:-1], edges[1:]))


# --------------------------------------------------------------------------- output (streamed npz)
def _npy_member(zf: zipfile.ZipFile, name: str, dtype: np.dtype, shape: tuple[int, ...]):
    """An open ``.npy`` member of ``zf`` with its header written: the caller writes the C-order data."""
    f = zf.open(f"{name}.npy", "w", force_zip64=True)  # as numpy.savez opens its members
    np.lib.format.write_array_header_1_0(f, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                                             "fortran_order": False, "shape": shape})
    return f


def write_cache(out: Path, captions: TrainCaptions, raw: RawFeatures, proj: Projection) -> None:
    """The cache npz, member by member (np.load reads it as it reads np.savez's)."""
    n, k = captions.n, len(proj.components)
    with atomic_path(out) as tmp, zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        id_dtype = np.dtype(f"<U{captions.id_chars}")
        with _npy_member(zf, "ids", id_dtype, (n,)) as f:
            for ids, _caps in captions.batches():
                f.write(np.asarray(ids, dtype=id_dtype).tobytes())
        with _npy_member(zf, "features", np.float32, (n, k)) as f:
            for lo, hi in tqdm(blocks(n), desc="teacher PCA projection", unit="block", leave=False):
                f.write(np.ascontiguousarray(proj.apply(raw.rows(lo, hi))).tobytes())
        for name, arr in (("pca_mean", proj.mean), ("pca_components", proj.components),
                          ("explained_variance_ratio", proj.explained_variance_ratio)):
            with zf.open(f"{name}.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asarray(arr, np.float32))


# --------------------------------------------------------------------------- stage
def build_cache(tc: TeacherConfig, layout: Layout, teacher: TextTeacher | None = None) -> Path:
    """Write ``layout.teacher_features(tc.name)`` (+ .json); skip when it is up to date.

    ``teacher`` overrides loading ``tc.name`` (tests, or a model already in memory). Stream the manifest's training
    captions in order; encode them in chunks of ``chunk_size`` (``.partial/`` chunk files: a restarted run skips
    finished chunks); fit PCA (scikit-learn, :func:`fit_pca`) on a seeded sample (:func:`pca_sample`), saved so a
    restart does not refit; project every chunk into ``data/teacher/<teacher>.npz`` (``ids``, ``features``
    [N, pca_dim], ``pca_mean``, ``pca_components``, ``explained_variance_ratio``) and a ``.json`` (dims, explained
    variance, sample size, input sha256s, key). Projected features are not re-normalised (as the official
    ``RoBERTa.py``). A re-run whose key (teacher, weights, captions, pca_dim, sample rule, max_length, seed) matches
    the ``.json`` does no work.

        protoclip teacher                                  # via the CLI, or:
        from protoclip.teacher.stage import run_teacher    # the stage's entry: build_cache(cfg.teacher, layout)
        ids, feats, meta = load_teacher_features(run_teacher(cfg))
    """
    out, meta_path = layout.teacher_features(tc.name), layout.teacher_meta(tc.name)
    clean_stale_temps_of([out, meta_path])  # a killed run's half-written cache (other teachers' jobs share the folder)
    captions = train_captions(layout)

    weights = teacher.weights if teacher is not None else weights_path(tc.name)
    weights_sha = sha256_file(weights) if weights is not None and Path(weights).is_file() else None
    key_fields = {"format": FORMAT, "teacher": tc.name, "weights_sha256": weights_sha,
                  "captions_sha256": captions.sha256, "n": captions.n, "pca_dim": tc.pca_dim,
                  "pca_max_points_per_dim": tc.pca_max_points_per_dim, "max_length": tc.max_length, "seed": tc.seed}
    key = hashlib.sha256(json.dumps(key_fields, sort_keys=True).encode()).hexdigest()
    if out.is_file() and meta_path.is_file():
        try:
            if json.loads(meta_path.read_text()).get("key") == key:
                log.info("teacher features up to date: %s", out)
                return out
        except json.JSONDecodeError:
            pass

    partial_dir = layout.teacher_partial(f"{out.stem}-{key[:12]}-c{tc.chunk_size}")
    if partial_dir.is_dir():
        clean_stale_temps(partial_dir)  # a chunk or PCA whose write was killed
    pca_file = partial_dir / "pca.npz"
    n_chunks = (captions.n + tc.chunk_size - 1) // tc.chunk_size
    if teacher is None and not (pca_file.is_file() and all(
            (partial_dir / f"chunk_{c:05d}.npy").is_file() for c in range(n_chunks))):
        teacher = load_text_teacher(tc.name, tc.device)  # not loaded when every chunk is already there
    if teacher is not None:
        log.info("encoding %d training captions with %s (%d-d)", captions.n, tc.name, teacher.dim)
    raw = encode_in_chunks(teacher, captions, partial_dir, tc.chunk_size, tc.batch_size, tc.max_length)

    if pca_file.is_file():
        proj = Projection.load(pca_file)
        log.info("resumed: the PCA fitted on %d captions is in %s", proj.fit_rows, pca_file)
    else:
        proj = fit_projection(raw, tc.pca_dim, tc.pca_max_points_per_dim, tc.seed)
        proj.save(pca_file)
    explained = float(proj.explained_variance_ratio.sum())
    log.info("PCA %d -> %d keeps %.1f%% of the variance", raw.dim, tc.pca_dim, 100 * explained)

    write_cache(out, captions, raw, proj)
    manifest_sha = sha256_file(layout.manifest) if layout.manifest.is_file() else None
    write_json(meta_path, {
        **key_fields, "key": key, "raw_dim": raw.dim, "explained_variance": explained, "pca_fit_rows": proj.fit_rows,
        "manifest_sha256": manifest_sha, "weights_file": str(weights) if weights else None,
        "features_file": out.name, "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    })
    shutil.rmtree(partial_dir, ignore_errors=True)
    return out


# --------------------------------------------------------------------------- readers
def load_teacher_features(path: str | Path) -> tuple[np.ndarray, np.ndarray, dict]:
    """``(ids str [N], features float32 [N, pca_dim], meta)`` of a cache written by :func:`build_cache`.

    ``meta`` is the ``.json`` beside the file ({} if absent) plus ``pca_mean``, ``pca_components`` (arrays),
    with which ``(raw - pca_mean) @ pca_components.T`` reproduces the features from raw teacher outputs.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"teacher features not found: {path} (run `protoclip teacher`)")
    with reading(path, "teacher feature cache", TEACHER), np.load(path, allow_pickle=False) as z:
        ids, feats = z["ids"].astype(str), z["features"].astype(np.float32, copy=False)
        extra = {k: z[k] for k in ("pca_mean", "pca_components", "explained_variance_ratio") if k in z}
    if feats.ndim != 2 or len(ids) != len(feats):
        raise ValueError(f"{path}: ids {ids.shape} and features {feats.shape} do not match")
    meta_path = path.with_suffix(".json")
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    return ids, feats, {**meta, **extra}


def _npy_member_at(path: Path, name: str) -> tuple[np.dtype, tuple[int, ...], int]:
    """dtype, shape and file offset of the data of an uncompressed ``.npy`` member of an npz (np.savez's or
    :func:`write_cache`'s), so that it can be read in blocks instead of whole."""
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(f"{name}.npy")
    if info.compress_type != zipfile.ZIP_STORED:
        raise ValueError(f"{path}: member {name}.npy is compressed")
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        local = f.read(30)  # the zip local file header: its name and extra field lengths end it
        name_len, extra_len = int.from_bytes(local[26:28], "little"), int.from_bytes(local[28:30], "little")
        f.seek(info.header_offset + 30 + name_len + extra_len)
        version = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read(f)
        if fortran:
            raise ValueError(f"{path}: member {name}.npy is Fortran-ordered")
        return dtype, shape, f.tell()


def _rows(f, offset: int, dtype: np.dtype, row_shape: tuple[int, ...], lo: int, hi: int) -> np.ndarray:
    row = dtype.itemsize * int(np.prod(row_shape, dtype=np.int64))
    return np.frombuffer(os.pread(f.fileno(), (hi - lo) * row, offset + lo * row), dtype=dtype).reshape(
        (hi - lo, *row_shape))


def aligned_features(path: str | Path, sample_ids: Sequence[str], block: int = 65536) -> np.ndarray:
    """float32 [len(sample_ids), pca_dim]: the cache's rows for ``sample_ids``, what
    ``lookup(*load_teacher_features(path)[:2], sample_ids)`` returns, read in blocks.

    The training set is the cache's training split (filtered by source, subsampled) in manifest order, so its ids
    are found by one merge pass over the cache's ids, block by block: no index of every id and no copy of the whole
    cache. Ids out of the cache's order or missing fall back to :func:`lookup` (its error names them).
    """
    path = Path(path)
    with reading(path, "teacher feature cache", TEACHER):
        id_dtype, (n,), id_at = _npy_member_at(path, "ids")
        f_dtype, (n_f, dim), f_at = _npy_member_at(path, "features")
    if n_f != n or f_dtype != np.float32:
        raise ValueError(f"{path}: ids [{n}] and features [{n_f}, {dim}] {f_dtype} do not match")
    positions = np.empty(len(sample_ids), np.int64)
    k = 0
    with open(path, "rb") as f:
        for lo in range(0, n, block):
            if k == len(sample_ids):
                break
            for j, cid in enumerate(_rows(f, id_at, id_dtype, (), lo, min(n, lo + block)).tolist(), lo):
                if k < len(sample_ids) and cid == sample_ids[k]:
                    positions[k] = j
                    k += 1
        if k < len(sample_ids):  # not a subsequence of the cache: the dictionary lookup says which ids fail
            ids, feats, _ = load_teacher_features(path)
            return lookup(ids, feats, sample_ids)
        out = np.empty((len(sample_ids), dim), np.float32)
        for lo in range(0, n, block):
            a, b = np.searchsorted(positions, [lo, min(n, lo + block)])
            if b > a:
                out[a:b] = _rows(f, f_at, f_dtype, (dim,), lo, min(n, lo + block))[positions[a:b] - lo]
    return out


def run_features(path: Path, teacher: str, run: str, sample_ids: Sequence[str]) -> np.ndarray:
    """Training run ``run``'s features of teacher ``teacher`` from its cache ``path``, rows aligned with
    ``sample_ids`` (the training set's order), float32 and contiguous.

    A missing cache is a :class:`ConfigError` naming the path and the command that builds it; training ids
    absent from the cache (a stale cache) stop here, before any training, through :func:`lookup`. The cache is
    read in blocks (:func:`aligned_features`): only the run's rows are held, not the whole cache.
    """
    if not path.exists():
        raise ConfigError(f"run '{run}': teacher cache for '{teacher}' not found at {path}; build it with "
                          f"`protoclip teacher --config <config>` (with teacher.name: {teacher})")
    aligned = np.ascontiguousarray(aligned_features(path, sample_ids), dtype=np.float32)
    log.info("teacher %s: %d x %d features (%s)", teacher, *aligned.shape, path)
    return aligned


def lookup(cache_ids: np.ndarray, features: np.ndarray, ids: list[str] | np.ndarray) -> np.ndarray:
    """Rows of ``features`` for sample ``ids`` (KeyError naming the first missing ids)."""
    index = {k: i for i, k in enumerate(np.asarray(cache_ids).tolist())}
    missing = [i for i in ids if i not in index]
    if missing:
        raise KeyError(f"{len(missing)} sample ids have no teacher features (e.g. {missing[:3]}); "
                       f"re-run `protoclip teacher`")
    return features[np.fromiter((index[i] for i in ids), dtype=np.int64, count=len(ids))]
