"""nCLIP: the non-contrastive cross-modal loss of Zhou et al. (nclip-xclip.txt Eqs. 2-4, Alg. 1; methods-spec 1.2),
cross-entropy between the two heads' softmax outputs plus the per-sample and batch-mean entropy terms, with the
batch mean taken over every DDP rank. The terms written out: docs/methods.md, "protoclip.losses.nclip".
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.distributed.nn import all_reduce


def global_batch_mean(p: torch.Tensor, world_size: int = 1) -> tuple[torch.Tensor, int]:
    """(mean over the batch of every rank, differentiable (sum all-reduced with autograd); that batch's size).

    nCLIP's pbar is the mean over the *global* batch: under DDP the per-rank sums are all-reduced with gradient
    (``torch.distributed.nn.all_reduce``; spec 1.7.1), so after DDP's gradient averaging the update equals one
    process's on the whole batch.
    """
    if world_size <= 1:
        return p.mean(0), int(p.shape[0])

    total = all_reduce(p.sum(0))
    count = torch.full((1,), float(p.shape[0]), device=p.device)  # made there: a copy from the host would wait
    torch.distributed.all_reduce(count)
    return total / count, count[0]  # the count stays on the device (no host read per step)


def global_mean(p: torch.Tensor, world_size: int = 1) -> torch.Tensor:
    """Mean over the batch of every rank, differentiable (see :func:`global_batch_mean`)."""
    return global_batch_mean(p, world_size)[0]


def nclip_similarity(logp_image: torch.Tensor, logp_text: torch.Tensor) -> torch.Tensor:
    """The paper's zero-shot score -L_CE, symmetric (spec 1.7.4): s_ij = 1/2 (p_i . log q_j + q_j . log p_i),
    from log-probabilities [N, K] and [M, K] -> [N, M]."""
    p, q = logp_image.exp(), logp_text.exp()
    return 0.5 * (p @ logp_text.t() + logp_image @ q.t())


class NCLIPLoss:
    """Named terms of L_nCLIP (written out in docs/methods.md, "protoclip.losses.nclip"); ``world_size > 1``:
    pbar over every rank.

    No temperature: the heads end in BatchNorm without affine, which sets the scale (spec 1.7.3). Everything
    runs in float32 even under autocast (spec 1.7.7), log-probabilities by ``log_softmax``, pbar clamped at 1e-12
    before the log. ``kl = ce - eh`` (App. B.1) is logged::

        loss = NCLIPLoss(lambda1=0.5, lambda2=1.5)
        terms = loss(h_image, h_text)          # {"nclip", "nclip_ce", "nclip_eh", "nclip_he", "nclip_kl"}
        loss.last_stats                        # detached diagnostics of the batch (std of P, same-argmax,
                                               # nclip_pbar_batch = the global batch size pbar is averaged over)
    """

    def __init__(self, lambda1: float = 0.5, lambda2: float = 1.5, world_size: int = 1):
        self.lambda1, self.lambda2, self.world_size = float(lambda1), float(lambda2), int(world_size)
        self.last_stats: dict[str, torch.Tensor | float] = {}

    def __call__(self, h_image: torch.Tensor, h_text: torch.Tensor) -> dict[str, torch.Tensor]:
        if h_image.ndim != 2 or h_image.shape != h_text.shape:
            raise ValueError(f"nCLIP: head outputs must be [B, K] of one shape, got {tuple(h_image.shape)} "
                             f"and {tuple(h_text.shape)}")
        with torch.autocast(device_type=h_image.device.type, enabled=False):
            # float32 at least (float64 inputs stay float64: gradient checks)
            dtype = torch.float64 if h_image.dtype == torch.float64 else torch.float32
            logp_i, logp_t = F.log_softmax(h_image.to(dtype), 1), F.log_softmax(h_text.to(dtype), 1)
            p_i, p_t = logp_i.exp(), logp_t.exp()
            ce = -0.5 * ((p_i * logp_t).sum(1) + (p_t * logp_i).sum(1)).mean()
            eh = -0.5 * ((p_i * logp_i).sum(1) + (p_t * logp_t).sum(1)).mean()
            (pbar_i, n_pbar), (pbar_t, _) = global_batch_mean(p_i, self.world_size), global_batch_mean(p_t, self.world_size)
            he = -0.5 * ((pbar_i * pbar_i.clamp_min(1e-12).log()).sum() + (pbar_t * pbar_t.clamp_min(1e-12).log()).sum())
            total = ce + self.lambda1 * eh - self.lambda2 * he
        # the batch pbar averages over (spec 1.7.1 asks to log it: the paper ties batch size to the pbar estimate)
        self.last_stats = {**nclip_stats(p_i.detach(), p_t.detach()),
                           "nclip_pbar_batch": n_pbar if isinstance(n_pbar, torch.Tensor) else float(n_pbar)}
        return {"nclip": total, "nclip_ce": ce, "nclip_eh": eh, "nclip_he": he, "nclip_kl": ce - eh}


@torch.no_grad()
def nclip_stats(p_image: torch.Tensor, p_text: torch.Tensor) -> dict[str, torch.Tensor | float]:
    """App. B.1 / Table 11 diagnostics of a batch: std of the rows (over K, averaged over samples) and of the
    columns (over the batch, averaged over units) of P, per modality, and Acc_nC = % of pairs whose image and
    text distributions have the same argmax. 0-d tensors on the device (0.0 where a side has one element)."""
    out = {}
    for name, p in (("image", p_image), ("text", p_text)):
        out[f"nclip_row_std_{name}"] = p.std(1).mean() if p.shape[1] > 1 else 0.0
        out[f"nclip_col_std_{name}"] = p.std(0).mean() if p.shape[0] > 1 else 0.0
    out["nclip_acc_same_argmax"] = 100.0 * (p_image.argmax(1) == p_text.argmax(1)).float().mean().double()
    return out


__all__ = ["NCLIPLoss", "global_batch_mean", "global_mean", "nclip_similarity", "nclip_stats"]
