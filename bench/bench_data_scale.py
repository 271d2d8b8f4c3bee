"""The data path at 10k / 100k / 1M / 3M pairs (issues 21, 31): prepare, teacher, one episode, loader, on CPU.

    python bench/bench_data_scale.py --pairs 10000 100000                    # while developing
    python bench/bench_data_scale.py --root /scratch --pairs 10000 100000 1000000 3000000 --skip loader
        # the memory curve (peak RSS does not depend on the machine's load: run it any time; ~12 GB of shards at 3M)
    python bench/bench_data_scale.py --root /scratch --pairs 1000000 --idle --repeats 5
        # the speed rows (prepare ms/pair, loader vs webdataset): only on an idle machine; results tagged _idle
    python bench/bench_data_scale.py --root /scratch --pairs 3000000 --teacher-only --teacher-dim 1024
        # the teacher alone at RoBERTa-large's width, on synthetic captions (no shards: 12 GB of chunks at 3M)

For each size, on a synthetic corpus in img2dataset's layout (``bench/synthetic_shards.py``, 64 px JPEGs,
kept under ``--root``, default /tmp/protoclip-scale), each stage in a fresh subprocess (its peak RSS is its own):

* **prepare**: ``protoclip prepare`` (the real stage: shard scan in ``--workers`` processes, spill, bucketed
  de-duplication, streamed manifest) on the shards alone: wall time, ms per pair, CPU ms per pair, peak RSS
  (VmHWM) of the main process and of the largest scan worker. At the smallest size also with one process.
* **teacher**: ``protoclip teacher`` (the real stage: streamed captions, chunks on disk, PCA on the seeded
  sample, streamed projection and npz) with a STAND-IN ENCODER: a caption is the normalised, position-weighted
  sum of fixed random word vectors (``--teacher-dim``, default 384 = the offline teacher's width), so that the
  measure is the stage's own memory and time, not a transformer's. Peak RSS, wall time, PCA sample rows.
* **episode** (the train stage's data side): in one process, what ``protoclip train`` does before and in its first
  episode: the run's manifest rows as the flat-array dataset (``TrainJob.dataset``), the training-data digest
  (``TrainJob.log_training_data`` with MLflow off), the teacher rows (``TrainJob.teacher``, from the teacher
  step's cache),
  then one ProtoCLIP episode's extraction (tiny-rn, ``--episode`` samples drawn from the whole corpus,
  ``--workers`` workers) and k-means (K = m / 10, with the external teacher's k-means). Peak RSS of the main
  process and the largest DataLoader worker; extraction and k-means times.
* **loader**: samples/s of our ``ImageTextDataset`` (manifest offsets, one ``pread`` a sample, random order as
  an episode draws it) against webdataset's own streaming reader (``wds.WebDataset`` over the same shards, in
  shard order), both with the same decode (PIL RGB), the same transform (ProtoCLIP's train augmentation at
  ``--image-size``) and the same tokenizer, in a DataLoader with 1 and ``--workers`` workers; per worker =
  samples/s / workers. The two are interleaved (``--repeats`` rounds) so a busy machine slows them alike.
* **worker memory**: a DataLoader worker's private memory (USS: psutil, else /proc/PID/smaps_rollup) at the
  start and end of one epoch over every row's per-row data (id, path, caption, sha256: what ``__getitem__``
  reads besides the image), for the flat arrays and, side by side, for the Python lists the dataset held
  before issue 21.

``--idle``: only the timed rows (prepare, loader), for an idle machine. The load average is recorded at the start
and the end of the run. Results go to ``bench/results/data_scale_<tag>.txt`` (text) and ``.json``, and a
cost-vs-size plot ``.png`` (not kept in git).
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
    from protoclip.project import PathsConfig, ProjectConfig
    from protoclip.data.config import PrepareConfig, UserDataConfig
    from protoclip.data.stage import run_prepare

    cfg = ProjectConfig(paths=PathsConfig(data_dir=Path(out) / "data", results_dir=Path(out) / "results"),
                        prepare=PrepareConfig(offline_sources=[], eval_sets=[], num_workers=workers,
                                              user_data=[UserDataConfig(name="synth", format="wds", path=pattern)]))
    floor = vm_hwm_mib()  # the imports, before any work
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
                      "rss_imports_mib": floor, "rss_main_mib": vm_hwm_mib(),
                      "rss_worker_max_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))


def run_child(*args: str) -> dict:
    """Run one ``--child-*`` step of this script in a fresh interpreter; its last stdout line is its JSON."""
    env = {**os.environ, "PYTHONPATH": f"{HERE.parent / 'src'}:{os.environ.get('PYTHONPATH', '')}"}
    res = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, env=env)
    if res.returncode != 0:
        raise RuntimeError(f"{args[0]} failed (exit {res.returncode}):\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def run_prepare_measured(pattern: str, out: Path, workers: int) -> dict:
    import shutil
    shutil.rmtree(out, ignore_errors=True)
    return run_child("--child-prepare", pattern, str(out), str(workers))


# --------------------------------------------------------------------------- teacher (child process)
class StandInTeacher:
    """A cheap deterministic stand-in for a text teacher (the benchmark measures the stage, not a transformer):
    caption = L2-normalised sum of fixed random word vectors, word i weighted 1 + i / 8 (so that word order counts
    and captions of the same words differ). Vectorised: a sparse caption x word matrix times the word vectors."""

    weights = None

    def __init__(self, dim: int, seed: int = 0):
        self.dim, self.name, self.seed = dim, f"stand-in-hash-{dim}", seed
        self.vocab: dict[str, int] = {}
        self.vectors = np.zeros((0, dim), np.float32)

    def _index(self, word: str) -> int:
        i = self.vocab.get(word)
        if i is None:
            i = self.vocab[word] = len(self.vocab)
            if i >= len(self.vectors):  # grow the table of word vectors (seeded by the word's rank: deterministic)
                more = np.random.default_rng([self.seed, i]).standard_normal((max(64, i), self.dim)).astype(np.float32)
                self.vectors = np.concatenate([self.vectors, more])
        return i

    def encode(self, captions, batch_size=256, max_length=128, progress=True) -> np.ndarray:
        from scipy import sparse

        rows, cols, vals = [], [], []
        for r, c in enumerate(captions):
            for j, w in enumerate(c.split()):
                rows.append(r)
                cols.append(self._index(w))
                vals.append(1.0 + j / 8)
        m = sparse.csr_matrix((vals, (rows, cols)), shape=(len(captions), len(self.vectors)), dtype=np.float32)
        out = np.asarray(m @ self.vectors, dtype=np.float32)
        out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return out


def teacher_child(data_dir: str, dim: int, points_per_dim: int) -> None:
    """The real teacher stage on a prepared manifest with the stand-in encoder; one JSON line."""
    from protoclip.project import PathsConfig, ProjectConfig
    from protoclip.teacher.stage import run_teacher
    from protoclip.teacher.config import TeacherConfig

    floor = vm_hwm_mib()  # the imports (torch for the encoders, scikit-learn, pyarrow): before any work
    teacher = StandInTeacher(dim)
    cfg = ProjectConfig(paths=PathsConfig(data_dir=Path(data_dir), results_dir=Path(data_dir).parent / "results"),
                        teacher=TeacherConfig(name=teacher.name, pca_max_points_per_dim=points_per_dim))
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):
        out = run_teacher(cfg, teacher=teacher)
    wall = time.perf_counter() - t0
    meta = json.loads(out.with_suffix(".json").read_text())
    print(json.dumps({"wall_s": wall, "n": meta["n"], "dim": dim, "pca_fit_rows": meta["pca_fit_rows"],
                      "pca_max_points_per_dim": points_per_dim, "cache_bytes": out.stat().st_size,
                      "encoder": "stand-in (hashed word vectors)", "rss_imports_mib": floor,
                      "rss_main_mib": vm_hwm_mib()}))


def caption_manifest(data_dir: Path, n: int, seed: int = 0) -> Path:
    """A manifest of ``n`` synthetic pairs whose images do not exist (the teacher and the train stage's data
    structures read ids, paths, captions and hashes only): the stages measured at sizes or widths whose shards would
    not fit the disk. Ids, paths (``<root>/shards/NNNNN.tar::<key>.jpg``), captions, hashes and offsets as the
    prepared synthetic corpus has them, so the bytes per pair are the same."""
    import hashlib

    from protoclip.data.loading.manifest import ManifestWriter, Pair, pairs_batch
    from protoclip.data.corpus.split import split_of
    from synthetic_shards import VOCAB

    out = data_dir / "prepared" / "manifest.parquet"
    rng = np.random.default_rng(seed)
    vocab = np.asarray(VOCAB)
    shards = data_dir.parent / "shards"
    with ManifestWriter(out) as w:
        for lo in range(0, n, 65536):
            pairs = []
            for i in range(lo, min(n, lo + 65536)):
                key = f"{i // 1000:05d}{i % 1000:04d}"
                sid = f"synth/{i // 1000:05d}.tar/{key}"
                pairs.append(Pair(sid, f"{shards}/{i // 1000:05d}.tar::{key}.jpg",
                                  " ".join(rng.choice(vocab, size=int(rng.integers(6, 11)))), "synth", "",
                                  hashlib.sha256(key.encode()).hexdigest(), split=split_of(sid, 0, 0.1),
                                  offset=1536 * (i % 1000 + 1), size=1500))
            w.write(pairs_batch(pairs))
    return out


def train_data_child(data_dir: str, teacher: str) -> None:
    """The train stage's data structures alone (no episode: its arrays do not grow with the corpus): the run's
    dataset, the training-data digest, the teacher rows. One JSON line."""
    from protoclip.project import PathsConfig, ProjectConfig
    from protoclip.data.config import PrepareConfig, UserDataConfig
    from protoclip.files.layout import Layout
    from protoclip.models import get_tokenizer
    from protoclip.tracking import Tracker
    from protoclip.train.config import TrainConfig
    from protoclip.data.loading.training_set import resolve_sources
    from protoclip.train.stage import TrainJob

    cfg = ProjectConfig(paths=PathsConfig(data_dir=Path(data_dir), results_dir=Path(data_dir).parent / "results"),
                        prepare=PrepareConfig(offline_sources=[], eval_sets=[],
                                              user_data=[UserDataConfig(name="synth", format="wds", path="x.tar")]))
    tcfg = TrainConfig(name="bench", data=["synth"], model="tiny-rn", teacher=teacher, head_hidden=512)
    job = TrainJob(tcfg, Layout.from_config(cfg), resolve_sources(tcfg.data, cfg.prepare.offline_sources),
                   cfg.evaluate, cfg.paths, Path(cfg.source))
    tokenizer = get_tokenizer("tiny-rn")
    floor = vm_hwm_mib()
    t0 = time.perf_counter()
    dataset = job.dataset(64, tokenizer)
    ids = dataset.ids
    rss_dataset = vm_hwm_mib()
    job.log_training_data(Tracker())
    feats = job.teacher(ids)
    print(json.dumps({"n": len(dataset), "teacher_dim": int(feats.shape[1]), "data_s": time.perf_counter() - t0,
                      "rss_imports_mib": floor, "rss_dataset_mib": rss_dataset, "rss_data_mib": vm_hwm_mib(),
                      "rss_end_mib": _vm_rss_mib()}))


def _vm_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# --------------------------------------------------------------------------- the train stage's data side (child)
def train_child(data_dir: str, teacher: str, image_size: int, m: int, workers: int) -> None:
    """What ``protoclip train`` holds for its data before and in one episode; one JSON line."""
    import torch

    from protoclip.project import PathsConfig, ProjectConfig
    from protoclip.data.config import PrepareConfig, UserDataConfig
    from protoclip.files.layout import Layout
    from protoclip.prototypes.episode import EpisodePrototypes
    from protoclip.models import build_model, get_tokenizer
    from protoclip.tracking import Tracker
    from protoclip.train.config import TrainConfig
    from protoclip.train.distributed import DistInfo
    from protoclip.train.episode import extract_features
    from protoclip.train.loader import RunLoader
    from protoclip.data.loading.training_set import resolve_sources
    from protoclip.train.stage import TrainJob

    cfg = ProjectConfig(paths=PathsConfig(data_dir=Path(data_dir), results_dir=Path(data_dir).parent / "results"),
                        prepare=PrepareConfig(offline_sources=[], eval_sets=[],
                                              user_data=[UserDataConfig(name="synth", format="wds", path="x.tar")]))
    tcfg = TrainConfig(name="bench", data=["synth"], model="tiny-rn", teacher=teacher, episode_size=m,
                       head_hidden=512)
    layout = Layout.from_config(cfg)
    job = TrainJob(tcfg, layout, resolve_sources(tcfg.data, cfg.prepare.offline_sources), cfg.evaluate, cfg.paths,
                   Path(cfg.source))
    torch.manual_seed(0)
    model = build_model("tiny-rn", head_hidden=512)
    floor = vm_hwm_mib()  # imports and the model, before any data
    t0 = time.perf_counter()
    dataset = job.dataset(image_size, get_tokenizer("tiny-rn", context_length=model.context_length))
    ids = dataset.ids
    job.log_training_data(Tracker())  # MLflow off: the manifest read and digest, not MLflow's work
    feats = job.teacher(ids)
    t_data = time.perf_counter() - t0
    del ids
    rss_data = vm_hwm_mib()
    m = min(m, len(dataset))
    loader = RunLoader(dataset, episode_size=m, seed=0, batch_size=128, extract_batch_size=128, num_workers=workers,
                       info=DistInfo(), device=torch.device("cpu"), n_episodes=1)
    idx = loader.indices(0)
    t0 = time.perf_counter()
    ep = extract_features(model, loader.pass_of(0, "extract"), m, torch.device("cpu"), DistInfo(),
                          contextlib.nullcontext)
    t_extract = time.perf_counter() - t0
    loader.close()
    t0 = time.perf_counter()
    EpisodePrototypes.build(ep.h_image, ep.h_text, torch.from_numpy(feats[idx]), k=max(1, m // 10), backend="torch",
                            seed=0)
    t_kmeans = time.perf_counter() - t0
    print(json.dumps({"n": len(dataset), "m": m, "k": max(1, m // 10), "teacher_dim": int(feats.shape[1]),
                      "data_s": t_data, "extract_s": t_extract, "kmeans_s": t_kmeans,
                      "extract_ms_per_sample": 1e3 * t_extract / m, "rss_imports_mib": floor, "rss_data_mib": rss_data,
                      "rss_main_mib": vm_hwm_mib(),
                      "rss_worker_max_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))


# --------------------------------------------------------------------------- evaluation features (child process)
class _TinyImages:
    """A map-style evaluation split of ``n`` 8 px images (the arrays, not the decoding, are measured here)."""

    def __init__(self, n: int, classes: int):
        self.n, self.classes = n, classes

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        from PIL import Image
        return Image.new("RGB", (8, 8), (i % 251, (i // 251) % 251, 7)), i % self.classes


def eval_child(n_train: int, n_test: int, dim: int, head: int, classes: int) -> None:
    """What the evaluate stage holds for a large labelled set: features of every image (``encode_images``: z [N, dim]
    and h [N, head] float32), then the linear probe (SGD above 100k images, ImageNet's protocol; 1 epoch here: memory
    does not depend on epochs) and the kNN probe on them. A stand-in image tower (a fixed linear map of the pixels)
    replaces the network: the arrays are the measure. One JSON line."""
    import torch
    import torchvision.transforms.functional as TF

    from protoclip.evaluate.features import encode_images
    from protoclip.evaluate.metrics.knn import knn_classifier
    from protoclip.evaluate.metrics.linear import linear_eval

    class Tower(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj, self.image_head = torch.nn.Linear(3 * 8 * 8, dim), torch.nn.Linear(dim, head)

        def encode_image(self, x):
            return self.proj(x.flatten(1))

    torch.manual_seed(0)
    model = Tower().eval()
    floor = vm_hwm_mib()
    t0 = time.perf_counter()
    train_z, train_h, train_y = encode_images(model, _TinyImages(n_train, classes), TF.to_tensor, torch.device("cpu"),
                                              batch_size=256)
    test_z, _test_h, test_y = encode_images(model, _TinyImages(n_test, classes), TF.to_tensor, torch.device("cpu"),
                                            batch_size=256)
    t_extract, rss_features = time.perf_counter() - t0, vm_hwm_mib()
    t0 = time.perf_counter()
    lin = linear_eval(train_z, train_y, test_z, test_y, epochs=1, num_classes=classes, show_progress=False) \
        if n_train > 100_000 else linear_eval(train_z, train_y, test_z, test_y, C_grid=[1.0], max_iter=5)
    t_linear, rss_linear = time.perf_counter() - t0, vm_hwm_mib()
    t0 = time.perf_counter()
    knn_classifier(train_z, train_y, test_z, test_y, k=20, num_classes=classes)
    t_knn = time.perf_counter() - t0
    print(json.dumps({"n_train": n_train, "n_test": n_test, "dim": dim, "head": head, "classes": classes,
                      "probe": "sgd" if "final_train_loss" in lin else "lbfgs", "extract_s": t_extract,
                      "linear_s": t_linear, "knn_s": t_knn, "rss_imports_mib": floor, "rss_features_mib": rss_features,
                      "rss_linear_mib": rss_linear, "rss_main_mib": vm_hwm_mib()}))


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

    from protoclip.data.loading.pairs import ImageTextDataset
    from protoclip.data.loading.transforms import train_transform
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

    from protoclip.data.loading.pairs import StringColumn

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


# --------------------------------------------------------------------------- report
def loadavg() -> list[float]:
    return [round(x, 1) for x in os.getloadavg()]


def machine() -> dict:
    return {"host": platform.node(), "cpus": os.cpu_count(), "cpu": _cpu_model(), "python": platform.python_version(),
            "loadavg_at_start": loadavg(), "mem_total_gib": _mem_total_gib(),
            "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")}


def _mem_total_gib() -> float:
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    return float("nan")


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def _series(results: dict, *keys: str) -> tuple[list[int], list[float]]:
    ns, ys = [], []
    for n in sorted(results, key=int):
        v = results[n]
        for k in keys:
            v = v.get(k, {}) if isinstance(v, dict) else {}
        if v not in ({}, None):
            ns.append(int(n))
            ys.append(v)
    return ns, ys


def plot(results: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.9))
    ns, wall = _series(results, "prepare", "ms_per_pair")
    if ns:
        axes[0].semilogx(ns, wall, "o-", label="prepare wall")
        axes[0].semilogx(*_series(results, "prepare", "cpu_ms_per_pair"), "s--", label="prepare CPU (all processes)")
        axes[0].axhline(0.15, color="k", ls=":", label="target 0.15 (wall, 2 cores)")
        axes[0].set_ylabel("ms per pair")
        axes[0].set_title("prepare scan")
        axes[0].legend(fontsize=8)
    for keys, style, label in ((("prepare", "rss_main_mib"), "o-", "prepare"),
                               (("teacher", "rss_main_mib"), "s-", "teacher (stand-in encoder)"),
                               (("episode", "rss_main_mib"), "^-", "train data side + 1 episode (main)"),
                               (("episode", "rss_worker_max_mib"), "v--", "  its DataLoader worker")):
        xs, ys = _series(results, *keys)
        if xs:
            axes[1].semilogx(xs, ys, style, label=label)
    axes[1].axhline(1.5 * 1024, color="k", ls=":", label="target 1.5 GiB (prepare, teacher)")
    axes[1].set_ylabel("peak RSS (MiB)")
    axes[1].set_title("peak memory per stage")
    axes[1].legend(fontsize=8)
    ws = sorted({int(w) for n in results for w in results[n].get("loader", {})})
    if ws:
        w = max(ws)
        axes[2].semilogx(*_series(results, "loader", str(w), "ratio"), "o-", label=f"ours / webdataset ({w} workers)")
        axes[2].axhline(1.0, color="k", ls=":")
        axes[2].set_title("loader samples/s ratio (interleaved)")
        axes[2].legend(fontsize=8)
    for ax in axes:
        ax.set_xlabel("pairs")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def text_report(info: dict, results: dict) -> str:
    busy = max(info["loadavg_at_start"][0], info.get("loadavg_at_end", [0])[0]) > 0.5 * info["cpus"]
    lines = [f"# bench_data_scale.py: {info['date_utc']} UTC on {info['host']} ({info['cpus']} CPUs, {info['cpu']}, "
             f"{info['mem_total_gib']} GiB), Python {info['python']}",
             f"# load average (1 / 5 / 15 min) at start {info['loadavg_at_start']}, at end "
             f"{info.get('loadavg_at_end')}: {'other work shared the machine (timings are not those of an idle machine; peak RSS does not depend on it)' if busy else 'otherwise idle'}",
             f"# args: {info['args']}", ""]
    lines.append("## prepare (real stage, 2 scan processes) and DataLoader worker USS over one epoch of row reads")
    lines.append(f"{'pairs':>9} {'prepare s':>10} {'ms/pair':>8} {'CPU ms/pair':>12} {'serial ms/pair':>15} "
                 f"{'RSS main':>9} {'imports':>8} {'RSS wkr':>8} {'USS+ flat':>10} {'USS+ lists':>11} {'/1M flat':>9} "
                 f"{'/1M lists':>10}")
    for n in sorted(results, key=int):
        r = results[n]
        p, mem = r.get("prepare"), r.get("memory")
        if not p:
            continue
        serial = r.get("prepare_serial", {}).get("ms_per_pair")
        line = (f"{int(n):>9} {p['wall_s']:>10.1f} {p['ms_per_pair']:>8.3f} {p['cpu_ms_per_pair']:>12.3f} "
                f"{(f'{serial:.3f}' if serial else '-'):>15} {p['rss_main_mib']:>8.0f}M "
                f"{p.get('rss_imports_mib', float('nan')):>7.0f}M {p['rss_worker_max_mib']:>7.0f}M ")
        if mem:  # --skip memory leaves it empty
            line += (f"{mem['flat']['growth_mib']:>9.1f}M {mem['lists']['growth_mib']:>10.1f}M "
                     f"{mem['flat']['growth_mib_per_1m_rows']:>8.1f}M {mem['lists']['growth_mib_per_1m_rows']:>9.1f}M")
        lines.append(line.rstrip())
    if any(results[n].get("teacher") for n in results):
        lines += ["", "## teacher (real stage; STAND-IN ENCODER: hashed word vectors, not a transformer)"]
        lines.append(f"{'pairs':>9} {'dim':>5} {'PCA rows':>9} {'wall s':>8} {'RSS main':>9} {'imports':>8} "
                     f"{'cache MB':>9}")
        for n in sorted(results, key=int):
            t = results[n].get("teacher")
            if t:
                lines.append(f"{int(n):>9} {t['dim']:>5} {t['pca_fit_rows']:>9} {t['wall_s']:>8.1f} "
                             f"{t['rss_main_mib']:>8.0f}M {t['rss_imports_mib']:>7.0f}M {t['cache_bytes'] / 1e6:>9.1f}")
    if any(results[n].get("episode") for n in results):
        lines += ["", "## the train stage's data side: dataset + digest + teacher rows, then one ProtoCLIP episode "
                  "(tiny-rn extraction, k-means)"]
        lines.append(f"{'pairs':>9} {'imports':>8} {'data s':>7} {'RSS data':>9} {'m':>6} {'K':>5} {'extract s':>10} "
                     f"{'ms/sample':>10} {'k-means s':>10} {'RSS main':>9} {'RSS wkr':>8}")
        for n in sorted(results, key=int):
            e = results[n].get("episode")
            if e:
                lines.append(f"{int(n):>9} {e['rss_imports_mib']:>7.0f}M {e['data_s']:>7.1f} {e['rss_data_mib']:>8.0f}M "
                             f"{e['m']:>6} {e['k']:>5} "
                             f"{e['extract_s']:>10.1f} {e['extract_ms_per_sample']:>10.2f} {e['kmeans_s']:>10.2f} "
                             f"{e['rss_main_mib']:>8.0f}M {e['rss_worker_max_mib']:>7.0f}M")
    if any(results[n].get("train_data") for n in results):
        lines += ["", "## the train stage's data structures alone (manifest of synthetic pairs without images): the run's "
                  "dataset, the training-data digest, the teacher rows"]
        lines.append(f"{'pairs':>9} {'train':>9} {'imports':>8} {'data s':>7} {'RSS dataset':>12} {'RSS data':>9} "
                     f"{'RSS end':>8}")
        for n in sorted(results, key=int):
            d = results[n].get("train_data")
            if d:
                lines.append(f"{int(n):>9} {d['n']:>9} {d['rss_imports_mib']:>7.0f}M {d['data_s']:>7.1f} "
                             f"{d['rss_dataset_mib']:>11.0f}M {d['rss_data_mib']:>8.0f}M {d['rss_end_mib']:>7.0f}M")
    if info.get("eval"):
        lines += ["", "## evaluation features of a large labelled set (encode_images with a stand-in image tower; "
                  "linear probe 1 epoch; kNN k=20)"]
        lines.append(f"{'train':>9} {'test':>6} {'dim+head':>9} {'classes':>8} {'probe':>6} {'imports':>8} "
                     f"{'RSS feats':>10} {'RSS linear':>11} {'RSS main':>9}")
        for e in info["eval"]:
            lines.append(f"{e['n_train']:>9} {e['n_test']:>6} {e['dim'] + e['head']:>9} {e['classes']:>8} "
                         f"{e['probe']:>6} {e['rss_imports_mib']:>7.0f}M {e['rss_features_mib']:>9.0f}M "
                         f"{e['rss_linear_mib']:>10.0f}M {e['rss_main_mib']:>8.0f}M")
    if any(results[n].get("loader") for n in results):
        lines += ["", "## loader: ours vs webdataset's reader (interleaved rounds)"]
        lines.append(f"{'pairs':>9} {'workers':>8} {'ours s/s':>9} {'wds s/s':>8} {'ours/wkr':>9} {'wds/wkr':>8} "
                     f"{'ratio':>6}  (median of runs; runs ours | webdataset)")
        for n in sorted(results, key=int):
            for w, lr in sorted(results[n].get("loader", {}).items(), key=lambda kv: int(kv[0])):
                runs = (" ".join(f"{x:.0f}" for x in lr["runs_ours"]) + " | "
                        + " ".join(f"{x:.0f}" for x in lr["runs_wds"]))
                lines.append(f"{int(n):>9} {int(w):>8} {lr['ours_samples_s']:>9.0f} {lr['webdataset_samples_s']:>8.0f} "
                             f"{lr['ours_per_worker']:>9.0f} {lr['webdataset_per_worker']:>8.0f} {lr['ratio']:>6.2f}"
                             f"  {runs}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, nargs="*", default=[10_000, 100_000])
    ap.add_argument("--root", type=Path, default=Path("/tmp/protoclip-scale"))  # corpora: never inside the repo
    ap.add_argument("--workers", type=int, default=2)  # scan processes and DataLoader workers (2 cores)
    ap.add_argument("--image-size", type=int, default=64)  # corpus JPEG side and the transform's output
    ap.add_argument("--loader-samples", type=int, default=4096)  # samples timed per loader run
    ap.add_argument("--repeats", type=int, default=3)  # interleaved rounds of ours vs webdataset
    ap.add_argument("--episode", type=int, default=4096)  # m of the measured episode (K = m / 10)
    ap.add_argument("--teacher-dim", type=int, default=384)  # stand-in teacher width (MiniLM 384; RoBERTa-large 1024)
    ap.add_argument("--pca-points-per-dim", type=int, default=1000)  # teacher.pca_max_points_per_dim (faiss' 1000)
    ap.add_argument("--eval-images", type=int, nargs="*", default=[])  # evaluation-set sizes (train images) to measure
    ap.add_argument("--idle", action="store_true", help="only the timed rows (prepare, loader): for an idle machine")
    ap.add_argument("--teacher-only", action="store_true",
                    help="only the teacher, on a manifest of synthetic captions without images (no shards)")
    ap.add_argument("--keep", action="store_true", help="keep each size's prepared data and teacher cache")
    ap.add_argument("--drop-corpora", action="store_true", help="delete each size's shards once it is measured (disk)")
    ap.add_argument("--tag", default=None)  # results file name: data_scale_<tag>.txt
    ap.add_argument("--skip", nargs="*", default=[],
                    choices=["loader", "memory", "episode", "serial", "teacher", "prepare"])
    args = ap.parse_args(argv)
    if args.idle:  # the timed rows only, each alone on the machine
        args.skip = sorted(set(args.skip) | {"memory", "episode", "serial", "teacher"})

    import shutil

    from protoclip.data.loading.manifest import read_manifest
    from protoclip.data.corpus.userdata import expand_shards

    info = {**machine(), "args": vars(args) | {"root": str(args.root)}}
    tag = args.tag or f"cpu{os.cpu_count()}_{'idle_' if args.idle else ''}{info['date_utc'][:10]}"
    results: dict = {}
    out = HERE / "results" / f"data_scale_{tag}"
    for n_img in args.eval_images:  # RN50's z (1024) and h (128), ImageNet's 1000 classes, a 2k-image test split
        info.setdefault("eval", []).append(run_child("--child-eval", str(n_img), "2000", "1024", "128", "1000"))
        print(f"eval {n_img}: {info['eval'][-1]}", flush=True)
    for n in sorted(args.pairs) if args.teacher_only else []:
        data_dir = args.root / f"captions-{n}" / "data"
        caption_manifest(data_dir, n)
        results[str(n)] = {"teacher": run_child("--child-teacher", str(data_dir), str(args.teacher_dim),
                                                str(args.pca_points_per_dim))}
        print(f"{n}: teacher {results[str(n)]['teacher']}", flush=True)
        if "episode" not in args.skip:  # the train stage's data structures on the same manifest and cache
            results[str(n)]["train_data"] = run_child("--child-train-data", str(data_dir),
                                                      StandInTeacher(args.teacher_dim).name)
            print(f"{n}: train data {results[str(n)]['train_data']}", flush=True)
        shutil.rmtree(data_dir.parent, ignore_errors=True)
    for n in sorted(args.pairs) if not args.teacher_only else []:
        root = args.root / str(n)
        pattern = generate(root / "shards", n, args.image_size, args.workers)
        prepared = root / "prepared"
        r: dict = {}
        if "prepare" not in args.skip or not (prepared / "data" / "prepared" / "manifest.parquet").is_file():
            p = run_prepare_measured(pattern, prepared, args.workers)
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
            shutil.rmtree(root / "prepared_serial", ignore_errors=True)
        data_dir = prepared / "data"
        if "teacher" not in args.skip:
            r["teacher"] = run_child("--child-teacher", str(data_dir), str(args.teacher_dim),
                                     str(args.pca_points_per_dim))
            print(f"{n}: teacher {r['teacher']}", flush=True)
        if "episode" not in args.skip and "teacher" not in args.skip:
            r["episode"] = run_child("--child-train", str(data_dir), StandInTeacher(args.teacher_dim).name,
                                     str(args.image_size), str(args.episode), str(args.workers))
            print(f"{n}: episode {r['episode']}", flush=True)
        if "memory" not in args.skip or "loader" not in args.skip:
            df = read_manifest(data_dir / "prepared" / "manifest.parquet")
            assert len(df) == n, f"{len(df)} pairs kept of {n}"
            if "memory" not in args.skip:
                r["memory"] = worker_memory(df)
                print(f"{n}: memory {r['memory']}", flush=True)
            if "loader" not in args.skip:
                r["loader"] = {str(k): v for k, v in loader_rates(df, expand_shards(pattern), args.image_size,
                                                                   sorted({1, args.workers}), args.loader_samples,
                                                                   args.repeats).items()}
                print(f"{n}: loader {r['loader']}", flush=True)
            del df
        if not args.keep:
            shutil.rmtree(prepared, ignore_errors=True)
        if args.drop_corpora:
            shutil.rmtree(root, ignore_errors=True)
        results[str(n)] = r
        info["loadavg_at_end"] = loadavg()
        # written after every size: a long run's finished sizes are kept if a later one fails
        out.with_suffix(".json").write_text(json.dumps({"machine": info, "results": results}, indent=2) + "\n")
        out.with_suffix(".txt").write_text(text_report(info, results))
    info["loadavg_at_end"] = loadavg()
    out.with_suffix(".json").write_text(json.dumps({"machine": info, "results": results}, indent=2) + "\n")
    out.with_suffix(".txt").write_text(text_report(info, results))
    with contextlib.suppress(Exception):
        plot(results, out.with_suffix(".png"))
    print(text_report(info, results))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child-prepare":
        prepare_child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif len(sys.argv) > 1 and sys.argv[1] == "--child-teacher":
        teacher_child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif len(sys.argv) > 1 and sys.argv[1] == "--child-eval":
        eval_child(*map(int, sys.argv[2:7]))
    elif len(sys.argv) > 1 and sys.argv[1] == "--child-train-data":
        train_data_child(sys.argv[2], sys.argv[3])
    elif len(sys.argv) > 1 and sys.argv[1] == "--child-train":
        train_child(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]))
    else:
        main()
