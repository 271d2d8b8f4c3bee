"""The t-SNE figure of z^I on the test split (paper Fig. 8;
:func:`protoclip.evaluate.metrics.embedding_plots.tsne_plot`): a figure, no table. Settings: ``evaluate.tsne``."""
from __future__ import annotations

from dataclasses import dataclass

from protoclip.evaluate.tasks.base import SetInput, TaskResult, sizes
from protoclip.tasks import Task, register


@dataclass
class TsneConfig:
    """``evaluate.tsne``: the t-SNE figure."""
    max_points: int = 5000  # t-SNE (paper Fig. 8) on a seeded subsample of at most this many test images

    def validate(self) -> None:
        if self.max_points < 1:
            raise ValueError(f"max_points must be >= 1, got {self.max_points}")


def task_tsne(x: SetInput) -> TaskResult:
    from protoclip.evaluate.metrics.embedding_plots import tsne_plot  # heavy: torch, config loads tasks

    m = tsne_plot(x.feats.test_z, x.feats.test_y, x.ds.classnames, x.figure, seed=x.cfg.seed,
                  max_points=x.cfg.tsne.max_points, title=f"{x.ds.name}: t-SNE of z_image")
    m["figure"] = str(x.figure)
    return TaskResult(m, "z_image (L2-normalised)", sizes(x.feats))


def too_small(feats, similarity) -> str | None:
    return "t-SNE needs at least 3 test images" if len(feats.test_y) < 3 else None


TASK = register(Task("tsne", ("n_points",), task_tsne, figure=True, order=70, settings=TsneConfig,
                     too_small=too_small))  # a figure (Fig. 8): no table

__all__ = ["TASK", "TsneConfig", "task_tsne"]
