"""k-means clustering of z^I on the test split, ARI / AMI against the labels (paper Sec. IV-G3, Table XII;
:func:`protoclip.evaluate.metrics.clustering.cluster_scores`). Per-example: each image's cluster, the ledger's
resampling unit. Chance level: 0 (the scores are chance-adjusted)."""
from __future__ import annotations

from protoclip.evaluate.tasks.base import SetInput, TaskResult, classes_with, sizes, with_labels
from protoclip.tasks import Task, register


def task_clustering(x: SetInput) -> TaskResult:
    from protoclip.evaluate.metrics.clustering import cluster_scores  # heavy: torch, config loads tasks

    m, assign = cluster_scores(x.feats.test_z, x.feats.test_y, seed=x.cfg.seed, per_example=True)
    return TaskResult(m, "z_image (L2-normalised)", sizes(x.feats), with_labels(assign, x.feats))


def too_small(feats, similarity) -> str | None:
    return "clustering needs at least 2 classes in the test split" if classes_with(feats) < 2 else None


TASK = register(Task("clustering", ("ari", "ami"), task_clustering, examples="clusters", score=True,  # Table XII
                     order=50, too_small=too_small, digits=3))

__all__ = ["TASK", "task_clustering"]
