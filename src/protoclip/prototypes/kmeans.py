"""K-means prototypes for ProtoCLIP episodes [paper Eq. 2, Sec. IV-A3]: :func:`kmeans` with two interchangeable
backends, faiss as the authors call it and a pure-torch Lloyd loop that follows faiss step for step (CPU, and CUDA
without faiss-gpu), so that both reach the same objective from the same initial centroids.
``kmeans(h, k=20_000, iters=20, backend="auto", seed=0)`` -> :class:`KMeansResult`.
"""
from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from tqdm.auto import tqdm

from protoclip.errors import import_extra

logger = logging.getLogger(__name__)

Backend = Literal["auto", "faiss", "torch"]
Init = Literal["kmeans", "random", "kmeans++"]

# faiss perturbs a split centroid by this relative amount (faiss/Clustering.cpp, EPS = 1/1024).
_SPLIT_EPS = 1.0 / 1024.0
# Budget for one chunk of the [rows, k] distance matrix in the torch backend (float32 elements).
_CHUNK_ELEMS = 1 << 24  # 16M floats = 64 MiB
# On CUDA a larger chunk (1 GiB): at m = 200k, K = 20k that is 15 addmm calls per iteration instead of 239
# (kernel launches, not FLOPs, dominate small chunks on a GPU).
_CHUNK_ELEMS_CUDA = 1 << 28


@dataclass
class KMeansResult:
    """Output of :func:`kmeans`; all tensors live on the input's device (CPU for numpy input).

    centroids   float32 [k, d]  prototypes
    assignments int64 [N]       index of the nearest centroid for every sample (w.r.t. the returned centroids)
    objective   float           sum_i ||x_i - c_{a_i}||^2 of the returned centroids and assignments [Eq. 2]
    sizes       int64 [k]       samples per cluster (bincount of ``assignments``)
    n_empty     int             clusters with no sample in the final assignment
    backend     str             'faiss', 'faiss-gpu' or 'torch'
    """

    centroids: torch.Tensor
    assignments: torch.Tensor
    objective: float
    sizes: torch.Tensor
    n_empty: int
    backend: str

    def stats(self, prefix: str = "") -> dict[str, float]:
        """Scalar cluster statistics for the training log."""
        sizes = self.sizes.float()
        return {
            f"{prefix}objective": float(self.objective),
            f"{prefix}objective_per_sample": float(self.objective) / max(1, int(self.sizes.sum())),
            f"{prefix}n_empty": float(self.n_empty),
            f"{prefix}size_max": float(sizes.max()),
            f"{prefix}size_mean_nonempty": float(sizes[sizes > 0].mean()) if (sizes > 0).any() else 0.0,
        }


# --------------------------------------------------------------------------- input handling
def _as_float_tensor(x: torch.Tensor | np.ndarray) -> torch.Tensor:
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(np.ascontiguousarray(x))
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"kmeans: x must be a torch.Tensor or numpy.ndarray, got {type(x).__name__}")
    if x.ndim != 2:
        raise ValueError(f"kmeans: x must be 2-D [N, d], got shape {tuple(x.shape)}")
    if not torch.is_floating_point(x):
        raise TypeError(f"kmeans: x must be floating point, got {x.dtype}")
    x = x.detach().float().contiguous()
    if not torch.isfinite(x).all():
        raise ValueError("kmeans: x contains NaN or Inf")
    return x


# faiss's loader (faiss/loader.py) tries the AVX512-SPR, AVX512 and AVX2 builds first and logs each miss at INFO
# with the ModuleNotFoundError ("No module named 'faiss.swigfaiss_avx512'"): under the CLI's INFO logging every
# rule log carried lines that read like a failure. The wheels ship some of these builds only (faiss-cpu 1.15.1 on
# x86-64: the generic one), so the misses are expected; load_faiss() imports faiss with that logger at WARNING and
# logs the build that loaded once. FAISS_OPT_LEVEL (faiss's own variable) still picks a build.
FAISS_BUILDS = {"swigfaiss_avx512_spr": "AVX512-SPR", "swigfaiss_avx512": "AVX512", "swigfaiss_avx2": "AVX2",
                "swigfaiss_sve": "SVE", "swigfaiss": "generic"}  # faiss module -> instruction set, loader's order


