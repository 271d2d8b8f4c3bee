"""NEMD, uniformity and intra-class spread of the test split (PAUC, methods-spec 3.4;
:func:`protoclip.evaluate.metrics.nemd.nemd_report`): on h^I (the prototype space, the headline) and on z^I.
Settings: ``evaluate.nemd``."""
from __future__ import annotations

from dataclasses import dataclass

from protoclip.evaluate.tasks.base import SetInput, TaskResult, classes_with, sizes
from protoclip.tasks import Task, register


@dataclass
class NemdConfig:
    """``evaluate.nemd``: NEMD's cost control."""
    max_pairs: int = 5000  # NEMD cost control: random subset of class pairs (methods-spec 3.4.8)

    def validate(self) -> None:
        if self.max_pairs < 1:
            raise ValueError(f"max_pairs must be >= 1, got {self.max_pairs}")


def task_nemd(x: SetInput) -> TaskResult:
    from protoclip.evaluate.metrics.nemd import nemd_report  # heavy: torch, config loads tasks

    f, cfg, s = x.feats, x.cfg, x.cfg.nemd
    # methods-spec 3.4: NEMD on h^I (the prototype space) and on z^I separately; h^I is the headline
    m = nemd_report(f.test_h, f.test_y, seed=cfg.seed, max_pairs=s.max_pairs)
    m["z_image"] = nemd_report(f.test_z, f.test_y, seed=cfg.seed, max_pairs=s.max_pairs)
    return TaskResult(m, "h_image (projection head g^I); z_image under 'z_image'", sizes(f))


def too_small(feats, similarity) -> str | None:
    return "NEMD needs at least 2 classes with >= 2 test images" if classes_with(feats, 2) < 2 else None


TASK = register(Task("nemd", ("nemd", "uniformity", "intra_class_spread"), task_nemd, score=True, order=60,
                     settings=NemdConfig, too_small=too_small))

__all__ = ["TASK", "NemdConfig", "task_nemd"]
