"""L-BFGS linear probe: the new defaults vs the probe before issue 12, side by side in one run.

All run :func:`protoclip.evaluate.metrics.linear.linear_probe` (CLIP's protocol: C searched on a held-out
validation split with the parametric binary search, refit on all of train, test once): the new defaults
(features centred, warm-started fits, 1 BLAS/OpenMP thread), the same on raw features, cold starts with 1
thread, and the reference as before issue 12 (raw, cold starts, the libraries' default threads). Printed: wall
time of each, the ratios, and the results (chosen C, validation and test top-1), which should agree within noise.

Features: ``--features`` a cached evaluation file ``results/runs/<run>/features/<set>.npz`` (keys
``train_z, train_y, test_z, test_y``); else Fashion-MNIST from the Debian package unpacked at
``--fashion-dir`` (60k/10k images) through a fixed random ReLU projection to 128 dimensions, the size of the
tiny models' z^I (a stand-in for a trained encoder: speed, not accuracy, is measured).

    python bench/bench_linear_probe.py --fashion-dir data/raw/unpacked/dataset-fashion-mnist
    python bench/bench_linear_probe.py --features results/runs/clip_tiny/features/fashion_mnist.npz
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from protoclip.evaluate.metrics.linear import linear_probe


def random_relu_features(fashion_dir: str, dim: int = 128, seed: int = 0):
    from protoclip.data.corpus.evalsets import build_fashion_mnist

    d = build_fashion_mnist(fashion_dir)
    x = d["images"][..., 0].reshape(len(d["images"]), -1).astype(np.float32) / 255.0
    w = np.random.default_rng(seed).normal(size=(x.shape[1], dim)).astype(np.float32) / np.sqrt(x.shape[1])
    z = np.maximum(x @ w, 0.0)
    tr, te = d["split"] == "train", d["split"] == "test"
    return z[tr], d["labels"][tr], z[te], d["labels"][te]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--features", help="cached features npz (train_z, train_y, test_z, test_y)")
    p.add_argument("--fashion-dir", help="unpacked dataset-fashion-mnist .deb (usr/share/datasets/fashion-mnist)")
    p.add_argument("--max-iter", type=int, default=1000)
    p.add_argument("--new-only", action="store_true", help="time only the new defaults (the reference is slow)")
    p.add_argument("--subsample", type=int, default=0, help="use only this many training samples (0: all)")
    args = p.parse_args()
    if args.features:
        with np.load(args.features) as f:
            data = f["train_z"], f["train_y"], f["test_z"], f["test_y"]
        src = args.features
    elif args.fashion_dir:
        data = random_relu_features(args.fashion_dir)
        src = "Fashion-MNIST pixels -> random ReLU projection (128-d)"
    else:
        p.error("give --features or --fashion-dir")
    xtr, ytr, xte, yte = data
    if args.subsample:
        keep = np.random.default_rng(0).permutation(len(xtr))[: args.subsample]
        xtr, ytr = xtr[keep], ytr[keep]
    res = {}
    variants = [("centred, warm, 1 thread", True, True, 1), ("raw, warm, 1 thread", False, True, 1),
                ("raw, cold, 1 thread", False, False, 1),
                ("raw, cold, default threads", False, False, None)][: 1 if args.new_only else 4]
    for name, center, warm, threads in variants:  # the last is the reference: the probe before issue 12
        t0 = time.perf_counter()
        out = linear_probe(xtr, ytr, xte, yte, max_iter=args.max_iter, warm_start=warm, threads=threads,
                           center=center)
        res[name] = (time.perf_counter() - t0, out)
    print(f"\nlinear probe C search + refit: {len(xtr)} x {xtr.shape[1]} train, {len(xte)} test, "
          f"{len(np.unique(ytr))} classes; features: {src}")
    print(f"{'variant':<24} {'wall s':>8} {'C':>10} {'val top1':>9} {'test top1':>10}")
    for name, (t, out) in res.items():
        print(f"{name:<24} {t:>8.1f} {out['C']:>10.3g} {out['val_top1']:>9.2f} {out['top1']:>10.2f}")
    times = [t for t, _ in res.values()]
    if len(times) > 1:
        print(f"speed-up of the new defaults over the reference (last row): x{times[-1] / times[0]:.1f}; "
              f"centring alone (rows 1-2): x{times[1] / times[0]:.1f}"
              + (f"; warm start alone (rows 2-3): x{times[2] / times[1]:.1f}" if len(times) > 2 else ""))


if __name__ == "__main__":
    main()