def load_faiss():
    """``import faiss`` without the loader's fallback messages; logs the instruction set loaded (once per process).
    Raises MissingExtraError (an ImportError) naming the extras when faiss is not installed: faiss-cpu and
    faiss-gpu-cu12 are the ``cpu`` and ``gpu`` extras, one or the other (both write one ``faiss`` package folder).
    Every faiss import of the project goes through here."""
    if sys.modules.get("faiss") is not None:  # (a None entry blocks the import: `import faiss` below raises)
        return sys.modules["faiss"]
    loader_log = logging.getLogger("faiss.loader")
    level = loader_log.level
    loader_log.setLevel(logging.WARNING)
    try:
        faiss = import_extra("faiss", "cpu", "faiss k-means", or_extra="gpu")
    finally:
        loader_log.setLevel(level)
    build = next((name for mod, name in FAISS_BUILDS.items() if f"faiss.{mod}" in sys.modules), "unknown")
    logger.info("faiss %s loaded: %s instruction set", getattr(faiss, "__version__", "?"), build)
    return faiss


_SAID_NO_FAISS: list[bool] = []  # non-empty once resolve_backend has logged that faiss is missing


def _faiss_available() -> bool:
    try:
        load_faiss()
    except ImportError:
        return False
    return True


def _faiss_num_gpus() -> int:
    faiss = load_faiss()

    get = getattr(faiss, "get_num_gpus", None)
    return int(get()) if get is not None else 0


def resolve_backend(backend: Backend, device: torch.device, gpu: bool | None = None) -> str:
    """'faiss' | 'faiss-gpu' | 'torch' for ``backend`` and data on ``device``."""
    if backend not in ("auto", "faiss", "torch"):
        raise ValueError(f"kmeans: backend must be 'auto', 'faiss' or 'torch', got {backend!r}")
    if backend == "torch":
        return "torch"
    have_faiss = _faiss_available()
    if backend == "faiss" and not have_faiss:
        load_faiss()  # raises the error naming the extras
    if not have_faiss:
        if not _SAID_NO_FAISS:  # once per process: resolve_backend runs every episode
            _SAID_NO_FAISS.append(True)
            logger.info("kmeans: faiss is not installed (pip extras 'cpu' / 'gpu'): the torch backend runs k-means")
        return "torch"
    n_gpus = _faiss_num_gpus()
    want_gpu = (device.type == "cuda") if gpu is None else gpu
    if want_gpu and n_gpus > 0:
        return "faiss-gpu"
    if backend == "auto" and device.type == "cuda":
        # Choice: CUDA data + CPU-only faiss -> keep the data on the GPU with the torch backend rather
        # than copying it to a (slower) CPU faiss.
        return "torch"
    if gpu and n_gpus == 0:
        logger.warning("kmeans: gpu=True but this faiss build has no GPU support; using faiss on CPU")
    return "faiss"


# --------------------------------------------------------------------------- shared pieces
def random_init(x: torch.Tensor, k: int, seed: int) -> torch.Tensor:
    """k distinct samples drawn uniformly with ``seed`` (the initialisation faiss uses) [k, d]."""
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    idx = torch.randperm(x.shape[0], generator=gen)[:k].to(x.device)
    return x[idx].clone()


