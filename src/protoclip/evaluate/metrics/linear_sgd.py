"""A paper's own SGD linear probe on cached frozen features (:class:`protoclip.evaluate.protocols.SGDProtocol`:
PCL's, nCLIP's, the temperature paper's MoCo v3 protocol): softmax-regression heads trained on the un-normalised
image features, the lr of a sweep picked on a split of TRAIN, never on test (:func:`sgd_protocol_probe`).

    sgd_protocol_probe(train_x, train_y, test_x, test_y, PROTOCOLS["pcl"])   # -> {"top1": .., "lr": 10.0, ..}
"""
from __future__ import annotations

import logging
import math

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from protoclip.evaluate.metrics._inputs import ArrayLike, probe_tensors
from protoclip.evaluate.metrics.linear import split_validation
from protoclip.evaluate.protocols import SGDProtocol

log = logging.getLogger(__name__)


def build_heads(dim: int, num_classes: int, protocol: SGDProtocol, lrs: tuple[float, ...], steps_per_epoch: int,
                seed: int, device: str | torch.device = "cpu"):
    """(heads, optimizer, scheduler): one linear head per lr, one SGD with a parameter group per head at the
    protocol's momentum / weight decay, and a per-iteration ``LambdaLR`` of the protocol's schedule
    (iteration ``t`` is epoch ``t / steps_per_epoch``: :meth:`SGDProtocol.lr_factor`).

    Each head is one ``torch.nn.Linear``, initialised N(0, 0.01) with a zero bias as PCL's / MoCo's
    ``eval_cls_imagenet.py`` / ``main_lincls.py``. Several lrs (nCLIP's sweep) train in the same pass over the same
    batches, each head its own parameter group with its own lr and the same schedule ("multiple classification
    heads over a shared frozen backbone, each with its own optimizer and scheduler", nclip-xclip.txt l.162)."""
    gen = torch.Generator().manual_seed(seed)
    heads = torch.nn.ModuleList(torch.nn.Linear(dim, num_classes) for _ in lrs).to(device)
    with torch.no_grad():
        for head in heads:
            head.weight.copy_(torch.randn(head.weight.shape, generator=gen) * 0.01)
            head.bias.zero_()
    groups = [{"params": list(head.parameters()), "lr": lr} for head, lr in zip(heads, lrs)]
    opt = torch.optim.SGD(groups, lr=lrs[0], momentum=protocol.momentum, weight_decay=protocol.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: protocol.lr_factor(t / steps_per_epoch))
    return heads, opt, sched


def train_heads(x: torch.Tensor, y: torch.Tensor, num_classes: int, protocol: SGDProtocol, lrs: tuple[float, ...],
                seed: int, show_progress: bool = False) -> tuple[torch.nn.ModuleList, list[float]]:
    """Heads trained for ``protocol.epochs`` epochs on (x, y), shuffled minibatches of ``protocol.batch_size``;
    returns the heads and each head's last minibatch loss (``nan`` / ``inf``: that head diverged)."""
    steps = math.ceil(x.shape[0] / protocol.batch_size)
    heads, opt, sched = build_heads(x.shape[1], num_classes, protocol, lrs, steps, seed, x.device)
    gen = torch.Generator().manual_seed(seed)
    last = torch.full((len(lrs),), float("nan"))
    for _ in tqdm(range(protocol.epochs), desc=f"{protocol.name} linear probe", leave=False,
                  disable=not show_progress):
        perm = torch.randperm(x.shape[0], generator=gen).to(x.device)
        for s in range(0, x.shape[0], protocol.batch_size):
            b = perm[s:s + protocol.batch_size]
            per_head = [F.cross_entropy(head(x[b]), y[b]) for head in heads]
            opt.zero_grad(set_to_none=True)
            last = torch.stack(per_head)
            last.sum().backward()  # heads share no parameter: each gets its own loss's gradient
            opt.step()
            sched.step()
    return heads, last.detach().cpu().tolist()  # read once at the end: no device sync per step


