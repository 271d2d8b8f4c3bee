"""Config of the `evaluate` stage (owned by protoclip.evaluate): the data sets, extraction, and each task's own
section (``evaluate.<task>``, the dataclass its module registers: :attr:`protoclip.tasks.Task.settings`)."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

from protoclip.config.protocols import Project
from protoclip.config.strict import REGISTERED_BY, SECTIONS, RegisteredSections
from protoclip.jobs.devices import check_device_name
from protoclip.tasks import TASKS, check_tasks, task_sections


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
class EvaluateConfig(RegisteredSections):
    section_kind: ClassVar[str] = "task section"  # (not a field: the unknown-attribute error's word)
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
    seed: int = 0  # seeds the linear-probe validation split, k-means, NEMD subsampling and t-SNE
    # each task's own settings, by task name (the Task's ``settings``: evaluate.knn, evaluate.linear, ...); read as
    # attributes (cfg.evaluate.knn.k), written in YAML beside the fields above (evaluate.knn.k)
    sections: dict[str, Any] = field(default_factory=dict, metadata={
        SECTIONS: task_sections, REGISTERED_BY: "an evaluation task (protoclip.tasks, its module in evaluate/tasks/)"})

    # the keys the task sections replaced: a config that still gives one stops naming its new key
    MOVED: ClassVar[dict[str, str]] = {
        "knn_k": "knn.k", "knn_temperature": "knn.temperature", "linear_max_iter": "linear.max_iter",
        "linear_center": "linear.center", "linear_steps_per_decade": "linear.steps_per_decade",
        "linear_sgd_above": "linear.sgd_above", "linear_protocol": "linear.protocol",
        "linear_protocol_runs": "linear.protocol_runs", "nemd_max_pairs": "nemd.max_pairs",
        "tsne_max_points": "tsne.max_points"}


    def validate(self) -> None:
        if self.batch_size < 1 or self.num_workers < 0:
            raise ValueError("batch_size must be >= 1 and num_workers >= 0")
        if self.extract_chunk_batches < 1:
            raise ValueError(f"extract_chunk_batches must be >= 1, got {self.extract_chunk_batches}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        check_device_name(self.device)

    @classmethod
    def keys(cls) -> list[str]:
        """Every YAML key of ``evaluate``: its fields, then each task's section (``knn``, ``linear``, ...)."""
        declared = [f.name for f in fields(cls) if SECTIONS not in f.metadata]
        return declared + list(task_sections())

    def check_runs(self, runs: list[str]) -> list[str]:
        """Each task section's check of the project's runs (``check_runs``, where a section has one: the linear
        protocol's run patterns): ValueError on a contradiction, the warnings it returns otherwise."""
        return [w for section in self.sections.values() if hasattr(section, "check_runs")
                for w in section.check_runs(runs)]


@runtime_checkable
class EvaluateProject(Project, Protocol):
    """The project config as evaluation and collect read it (protoclip.project.ProjectConfig; protoclip.config.protocols)."""

    @property
    def evaluate(self) -> EvaluateConfig: ...