def assign(x: torch.Tensor, centroids: torch.Tensor, chunk_rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Nearest centroid of every row of ``x``: (assignments int64 [N], squared distances float32 [N]).

    Written by hand (rather than faiss) so that it runs on any torch device; distances use the expansion
    |x|^2 - 2 x.c + |c|^2 over row chunks (clamped at 0 against round-off). The argmin does not depend on
    |x|^2, so one fused ``addmm`` gives |c|^2 - 2 x.c and |x|^2 is added to the minimum only.
    """
    n, k = x.shape[0], centroids.shape[0]
    budget = _CHUNK_ELEMS_CUDA if x.device.type == "cuda" else _CHUNK_ELEMS
    rows = chunk_rows or max(1, budget // max(1, k))
    c2 = (centroids * centroids).sum(1)
    labels = torch.empty(n, dtype=torch.long, device=x.device)
    dists = torch.empty(n, dtype=torch.float32, device=x.device)
    for start in range(0, n, rows):
        xb = x[start : start + rows]
        partial = torch.addmm(c2[None, :], xb, centroids.T, beta=1.0, alpha=-2.0)
        val, idx = partial.min(dim=1)
        labels[start : start + rows] = idx
        dists[start : start + rows] = (val + (xb * xb).sum(1)).clamp_min_(0.0)
    return labels, dists


def update_centroids(
    x: torch.Tensor, labels: torch.Tensor, k: int, old: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cluster means; empty clusters keep ``old`` for now (they are split afterwards). -> (centroids, counts)."""
    sums = torch.zeros(k, x.shape[1], dtype=torch.float32, device=x.device).index_add_(0, labels, x)
    counts = torch.bincount(labels, minlength=k)
    # torch.where rather than boolean-mask indexing: no device->host sync on CUDA (same values)
    cent = torch.where((counts > 0)[:, None], sums / counts.clamp_min(1)[:, None].float(), old)
    return cent, counts


def split_empty_clusters(centroids: torch.Tensor, counts: torch.Tensor) -> int:
    """Re-seed every empty cluster by splitting the currently largest one (in place); returns #splits.

    Same move as faiss's ``split_clusters`` (copy the big centroid, push the two copies apart by a relative
    1/1024 with alternating signs per dimension, share its count), except that faiss picks the cluster to
    split at random with probability ~ size; picking the largest is deterministic and never picks a
    singleton.
    """
    # The plan (which cluster splits into which empty one) is made on the host from one copy of the counts:
    # one device->host transfer per call instead of one per empty cluster (k-means on CUDA at K = 20k has
    # hundreds of empties in its first iterations).
    cnt = counts.detach().cpu().numpy().copy()
    empty = np.flatnonzero(cnt == 0)
    if len(empty) == 0:
        return 0
    pairs: list[tuple[int, int]] = []
    for ci in empty:
        cj = int(np.argmax(cnt))
        if cnt[cj] < 2:
            break  # nothing left to split (k >= number of distinct points)
        half = cnt[cj] // 2
        cnt[ci] = half
        cnt[cj] -= half
        pairs.append((int(ci), cj))
    if not pairs:
        return 0
    sign = torch.ones(centroids.shape[1], device=centroids.device)
    sign[1::2] = -1.0
    ci_t = torch.tensor([p[0] for p in pairs], device=centroids.device)
    cj_list = [p[1] for p in pairs]
    if len(set(cj_list)) == len(cj_list) and not set(cj_list) & {p[0] for p in pairs}:
        # every split reads a centroid no other split writes: one gather/scatter, same values as the loop
        cj_t = torch.tensor(cj_list, device=centroids.device)
        base = centroids[cj_t]
        centroids[ci_t] = base * (1.0 + sign * _SPLIT_EPS)
        centroids[cj_t] = base * (1.0 - sign * _SPLIT_EPS)
    else:  # chained splits (a cluster split twice, or a new one split again): in order
        for ci, cj in pairs:
            base = centroids[cj].clone()
            centroids[ci] = base * (1.0 + sign * _SPLIT_EPS)
            centroids[cj] = base * (1.0 - sign * _SPLIT_EPS)
    return len(pairs)


def kmeanspp_init(x: torch.Tensor, k: int, seed: int) -> torch.Tensor:
    """k-means++ seeding through scikit-learn (O(N k d), sequential: meant for small problems) [k, d]."""
    from sklearn.cluster import kmeans_plusplus  # heavy: sklearn, only for init="k-means++"

    centers, _ = kmeans_plusplus(x.cpu().numpy(), k, random_state=int(seed))
    return torch.from_numpy(np.ascontiguousarray(centers, dtype=np.float32)).to(x.device)


def _normalize(c: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(c, dim=1)


# --------------------------------------------------------------------------- backends
def _lloyd_torch(x: torch.Tensor, init: torch.Tensor, iters: int, spherical: bool) -> tuple[torch.Tensor, int]:
    """Lloyd iterations in torch, in faiss's order: assign, mean, split empties, (re-normalise)."""
    k = init.shape[0]
    cent = init.clone()
    total_split = 0
    # tqdm(disable=None): a bar on a terminal, silent in logs/CI.
    for it in tqdm(range(iters), desc="kmeans[torch]", leave=False, disable=None):
        labels, d = assign(x, cent)
        cent, counts = update_centroids(x, labels, k, cent)
        total_split += split_empty_clusters(cent, counts)
        if spherical:
            cent = _normalize(cent)
        if logger.isEnabledFor(logging.DEBUG):  # float() syncs a CUDA device: only when asked for
            logger.debug("kmeans[torch] iter %d: obj=%.6g", it, float(d.sum()))
    return cent, total_split


def _lloyd_faiss(x: np.ndarray, k: int, init: np.ndarray | None, iters: int, seed: int, spherical: bool, gpu: bool) -> np.ndarray:
    faiss = load_faiss()

    km = faiss.Kmeans(
        x.shape[1],
        k,
        niter=iters,
        nredo=1,  # redos are looped in kmeans() so that both backends share the same rule
        seed=int(seed),
        spherical=spherical,
        gpu=gpu,
        verbose=False,
        # Choice: no subsampling of the training set. faiss's default (256 points per centroid) only
        # subsamples when N > 256 k, which never happens at the paper's 10 samples per prototype; lifting it
        # keeps the two backends identical for any N.
        max_points_per_centroid=1 << 30,
        min_points_per_centroid=1,  # silences the "please provide at least 39 k points" warning
    )
    km.train(x, init_centroids=init)
    return np.ascontiguousarray(km.centroids, dtype=np.float32)


# --------------------------------------------------------------------------- entry point
def kmeans(
    x: torch.Tensor | np.ndarray,
    k: int,
    iters: int = 20,
    backend: Backend = "auto",
    seed: int = 0,
    init: Init = "kmeans",
    init_centroids: torch.Tensor | np.ndarray | None = None,
    spherical: bool = False,
    gpu: bool | None = None,
    nredo: int = 1,
) -> KMeansResult:
    """Cluster the rows of ``x`` [N, d] into ``k`` prototypes [paper Eq. 2].

    Args:
        x: features, float tensor (any device) or ndarray; detached and cast to float32.
        k: number of clusters, 1 <= k <= N (K = m / images_per_prototype is the caller's choice).
        iters: Lloyd iterations (paper: 20). Ignored when ``init='random'``.
        backend: 'auto' | 'faiss' | 'torch'. ``faiss``: ``faiss.Kmeans`` exactly as the authors call it
            [ref-code src/training/clustering.py] (Euclidean, not spherical, ``nredo=1``, random-sample
            initialisation, ``niter`` Lloyd iterations), on GPU when the faiss build has GPUs and the data lives
            on CUDA (or ``gpu=True``). ``torch``: the same Lloyd loop in torch, step for step (assign -> mean ->
            split empty clusters -> optional re-normalisation), distances in chunks as ``|x|^2 - 2 x.c + |c|^2``
            so memory stays bounded at m = 200k, K = 20k. ``auto``: faiss where it can work on the data's
            device, else torch.
        seed: seed of the random-sample initialisation (each backend uses its own RNG, so the same seed gives
            different inits across backends; pass ``init_centroids`` to compare them).
        init: 'kmeans' (random samples + ``iters`` Lloyd iterations, as faiss), 'random' (random samples,
            0 iterations: the "w/o K-means" ablation [paper Table III]) or 'kmeans++' (not in the paper; small,
            well-separated data and tests: scikit-learn's ``kmeans_plusplus`` seeds + ``iters``).
        init_centroids: optional [k, d] starting centroids, used instead of the random draw.
        spherical: L2-normalise centroids after each update. Default False as in the authors' faiss call
            [ref-code clustering.py: faiss.Kmeans(d, k, niter, nredo, verbose, gpu)]; ProtoCLIP's h are already
            L2-normalised by the model, the centroids are not.
        gpu: force (True) / forbid (False) faiss GPU; None = GPU iff the data is on CUDA and faiss has GPUs.
        nredo: independent runs (seeds seed, seed+1, ...) keeping the lowest objective; 1 as in the authors'
            runs [ref-code params.py ``--kmeans-nredo`` default 1]. Ignored with ``init_centroids``.
    """
    xt = _as_float_tensor(x)
    n, d = xt.shape
    k = _checked_k(k, n, iters, init, nredo)
    n_iter = 0 if init == "random" else int(iters)
    init_t: torch.Tensor | None = None
    if init_centroids is not None:
        init_t = _as_float_tensor(init_centroids).to(xt.device)
        if tuple(init_t.shape) != (k, d):
            raise ValueError(f"kmeans: init_centroids must have shape {(k, d)}, got {tuple(init_t.shape)}")

    chosen = resolve_backend(backend, xt.device, gpu)
    best: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    for redo in range(1 if init_t is not None else nredo):
        centroids = _one_run(xt, k, init_t, init, chosen, int(seed) + redo, n_iter, spherical)
        # Final assignment with the returned centroids, as the authors do with kmeans.index.search(x, 1)
        # [ref-code clustering.py]; computed in torch for both backends so the objective is defined identically.
        labels, dists = assign(xt, centroids)
        if best is None or float(dists.double().sum()) < float(best[2].double().sum()):
            best = (centroids, labels, dists)
    centroids, labels, dists = best
    sizes = torch.bincount(labels, minlength=k)
    n_empty = int((sizes == 0).sum())
    objective = float(dists.double().sum())
    logger.info("kmeans[%s]: N=%d d=%d k=%d iters=%d objective=%.6g empty=%d", chosen, n, d, k, n_iter, objective, n_empty)
    return KMeansResult(centroids, labels, objective, sizes, n_empty, chosen)


def _checked_k(k: int, n: int, iters: int, init: str, nredo: int) -> int:
    """:func:`kmeans`'s arguments checked (a ValueError naming the first bad one); ``k`` as an int."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"kmeans: k must be a positive int, got {k!r}")
    k = int(k)
    if k > n:
        raise ValueError(f"kmeans: k={k} clusters requested but only N={n} samples given (need k <= N)")
    if iters < 0:
        raise ValueError(f"kmeans: iters must be >= 0, got {iters}")
    if init not in ("kmeans", "random", "kmeans++"):
        raise ValueError(f"kmeans: init must be 'kmeans', 'random' or 'kmeans++', got {init!r}")
    if nredo < 1:
        raise ValueError(f"kmeans: nredo must be >= 1, got {nredo}")
    return k


def _one_run(xt: torch.Tensor, k: int, start: torch.Tensor | None, init: str, chosen: str, run_seed: int,
             n_iter: int, spherical: bool) -> torch.Tensor:
    """One k-means run's centroids [k, d] on ``xt``'s device: from ``start`` (given centroids), else k-means++
    seeds or the backend's own random draw with ``run_seed``, then ``n_iter`` Lloyd iterations on ``chosen``."""
    if start is None and init == "kmeans++":
        start = kmeanspp_init(xt, k, run_seed)
    if chosen == "torch":
        if start is None:
            start = random_init(xt, k, run_seed)
            if spherical:
                start = _normalize(start)
        centroids, n_split = _lloyd_torch(xt, start, n_iter, spherical)
        if n_split:
            logger.debug("kmeans[torch]: %d empty-cluster splits", n_split)
        return centroids
    init_np = None if start is None else start.cpu().numpy()
    cent_np = _lloyd_faiss(xt.cpu().numpy(), k, init_np, n_iter, run_seed, spherical, gpu=(chosen == "faiss-gpu"))
    return torch.from_numpy(cent_np).to(xt.device)


__all__ = [
    "KMeansResult", "kmeans", "assign", "update_centroids", "split_empty_clusters", "random_init", "kmeanspp_init",
    "resolve_backend",
]