@torch.no_grad()
def _hits(head: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, k: int) -> torch.Tensor:
    """[n, k] bool: is the true label the i-th highest logit."""
    return head(x).topk(k, dim=1).indices == y[:, None]


def pick_lr(x: torch.Tensor, y: torch.Tensor, num_classes: int, protocol: SGDProtocol,
            seed: int) -> tuple[float, float]:
    """(lr, validation top-1 in %) of the sweep: heads trained on the fit part of a split of TRAIN (x, y), scored
    on its held-out part; a diverged head scores nothing, ties go to the smaller lr."""
    fit_idx, val_idx = split_validation(y.cpu().numpy(), protocol.val_fraction, seed)
    fit, val = torch.from_numpy(fit_idx).to(x.device), torch.from_numpy(val_idx).to(x.device)
    heads, losses = train_heads(x[fit], y[fit], num_classes, protocol, protocol.lrs, seed)
    scores = [float(_hits(h, x[val], y[val], 1)[:, 0].double().mean()) if math.isfinite(loss) else -1.0
              for h, loss in zip(heads, losses)]
    log.info("%s lr sweep (validation split of train): %s", protocol.name,
             ", ".join(f"{lr:g}: {s:.4f}" for lr, s in zip(protocol.lrs, scores)))
    best = max(scores)
    if best < 0:
        raise FloatingPointError(f"{protocol.name} linear probe: every head of the lr sweep diverged")
    lr = min(lr for lr, s in zip(protocol.lrs, scores) if s == best)
    return lr, 100.0 * best


def sgd_protocol_probe(
    train_x: ArrayLike,
    train_y: ArrayLike,
    test_x: ArrayLike,
    test_y: ArrayLike,
    protocol: SGDProtocol,
    seed: int = 0,
    num_classes: int | None = None,
    device: str | torch.device = "cpu",
    show_progress: bool = False,
    per_example: bool = False,
) -> dict | tuple[dict, dict[str, np.ndarray]]:
    """``protocol``'s linear probe: test top-1 (and top-5 with >= 5 classes) in percent, the ``lr`` it trained at
    (``val_top1`` when swept), ``final_train_loss`` and the ``protocol`` name; ``per_example``: also each test
    image's hits ``{"top1": bool[n], "top5": bool[n]}``.

    A sweep's lr is picked on a validation split carved from the TRAIN split (``SGDProtocol.val_fraction``,
    metrics.linear.split_validation: :func:`pick_lr`), then one head is refit at that lr on all of train and
    scored once on test. nCLIP reports the best head on the evaluation set itself: picking on test is what this
    does not do (docs/paper-runs.md)."""
    xtr, ytr, xte, yte, num_classes = probe_tensors(train_x, train_y, test_x, test_y, device, num_classes)
    out: dict = {"protocol": protocol.name}
    if len(protocol.lrs) > 1:
        lr, out["val_top1"] = pick_lr(xtr, ytr, num_classes, protocol, seed)
    else:
        lr = protocol.lrs[0]
    heads, losses = train_heads(xtr, ytr, num_classes, protocol, (lr,), seed, show_progress)
    if not math.isfinite(losses[0]):
        raise FloatingPointError(f"{protocol.name} linear probe diverged at lr {lr:g} (loss is not finite)")
    hit = _hits(heads[0], xte, yte, min(5, num_classes))
    examples = {"top1": hit[:, 0].cpu().numpy()}
    if num_classes >= 5:
        examples["top5"] = hit.any(dim=1).cpu().numpy()
    out.update({k: 100.0 * float(v.mean()) for k, v in examples.items()})
    out.update(lr=float(lr), final_train_loss=losses[0], epochs=protocol.epochs)
    log.info("%s linear probe (%s): %s", protocol.name, protocol.source, out)
    return (out, examples) if per_example else out


__all__ = ["build_heads", "pick_lr", "sgd_protocol_probe", "train_heads"]
