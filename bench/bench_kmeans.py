"""Time the faiss and torch k-means backends side by side on the same data and the same initial centroids.

Default problem: m = 20k samples x d = 128 (ProtoCLIP's projected dim), K = 2k (10 samples per prototype as in
the paper), 20 Lloyd iterations. Runs faiss (CPU) and torch (CPU), plus torch on CUDA and faiss-GPU when
available, and prints wall time, objective and the time ratio against faiss-CPU.

    python bench/bench_kmeans.py                      # paper-shaped default
    python bench/bench_kmeans.py --m 200000 --k 20000 # the full paper episode (slow on CPU)
    python bench/bench_kmeans.py --threads 2          # pin torch / faiss CPU threads
    python bench/bench_kmeans.py --m 200000 --k 20000 --gpu-only   # the paper's episode, CUDA backends only
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from protoclip.prototypes.kmeans import _faiss_available, _faiss_num_gpus, kmeans


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run_one(label: str, x: torch.Tensor, init: torch.Tensor, iters: int, backend: str, gpu: bool | None) -> dict:
    _sync(str(x.device))
    t0 = time.perf_counter()
    res = kmeans(x, init.shape[0], iters=iters, backend=backend, init_centroids=init, gpu=gpu)
    _sync(str(x.device))
    return {"label": label, "seconds": time.perf_counter() - t0, "objective": res.objective, "empty": res.n_empty,
            "backend": res.backend}


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", type=int, default=20_000, help="samples")
    ap.add_argument("--d", type=int, default=128, help="feature dimension")
    ap.add_argument("--k", type=int, default=2_000, help="clusters")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gpu-only", action="store_true",
                    help="only the CUDA backends (the CPU ones take minutes at the paper's size)")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads for torch and faiss (0: library default)")
    args = ap.parse_args(argv)

    if args.threads > 0:
        torch.set_num_threads(args.threads)
        if _faiss_available():
            import faiss

            faiss.omp_set_num_threads(args.threads)

    gen = torch.Generator().manual_seed(args.seed)
    # unit-norm features with cluster structure, like the L2-normalised projections h
    centers = torch.randn(args.k // 4 or 1, args.d, generator=gen)
    x = centers[torch.randint(len(centers), (args.m,), generator=gen)] + 0.5 * torch.randn(args.m, args.d, generator=gen)
    x = F.normalize(x, dim=1).contiguous()
    init = x[torch.randperm(args.m, generator=gen)[: args.k]].clone()
    print(f"k-means benchmark: m={args.m} d={args.d} K={args.k} iters={args.iters} "
          f"torch threads={torch.get_num_threads()}")

    rows = []
    if _faiss_available() and not args.gpu_only:
        rows.append(run_one("faiss cpu", x, init, args.iters, "faiss", gpu=False))
    if not args.gpu_only:
        rows.append(run_one("torch cpu", x, init, args.iters, "torch", gpu=None))
    if torch.cuda.is_available():
        xc, ic = x.cuda(), init.cuda()
        run_one("warm-up", xc[:1000], ic[:10], 1, "torch", gpu=None)  # CUDA context / kernels
        rows.append(run_one("torch cuda", xc, ic, args.iters, "torch", gpu=None))
        if _faiss_available() and _faiss_num_gpus() > 0:
            rows.append(run_one("faiss gpu", xc, ic, args.iters, "faiss", gpu=True))
        else:  # said, not silently skipped: the GPU faiss row is what the suite's kmeans part is for
            print("faiss gpu: not installed (this faiss has no GPU support: pip install -e '.[gpu]'); torch cuda only")

    if not rows:
        print("no backend ran (--gpu-only without a CUDA device)")
        return rows
    ref = rows[0]["seconds"]
    print(f"{'backend':<12} {'seconds':>9} {'x vs ' + rows[0]['label']:>16} {'objective':>14} {'empty':>6}")
    for r in rows:
        print(f"{r['label']:<12} {r['seconds']:>9.3f} {r['seconds'] / ref:>16.2f} {r['objective']:>14.4f} {r['empty']:>6d}")
    return rows


if __name__ == "__main__":
    main()
