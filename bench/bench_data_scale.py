"""The data path at 10k / 100k / 1M pairs (issue 21): prepare, loader, worker memory, one episode, on CPU.

    python bench/bench_data_scale.py --pairs 10000 100000            # while developing
    python bench/bench_data_scale.py --pairs 10000 100000 1000000    # the full curve (hours of a busy 2-core box)

For each size, on a synthetic corpus in img2dataset's layout (``bench/synthetic_shards.py``, 64 px JPEGs,
kept under ``--root``, default /tmp/protoclip-scale):

* **prepare**: ``protoclip prepare`` (the real stage: shard scan in ``--workers`` processes, de-duplication,
  split, manifest) on the shards alone, in a fresh subprocess: wall time, ms per pair, peak RSS of the main
  process and of the largest scan worker. At the smallest size also with one process (the serial scan).
* **loader**: samples/s of our ``ImageTextDataset`` (manifest offsets, one ``pread`` a sample, random order as
  an episode draws it) against webdataset's own streaming reader (``wds.WebDataset`` over the same shards, in
  shard order), both with the same decode (PIL RGB), the same transform (ProtoCLIP's train augmentation at
  ``--image-size``) and the same tokenizer, in a DataLoader with 1 and ``--workers`` workers; per worker =
  samples/s / workers. The two are interleaved (``--repeats`` rounds) so a busy machine slows them alike.
* **worker memory**: a DataLoader worker's private memory (USS: psutil, else /proc/PID/smaps_rollup) at the
  start and end of one epoch over every row's per-row data (id, path, caption, sha256: what ``__getitem__``
  reads besides the image), for the flat arrays and, side by side, for the Python lists the dataset held
  before issue 21. Images are not decoded in this pass: they are read from the shards and freed, and copy-on-read
  is a property of the per-row structures.
* **episode**: one ProtoCLIP episode's feature extraction (tiny-rn, ``--episode`` samples drawn from the whole
  corpus, ``--workers`` workers) and k-means (K = m / 10) on CPU.

Results go to ``bench/results/data_scale_<tag>.txt`` (text) and ``.json``, and a cost-vs-size plot ``.png``.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from synthetic_shards import generate  # noqa: E402


# --------------------------------------------------------------------------- memory
def uss_mib(pid: int | None = None) -> float:
    """Private memory (USS) of a process in MiB: psutil when installed, else /proc/PID/smaps_rollup."""
    pid = pid or os.getpid()
    try:
        import psutil
        return psutil.Process(pid).memory_full_info().uss / 2**20
    except ImportError:
        kb = 0
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                kb += int(line.split()[1])
        return kb / 1024


def vm_hwm_mib() -> float:
    """This process's peak RSS in MiB (VmHWM: unlike ru_maxrss it does not carry over the peak of the process
    that forked and exec'd us, here the benchmark with torch loaded)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# --------------------------------------------------------------------------- prepare (child process)
