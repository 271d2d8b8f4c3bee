"""Config of the `evaluate` stage (owned by protoclip.evaluate)."""
from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Literal, Protocol, runtime_checkable

from protoclip.jobs.devices import check_device_name
from protoclip.evaluate.protocols import PROTOCLIP, ProtocolName, check_protocol
from protoclip.config.protocols import Project
from protoclip.tasks import TASKS, check_tasks


@dataclass
class EvalDatasetConfig:
    """One evaluation data set. Offline sets need no path; paper sets are found by `path`."""
    # offline: built by `prepare` (data/prepared/eval/<name>.npz; the name heldout_pairs reads the manifest);
    # torchvision: torchvision's on-disk layout (download=False); folder: class-per-folder image tree
    # root/<split>/<class>/; wds: CLIP_benchmark webdataset shards root/{train,test}/{nshards.txt,N.tar};
    # coco / flickr30k: image-text retrieval (evaluate.datasets.captions)
    kind: Literal["offline", "torchvision", "folder", "wds", "coco", "flickr30k"]
    path: str | None = None  # root folder / shard folder / COCO root; null = not configured (reported skipped)
    # coco / flickr30k only, and required there: which images are scored. karpathy_test: Karpathy's 5k test split
    # (the retrieval literature, CLIP_benchmark); val2017 (coco): COCO 2017 val with every caption, what the official
    # ProtoCLIP code evaluates (megvii-research/protoclip src/training/evaluations/coco_retrieval.py)
    split: str | None = None
    tasks: list[str] = field(default_factory=lambda: list(TASKS))  # tasks run on this set (if they apply)
    # Probe on a fixed subsample (the offline budget): null = the whole split; N = a seeded subset of at most N
    # images of the split (class-stratified when the labels are known without decoding images, else uniform;
    # seeded by evaluate.seed and the set's name, never by the run), the same images for every run so runs
    # stay comparable. A split of at most N images is used whole. See datasets.subsample_set.
    max_train: int | None = None  # train split (linear / k-NN probes)
    max_test: int | None = None  # test split (zero-shot, probes, clustering, NEMD, t-SNE); not caption retrieval

    def validate(self) -> None:
        splits = {"coco": ("karpathy_test", "val2017"), "flickr30k": ("karpathy_test",)}.get(self.kind)
        if splits and self.split not in splits:
            raise ValueError(f"split must be one of {', '.join(splits)} for kind {self.kind} (which images are "
                             f"scored), got {self.split!r}")
        if not splits and self.split is not None:
            raise ValueError(f"split applies to kinds coco / flickr30k only, not {self.kind}")
        for key in ("max_train", "max_test"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ValueError(f"{key} must be >= 1 or null (the whole split), got {value}")
        check_tasks(self.tasks)


@dataclass
class TemperatureDiagnosticsConfig:
    """The `temperature` task: the temperature paper's Fig. 1 / Fig. 8 / Table 11 diagnostics
    (protoclip.evaluate.metrics.temperature). Defaults: the offline size (held-out pairs, ~460)."""
    # Fig. 1 "mini-batch of samples in varying sizes" (sizes not given); larger than the pairs: skipped
    # (16 also gives CI's ~24 held-out fixture pairs a curve)
    batch_sizes: list[int] = field(default_factory=lambda: [16, 64, 256])
    # Fig. 1 "Shuffle = P%" as fractions (spec 2.5: P in {0, 1, 5, ...})
    shuffle_shares: list[float] = field(default_factory=lambda: [0.0, 0.01, 0.05, 0.1, 0.2])
    scale_min: float = 0.1  # the sweep of the logit scale tau: log-spaced, covering Multi's ~4 and CLIP's 100
    scale_max: float = 1000.0
    scale_steps: int = 41
    histogram_bins: int = 50  # Fig. 8
    histogram_max_points: int = 2000  # Fig. 8 on a seeded subset of at most this many pairs (n^2 negatives)
    token_subsets: list[int] = field(default_factory=lambda: [1, 2, 4, 8])  # Table 11: k of m tokens (k < m used)
    token_draws: int = 10  # random k-subsets per k (every subset when there are at most this many; paper: not given)

    def validate(self) -> None:
        if not 0 < self.scale_min < self.scale_max or self.scale_steps < 2:
            raise ValueError("temperature.scale_min must be > 0 and < scale_max, scale_steps >= 2")
        if any(b < 2 for b in self.batch_sizes) or any(not 0 <= p <= 1 for p in self.shuffle_shares):
            raise ValueError("temperature.batch_sizes must be >= 2 and shuffle_shares in [0, 1]")
        if self.histogram_bins < 1 or self.histogram_max_points < 2 or self.token_draws < 1:
            raise ValueError("temperature.histogram_bins, token_draws must be >= 1 and histogram_max_points >= 2")

    def scales(self) -> list[float]:
        import numpy as np

        return np.geomspace(self.scale_min, self.scale_max, self.scale_steps).tolist()


@dataclass
class EvaluateConfig:
    datasets: dict[str, EvalDatasetConfig] = field(default_factory=dict)  # name -> data set
    batch_size: int = 256  # feature extraction batch (images and prompts)
    device: str = "auto"  # auto: cuda when available, else cpu
    num_workers: int = 0  # DataLoader processes decoding images (0 on the 2-core CPU default; ~8 on a GPU node)
    # a set's image features are extracted in chunks of this many batches, kept outside the job's outputs until the
    # set's feature file is written: a killed evaluation continues from its last whole chunk (evaluate.resumable)
    extract_chunk_batches: int = 16
    # the feature files (results/runs/<run>/features/<set>.npz: 6 GB for ImageNet's train split at RN50's width)
    # are stored by DVC as an out of their evaluation stage only when true; by default they stay local caches
    track_features: bool = False
    knn_k: int = 20  # DINO / paper Sec. IV-C3: k = 20
    knn_temperature: float = 0.07  # DINO's temperature-weighted vote
    linear_max_iter: int = 1000  # L-BFGS iterations (CLIP protocol, paper Sec. IV-C2)
    linear_center: bool = True  # L-BFGS on features minus their train mean: same optimum, converges (linear.py)
    # resolution of the L-BFGS probe's C search (metrics/linear.py search_C): 4 = one halving fewer than CLIP's 8
    linear_steps_per_decade: int = 4
    linear_sgd_above: int = 100_000  # more training samples -> SGD probe (paper: SGD for ImageNet, L-BFGS else)
    # the linear probe's protocol (evaluate.protocols): protoclip = ProtoCLIP's (Sec. IV-C2: the L-BFGS / SGD probe
    # above, the keys linear_*); pcl, nclip, mocov3 = PCL's, nCLIP's, the temperature paper's SGD recipes
    linear_protocol: ProtocolName = PROTOCLIP
    # {run name pattern (fnmatch, e.g. "pcl_*"): protocol} for runs scored under another protocol than
    # linear_protocol (config/paper.yaml: each paper's runs under its own); a run two patterns match is an error
    linear_protocol_runs: dict[str, ProtocolName] = field(default_factory=dict)
    nemd_max_pairs: int = 5000  # NEMD cost control: random subset of class pairs (methods-spec 3.4.8)
    tsne_max_points: int = 5000  # t-SNE (paper Fig. 8) on a seeded subsample of at most this many test images
    seed: int = 0  # seeds the linear-probe validation split, k-means, NEMD subsampling and t-SNE
    temperature: TemperatureDiagnosticsConfig = field(default_factory=TemperatureDiagnosticsConfig)

    def validate(self) -> None:
        if self.batch_size < 1 or self.knn_k < 1 or self.linear_max_iter < 1 or self.num_workers < 0:
            raise ValueError("batch_size, knn_k and linear_max_iter must be >= 1 and num_workers >= 0")
        if self.linear_steps_per_decade < 1:
            raise ValueError(f"linear_steps_per_decade must be >= 1, got {self.linear_steps_per_decade}")
        if self.extract_chunk_batches < 1:
            raise ValueError(f"extract_chunk_batches must be >= 1, got {self.extract_chunk_batches}")
        if self.knn_temperature <= 0:
            raise ValueError(f"knn_temperature must be > 0, got {self.knn_temperature}")
        if self.nemd_max_pairs < 1 or self.tsne_max_points < 1 or self.linear_sgd_above < 0 or self.seed < 0:
            raise ValueError("nemd_max_pairs and tsne_max_points must be >= 1, linear_sgd_above and seed >= 0")
        check_device_name(self.device)
        check_protocol(self.linear_protocol)
        for pattern, name in self.linear_protocol_runs.items():
            check_protocol(name, f"evaluate.linear_protocol_runs[{pattern!r}]")

    def linear_protocol_of(self, run: str) -> str:
        """The linear protocol run ``run`` is scored under: the one pattern of linear_protocol_runs matching its
        name, else linear_protocol."""
        matched = sorted(p for p in self.linear_protocol_runs if fnmatchcase(run, p))
        if len(matched) > 1:
            raise ValueError(f"run '{run}' matches several evaluate.linear_protocol_runs patterns: "
                             f"{', '.join(matched)}")
        return self.linear_protocol_runs[matched[0]] if matched else self.linear_protocol

    def check_protocol_runs(self, runs: list[str]) -> list[str]:
        """Stop on a run that two patterns of linear_protocol_runs match; return the patterns that match none of
        ``runs`` (a typo, or an overlay that leaves out the experiment files of those runs: the caller warns)."""
        for run in runs:
            self.linear_protocol_of(run)
        return [p for p in self.linear_protocol_runs if not any(fnmatchcase(r, p) for r in runs)]


@runtime_checkable
class EvaluateProject(Project, Protocol):
    """The project config as evaluation and collect read it (protoclip.project.ProjectConfig; protoclip.config.protocols)."""

    @property
    def evaluate(self) -> EvaluateConfig: ...
