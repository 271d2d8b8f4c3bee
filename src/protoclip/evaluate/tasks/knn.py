"""The weighted k-NN probe on z^I, cosine (paper Sec. IV-C3, Table VII; DINO's;
:func:`protoclip.evaluate.metrics.knn.knn_classifier`). Settings: ``evaluate.knn``."""
from __future__ import annotations

from dataclasses import dataclass

from protoclip.evaluate.tasks.base import SetInput, TaskResult, sizes, with_labels
from protoclip.tasks import Task, register


@dataclass
class KnnConfig:
    """``evaluate.knn``: the k-NN probe."""
    k: int = 20  # DINO / paper Sec. IV-C3: k = 20
    temperature: float = 0.07  # DINO's temperature-weighted vote

    def validate(self) -> None:
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")


def task_knn(x: SetInput) -> TaskResult:
    from protoclip.evaluate.metrics.knn import knn_classifier  # heavy: torch, config loads tasks

    f, s = x.feats, x.cfg.knn
    m, hits = knn_classifier(f.train_z, f.train_y, f.test_z, f.test_y, k=s.k, T=s.temperature,
                             num_classes=len(x.ds.classnames), per_example=True)
    m["k"], m["T"] = s.k, s.temperature
    return TaskResult(m, "z_image (L2-normalised, cosine)", sizes(f, train=True), with_labels(hits, f))


def params(s: KnnConfig, run: str) -> dict:
    """The MLflow params of a run's evaluation: k and the vote's temperature."""
    return {"knn_k": s.k, "knn_temperature": s.temperature}


TASK = register(Task("knn", ("top1",), task_knn, probe=True, examples="hits", validation=True, order=30,  # Table VII
                     settings=KnnConfig, params=params))

__all__ = ["TASK", "KnnConfig", "task_knn"]