def prepare_child(pattern: str, out: str, workers: int) -> None:
    """Run the real prepare stage on the shards alone; print one JSON line of timings and peak RSS."""
    from protoclip.config import PathsConfig, ProjectConfig
    from protoclip.data.config import PrepareConfig, UserDataConfig
    from protoclip.data.prepare import run_prepare

    cfg = ProjectConfig(paths=PathsConfig(data_dir=Path(out) / "data", results_dir=Path(out) / "results"),
                        prepare=PrepareConfig(offline_sources=[], eval_sets=[], num_workers=workers,
                                              user_data=[UserDataConfig(name="synth", format="wds", path=pattern)]))
    own = resource.getrusage(resource.RUSAGE_SELF)
    cpu0 = own.ru_utime + own.ru_stime
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):
        report = run_prepare(cfg)
    wall = time.perf_counter() - t0
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    print(json.dumps({"wall_s": wall, "kept": report["total"]["kept"], "dropped": report["total"]["dropped"],
                      # CPU seconds of the stage and its scan workers (imports excluded: measured from the start)
                      "cpu_s": own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime - cpu0,
                      "rss_main_mib": vm_hwm_mib(),
                      "rss_worker_max_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))


def run_prepare_measured(pattern: str, out: Path, workers: int) -> dict:
    import shutil
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": f"{HERE.parent / 'src'}:{os.environ.get('PYTHONPATH', '')}"}
    res = subprocess.run([sys.executable, __file__, "--child-prepare", pattern, str(out), str(workers)],
                         capture_output=True, text=True, env=env, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- loader
class WdsSamples:
    """webdataset's streaming reader with our decode / transform / tokenizer (an IterableDataset)."""

    @staticmethod
    def make(shards: list[str], transform, tokenizer, limit: int):
        import webdataset as wds
        from PIL import Image
        import io

        def decode(sample):
            img = Image.open(io.BytesIO(sample["jpg"]))
            img.load()
            return transform(img.convert("RGB")), tokenizer([sample["txt"].decode("utf-8")])[0]
        # split by worker (each worker its own shards, as open_clip's pipeline does); no shard shuffle
        return wds.WebDataset(shards, shardshuffle=False, nodesplitter=wds.split_by_node,
                              workersplitter=wds.split_by_worker, empty_check=False).map(decode).slice(limit)


def time_loader(loader, limit: int) -> float:
    """samples/s of a loader over its first ``limit`` samples (after the first batch: worker start-up excluded)."""
    it = iter(loader)
    first = next(it)
    n, t0 = 0, time.perf_counter()
    for batch in it:
        n += len(batch[0])
        if n >= limit:
            break
    dt = time.perf_counter() - t0
    del it
    return n / dt if n else float("nan")


def loader_rates(manifest_df, shards: list[str], image_size: int, workers_list: list[int], samples: int,
                 repeats: int, batch: int = 128) -> dict:
    import torch
    from torch.utils.data import DataLoader

    from protoclip.data.pairs import ImageTextDataset
    from protoclip.data.transforms import train_transform
    from protoclip.models import get_tokenizer

    tf = train_transform(image_size, "protoclip")
    tok = get_tokenizer("tiny-rn")
    ds = ImageTextDataset(manifest_df, tf, tok)
    order = np.random.default_rng(0).permutation(len(ds))  # an episode's draw: random rows of the whole corpus
    out: dict = {}
    for w in workers_list:
        ours, theirs = [], []
        for _ in range(repeats):
            sub = torch.utils.data.Subset(ds, order[: samples + batch].tolist())
            ours.append(time_loader(DataLoader(sub, batch_size=batch, num_workers=w), samples))
            # each webdataset worker streams its own shards: give it as many samples in total
            wds_ds = WdsSamples.make(shards, tf, tok, limit=(samples + batch * (w + 1)) // max(1, w) + batch)
            theirs.append(time_loader(DataLoader(wds_ds, batch_size=batch, num_workers=w), samples))
        out[w] = {"ours_samples_s": float(np.median(ours)), "webdataset_samples_s": float(np.median(theirs)),
                  "ours_per_worker": float(np.median(ours)) / w, "webdataset_per_worker": float(np.median(theirs)) / w,
                  "ratio": float(np.median(ours)) / float(np.median(theirs)), "runs_ours": ours, "runs_wds": theirs}
    return out


# --------------------------------------------------------------------------- worker memory
class RowPass:
    """``[c]`` reads every per-row field of rows ``c*chunk .. (c+1)*chunk`` of a dataset's storage and returns
    (characters read, this worker's USS in MiB): one epoch over the rows = one pass over the chunks."""

    def __init__(self, columns: dict, n: int, chunk: int = 8192):
        self.columns, self.n, self.chunk = columns, n, chunk

    def __len__(self) -> int:
        return -(-self.n // self.chunk)

    def __getitem__(self, c: int):
        total = 0
        for i in range(c * self.chunk, min(self.n, (c + 1) * self.chunk)):
            for col in self.columns.values():
                total += len(col[i])
        return total, uss_mib()


def worker_memory(manifest_df) -> dict:
    """USS of one DataLoader worker at the first and the last chunk of an epoch, flat arrays vs lists."""
    import gc

    from torch.utils.data import DataLoader

    from protoclip.data.pairs import StringColumn

    out = {}
    cols = ("id", "path", "caption", "sha256")
    for kind in ("flat", "lists"):
        if kind == "flat":
            storage = {c: StringColumn(manifest_df[c]) for c in cols}
        else:  # what ImageTextDataset held before issue 21
            storage = {c: manifest_df[c].astype(str).tolist() for c in cols}
        gc.collect()
        rp = RowPass(storage, len(manifest_df))
        results = list(DataLoader(rp, batch_size=None, num_workers=1))
        start, end = results[0][1], results[-1][1]
        out[kind] = {"uss_start_mib": start, "uss_end_mib": end, "growth_mib": end - start,
                     "growth_mib_per_1m_rows": (end - start) * 1e6 / len(manifest_df)}
        del storage, rp
        gc.collect()
    return out


# --------------------------------------------------------------------------- one episode
def episode_cost(manifest_df, image_size: int, m: int, workers: int) -> dict:
    import torch

    from protoclip.data.pairs import ImageTextDataset
    from protoclip.data.transforms import train_transform
    from protoclip.prototypes.episode import EpisodePrototypes
    from protoclip.models import build_model, get_tokenizer
    from protoclip.train.distributed import DistInfo
    from protoclip.train.episode import episode_loader, extract_features, sample_episode

    torch.manual_seed(0)
    model = build_model("tiny-rn", head_hidden=512)
    ds = ImageTextDataset(manifest_df, train_transform(image_size, "protoclip"),
                          get_tokenizer("tiny-rn", context_length=model.context_length))
    m = min(m, len(ds))
    idx = sample_episode(len(ds), m, seed=0, episode=0)
    loader = episode_loader(ds, idx, DistInfo(), batch_size=128, num_workers=workers, device=torch.device("cpu"))
    t0 = time.perf_counter()
    feats = extract_features(model, loader, m, torch.device("cpu"), DistInfo(), contextlib.nullcontext)
    t_extract = time.perf_counter() - t0
    t0 = time.perf_counter()
    EpisodePrototypes.build(feats.h_image, feats.h_text, None, k=max(1, m // 10), backend="torch", seed=0)
    t_kmeans = time.perf_counter() - t0
    return {"m": m, "k": max(1, m // 10), "extract_s": t_extract, "kmeans_s": t_kmeans,
            "extract_ms_per_sample": 1e3 * t_extract / m}


# --------------------------------------------------------------------------- report
def machine() -> dict:
    load = os.getloadavg()
    return {"host": platform.node(), "cpus": os.cpu_count(), "cpu": _cpu_model(), "python": platform.python_version(),
            "loadavg_at_start": [round(x, 1) for x in load],
            "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")}


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def plot(results: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = sorted(int(n) for n in results)
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    wall = [results[str(n)]["prepare"]["wall_s"] for n in ns]
    axes[0].loglog(ns, wall, "o-", label="prepare wall (s)")
    axes[0].loglog(ns, [wall[0] * n / ns[0] for n in ns], "k:", label="linear from first point")
    axes[0].set_xlabel("pairs")
    axes[0].set_title("prepare (scan + manifest)")
    axes[0].legend()
    for kind, style in (("flat", "o-"), ("lists", "s--")):
        axes[1].semilogx(ns, [results[str(n)]["memory"][kind]["growth_mib"] for n in ns], style, label=kind)
    axes[1].set_xlabel("pairs")
    axes[1].set_ylabel("MiB")
    axes[1].set_title("worker USS growth over one epoch")
    axes[1].legend()
    w = max(int(k) for k in results[str(ns[0])]["loader"])
    axes[2].semilogx(ns, [results[str(n)]["loader"][str(w)]["ours_per_worker"] for n in ns], "o-", label="ours")
    axes[2].semilogx(ns, [results[str(n)]["loader"][str(w)]["webdataset_per_worker"] for n in ns], "s--",
                     label="webdataset")
    axes[2].set_xlabel("pairs")
    axes[2].set_title(f"loader samples/s per worker ({w} workers)")
    axes[2].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def text_report(info: dict, results: dict) -> str:
    lines = [f"# bench_data_scale.py: {info['date_utc']} UTC on {info['host']} ({info['cpus']} CPUs, {info['cpu']}), "
             f"Python {info['python']}", f"# load average at start: {info['loadavg_at_start']} (1 / 5 / 15 min): "
             f"{'other work shared the machine' if info['loadavg_at_start'][0] > info['cpus'] else 'otherwise idle'}", f"# args: {info['args']}", ""]
    lines.append(f"{'pairs':>9} {'prepare s':>10} {'ms/pair':>8} {'CPU ms/pair':>12} {'serial ms/pair':>15} "
                 f"{'RSS main':>9} "
                 f"{'RSS wkr':>8} {'USS+ flat':>10} {'USS+ lists':>11} {'/1M flat':>9} {'/1M lists':>10}")
    for n in sorted(results, key=int):
        r = results[n]
        p, mem = r["prepare"], r["memory"]
        serial = r.get("prepare_serial", {}).get("ms_per_pair")
        line = (f"{int(n):>9} {p['wall_s']:>10.1f} {p['ms_per_pair']:>8.3f} {p['cpu_ms_per_pair']:>12.3f} "
                f"{(f'{serial:.3f}' if serial else '-'):>15} {p['rss_main_mib']:>8.0f}M "
                f"{p['rss_worker_max_mib']:>7.0f}M ")
        if mem:  # --skip memory leaves it empty
            line += (f"{mem['flat']['growth_mib']:>9.1f}M {mem['lists']['growth_mib']:>10.1f}M "
                     f"{mem['flat']['growth_mib_per_1m_rows']:>8.1f}M {mem['lists']['growth_mib_per_1m_rows']:>9.1f}M")
        lines.append(line)
    lines.append("")
    lines.append(f"{'pairs':>9} {'workers':>8} {'ours s/s':>9} {'wds s/s':>8} {'ours/wkr':>9} {'wds/wkr':>8} "
                 f"{'ratio':>6}"
                 f"  (median of runs)")
    for n in sorted(results, key=int):
        for w, lr in sorted(results[n]["loader"].items(), key=lambda kv: int(kv[0])):
            lines.append(f"{int(n):>9} {int(w):>8} {lr['ours_samples_s']:>9.0f} {lr['webdataset_samples_s']:>8.0f} "
                         f"{lr['ours_per_worker']:>9.0f} {lr['webdataset_per_worker']:>8.0f} {lr['ratio']:>6.2f}")
    lines.append("")
    lines.append(f"{'pairs':>9} {'m':>6} {'K':>5} {'extract s':>10} {'ms/sample':>10} {'k-means s':>10}")
    for n in sorted(results, key=int):
        e = results[n]["episode"]
        if not e:  # --skip episode
            continue
        lines.append(f"{int(n):>9} {e['m']:>6} {e['k']:>5} {e['extract_s']:>10.1f} {e['extract_ms_per_sample']:>10.2f} "
                     f"{e['kmeans_s']:>10.2f}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--root", type=Path, default=Path("/tmp/protoclip-scale"))  # corpora: never inside the repo
    ap.add_argument("--workers", type=int, default=2)  # scan processes and DataLoader workers (2 cores)
    ap.add_argument("--image-size", type=int, default=64)  # corpus JPEG side and the transform's output
    ap.add_argument("--loader-samples", type=int, default=4096)  # samples timed per loader run
    ap.add_argument("--repeats", type=int, default=3)  # interleaved rounds of ours vs webdataset
    ap.add_argument("--episode", type=int, default=4096)  # m of the timed episode (K = m / 10)
    ap.add_argument("--tag", default=None)  # results file name: data_scale_<tag>.txt
    ap.add_argument("--skip", nargs="*", default=[], choices=["loader", "memory", "episode", "serial"])
    args = ap.parse_args(argv)

    from protoclip.data.manifest import read_manifest
    from protoclip.data.userdata import expand_shards

    info = {**machine(), "args": vars(args) | {"root": str(args.root)}}
    tag = args.tag or f"cpu{os.cpu_count()}_{info['date_utc'][:10]}"
    results: dict = {}
    for n in sorted(args.pairs):
        root = args.root / str(n)
        pattern = generate(root / "shards", n, args.image_size, args.workers)
        r: dict = {}
        p = run_prepare_measured(pattern, root / "prepared", args.workers)
        p["ms_per_pair"] = 1e3 * p["wall_s"] / n
        # what the stage would take on 2 idle cores: its CPU time spread over them (the scan is the parallel part)
        p["cpu_ms_per_pair"] = 1e3 * p["cpu_s"] / n
        r["prepare"] = p
        print(f"{n}: prepare {p}", flush=True)
        if "serial" not in args.skip and n == min(args.pairs):
            s = run_prepare_measured(pattern, root / "prepared_serial", 1)
            s["ms_per_pair"] = 1e3 * s["wall_s"] / n
            r["prepare_serial"] = s
            print(f"{n}: prepare serial {s}", flush=True)
        df = read_manifest(root / "prepared" / "data" / "prepared" / "manifest.parquet")
        assert len(df) == n, f"{len(df)} pairs kept of {n}"
        r["memory"] = worker_memory(df) if "memory" not in args.skip else {}
        print(f"{n}: memory {r['memory']}", flush=True)
        r["loader"] = ({str(k): v for k, v in loader_rates(df, expand_shards(pattern), args.image_size,
                                                            sorted({1, args.workers}), args.loader_samples,
                                                            args.repeats).items()}
                       if "loader" not in args.skip else {})
        print(f"{n}: loader {r['loader']}", flush=True)
        r["episode"] = (episode_cost(df, args.image_size, args.episode, args.workers)
                        if "episode" not in args.skip else {})
        print(f"{n}: episode {r['episode']}", flush=True)
        results[str(n)] = r
    out = HERE / "results" / f"data_scale_{tag}"
    out.with_suffix(".json").write_text(json.dumps({"machine": info, "results": results}, indent=2) + "\n")
    text = text_report(info, results)
    out.with_suffix(".txt").write_text(text)
    with contextlib.suppress(Exception):
        plot(results, out.with_suffix(".png"))
    print(text)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child-prepare":
        prepare_child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        main()
