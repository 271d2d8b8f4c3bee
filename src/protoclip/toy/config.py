"""Config of the PAUC NEMD toy experiment (``toy:`` section; owned by protoclip.toy).

The paper [pauc-nemd.txt Sec. 3, Fig. 2] fixes: 3-D isotropic Gaussian blobs with 10..50 classes, 1000 samples per
class, embedded into 2-D and shown on the unit circle, PCL vs PAUC, NEMD per class count. Everything else is
methods-spec 3.4 "Toy protocol" [rec] or, where marked "CPU budget", scaled down so that the whole experiment
(5 class counts x 2 methods) runs in about a minute on 2 CPU cores.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from protoclip.config.protocols import Project


@dataclass
class ToyConfig:
    n_classes: list[int] = field(default_factory=lambda: [10, 20, 30, 40, 50])  # paper Fig. 2
    samples_per_class: int = 100  # paper: 1000; CPU budget
    cluster_std: float = 1.0  # spec [rec]: make_blobs(cluster_std=1.0, center_box=(-10, 10))
    center_box: float = 10.0  # blob centres uniform in [-center_box, center_box]^3
    hidden: int = 64  # MLP 3 -> hidden -> hidden -> 2 (spec: "a small MLP, 3 -> 2")
    epochs: int = 15  # spec [rec]: 100; CPU budget
    warmup_epochs: int = 2  # InfoNCE-only epochs (PCL: 20 of 200 = 10%)
    batch_size: int = 256  # PCL / PAUC batch
    lr: float = 1e-3  # spec [rec]: Adam 1e-3
    tau: float = 0.1  # PCL v1 temperature; mean phi is rescaled to it
    momentum: float = 0.99  # PCL: 0.999 over ~1M steps; ~1k steps here, so a faster EMA (our choice)
    queue_size: int = 1024  # r instance negatives (PAUC IN-100: 1024)
    kmeans_multipliers: list[int] = field(default_factory=lambda: [1, 2])  # K = {C, 2C} (spec [rec])
    kmeans_iters: int = 20  # PCL ref-code faiss settings
    kmeans_redo: int = 2  # ref-code: 5; CPU budget
    jitter: float = 0.1  # two views = x + N(0, (jitter * cluster_std)^2) (spec [rec])
    pauc_alpha: float = 1.0  # alignment weight (spec 3.3 [rec])
    pauc_beta: float = 1.0  # uniformity weight
    pauc_gamma: float = 0.1  # correlation weight
    pauc_s: float = 2.0  # alignment exponent
    pauc_t: float = 2.0  # uniformity kernel
    pauc_tau_c: float = 0.1  # correlation softmax temperature
    nemd_n_max: int = 50  # points per class in NEMD (spec: 256); CPU budget: 50 classes = 1225 OT pairs
    plot_points_per_class: int = 40  # points per class drawn on each unit circle
    seed: int = 0

    def validate(self) -> None:
        if not self.n_classes or min(self.n_classes) < 2:
            raise ValueError("n_classes must list class counts >= 2")
        if self.samples_per_class < 2 or self.epochs < 1 or self.batch_size < 2 or self.hidden < 1:
            raise ValueError("samples_per_class, batch_size must be >= 2; epochs, hidden >= 1")
        if not 0 <= self.warmup_epochs <= self.epochs:
            raise ValueError("warmup_epochs must lie in [0, epochs]")
        if min(self.lr, self.tau, self.cluster_std, self.center_box, self.pauc_s, self.pauc_t, self.pauc_tau_c) <= 0:
            raise ValueError("lr, tau, cluster_std, center_box, pauc_s, pauc_t, pauc_tau_c must be > 0")
        if not 0 <= self.momentum <= 1 or self.queue_size < 1 or self.jitter < 0:
            raise ValueError("momentum must lie in [0, 1], queue_size >= 1, jitter >= 0")
        if not self.kmeans_multipliers or min(self.kmeans_multipliers) < 1 or self.kmeans_iters < 1:
            raise ValueError("kmeans_multipliers must be >= 1 and kmeans_iters >= 1")
        if min(self.pauc_alpha, self.pauc_beta, self.pauc_gamma) < 0 or self.nemd_n_max < 2:
            raise ValueError("pauc weights must be >= 0 and nemd_n_max >= 2")
        if self.seed < 0 or self.kmeans_redo < 1 or self.plot_points_per_class < 0:
            raise ValueError("seed and plot_points_per_class must be >= 0, kmeans_redo >= 1")


@runtime_checkable
class ToyProject(Project, Protocol):
    """The project config as the toy NEMD stage reads it (protoclip.project.ProjectConfig; see protoclip.config.protocols)."""

    @property
    def toy(self) -> ToyConfig: ...
