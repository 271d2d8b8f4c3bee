"""The papers' linear-probe protocols on frozen features (``evaluate.linear_protocol``): the optimizer, learning rate,
schedule and epochs each paper states for its linear evaluation, trained by
:mod:`protoclip.evaluate.metrics.linear_sgd`. No torch here: the config validates names against this table. Each
entry quotes its paper; what a paper leaves unstated is a project choice, marked ``# choice``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

# the protocol names a config may give (evaluate.linear_protocol): the default, then the PROTOCOLS below
ProtocolName = Literal["protoclip", "pcl", "nclip", "mocov3"]
# the default: metrics.linear's L-BFGS / SGD probe (ProtoCLIP's numbers unchanged). ProtoCLIP Sec. IV-C2
# (protoclip.txt l.239): scikit-learn's L-BFGS logistic regression, "a maximum of 1,000 iterations following CLIP",
# for CIFAR / STL; SGD (lr 0.3, momentum 0.9, wd 1e-6, batch 256, 100 epochs, cosine) for ImageNet. The C search
# around L-BFGS is CLIP's (ProtoCLIP states none), at evaluate.linear_steps_per_decade.
PROTOCLIP = "protoclip"


@dataclass(frozen=True)
class SGDProtocol:
    """One paper's SGD linear probe on cached features: a linear layer (softmax regression) per learning rate."""
    name: str
    source: str  # the paper's words: file and line
    lrs: tuple[float, ...]  # one: the stated lr; several: a sweep, the best picked on a split of TRAIN
    momentum: float
    weight_decay: float
    epochs: int
    batch_size: int
    schedule: Literal["cosine", "step"]
    warmup_epochs: float = 0.0  # linear warm-up from 0 (cosine only)
    milestones: tuple[int, ...] = ()  # step: lr x gamma at each of these epochs
    gamma: float = 0.1
    val_fraction: float = 0.2  # share of TRAIN held out to pick the lr of a sweep (never the test split)

    def lr_factor(self, epoch: float) -> float:
        """The lr multiplier at (fractional) ``epoch`` in [0, epochs]: evaluated at every iteration, as MoCo v3's
        ``adjust_learning_rate`` (epoch + i / iters_per_epoch); a step schedule changes at whole epochs."""
        if self.schedule == "step":
            return self.gamma ** sum(1 for m in self.milestones if math.floor(epoch) >= m)
        if epoch < self.warmup_epochs:
            return epoch / self.warmup_epochs
        span = self.epochs - self.warmup_epochs
        return 0.5 * (1.0 + math.cos(math.pi * (epoch - self.warmup_epochs) / span))


PROTOCOLS: dict[str, SGDProtocol] = {
    # PCL App. E (pcl-protonce.txt l.388): "logistic regression classifier (a fully-connected layer followed by
    # softmax) ... trained using SGD with a momentum of 0.9. For ImageNet, we train for 100 epochs with an initial
    # learning rate of 10 and a weight decay of 0." PAUC states no protocol of its own ("Following previous
    # self-supervised methods", pauc-nemd.txt l.173): PCL's, a project choice.
    "pcl": SGDProtocol(
        name="pcl", source="pcl-protonce.txt l.388 (App. E)", lrs=(10.0,), momentum=0.9, weight_decay=0.0,
        epochs=100,
        # choice: batch and schedule are not in the text ("Similar hyper-parameters are used by (He et al., 2020)");
        # MoCo's linear classification and PCL's released eval_cls_imagenet.py: batch 256, lr x0.1 at 60 and 80
        batch_size=256, schedule="step", milestones=(60, 80), gamma=0.1),
    # nCLIP Sec. 4.2.1 (nclip-xclip.txt l.162): "SGD without momentum as the optimizer, no weight decay, and a total
    # epoch of 100 ... we sweep a set of different learning rates by adding multiple classification heads ... each
    # with its own optimizer and scheduler. We report the best result".
    "nclip": SGDProtocol(
        name="nclip", source="nclip-xclip.txt l.162 (Sec. 4.2.1)", momentum=0.0, weight_decay=0.0, epochs=100,
        # choice: the swept lrs and the scheduler are not stated ("following [107]", iBOT, whose heads decay by a
        # cosine): a log grid of 1-2-5 steps from 1e-3 to 10 (the features are not normalised) and a cosine decay
        lrs=(1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0), schedule="cosine",
        batch_size=1024),  # choice: not stated; MoCo v3's ([24], whose setup nCLIP follows) linear batch
    # the temperature paper App. A (clip-temperature-multi-class-tokens.txt l.810-813), MoCo v3's: "SGD without
    # momentum and no weight decay ... cosine decay with a peak learning rate equal to 1.0, combined with a warmup
    # period of 5 epochs. We train for 100 epochs" (+ image augmentation: not possible on cached features,
    # docs/paper-runs.md).
    "mocov3": SGDProtocol(
        name="mocov3", source="clip-temperature-multi-class-tokens.txt l.810-813 (App. A)", lrs=(1.0,),
        momentum=0.0, weight_decay=0.0, epochs=100, schedule="cosine", warmup_epochs=5.0,
        batch_size=1024),  # choice: not stated; MoCo v3's linear batch
}

NAMES: tuple[str, ...] = get_args(ProtocolName)  # == (PROTOCLIP, *PROTOCOLS) (tests/unit/test_linear_protocols.py)


def check_protocol(name: str, where: str = "evaluate.linear_protocol") -> None:
    """Stop on a protocol name that is none of :data:`NAMES`."""
    if name not in NAMES:
        raise ValueError(f"{where}: unknown linear protocol {name!r} (known: {', '.join(NAMES)})")


__all__ = ["NAMES", "PROTOCLIP", "PROTOCOLS", "ProtocolName", "SGDProtocol", "check_protocol"]
