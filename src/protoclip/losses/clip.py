"""Instance-level loss L_CLIP [paper Eq. 1] and the temperature clamp.

L_CLIP is the symmetric InfoNCE over a batch of image-text pairs, computed by open_clip's ``ClipLoss``; this
module fixes the project's conventions (exponentiated logit scale, normalised features, the clamp at 100).
Formula and usage: docs/methods.md, "protoclip.losses.clip".
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from open_clip.loss import ClipLoss

_CLIP_LOSS = ClipLoss()  # stateless without label caching; world_size=1


def _check_pair(z_image: torch.Tensor, z_text: torch.Tensor) -> None:
    if z_image.ndim != 2 or z_text.ndim != 2:
        raise ValueError(f"clip_loss: features must be 2-D [N, d], got {tuple(z_image.shape)} and {tuple(z_text.shape)}")
    if z_image.shape != z_text.shape:
        raise ValueError(f"clip_loss: image and text features differ in shape: {tuple(z_image.shape)} vs {tuple(z_text.shape)}")
    if z_image.shape[0] < 1:
        raise ValueError("clip_loss: empty batch")


def clip_loss(z_image: torch.Tensor, z_text: torch.Tensor, logit_scale: torch.Tensor | float) -> dict[str, torch.Tensor]:
    """L_CLIP [Eq. 1] of a batch of paired features [N, d]; ``logit_scale`` = 1/tau (exponentiated). -> {"clip"}.

    ``logit_scale`` follows open_clip's convention, ``model.logit_scale.exp()``: the learnable parameter is
    log(1/tau), initialised at log(1/0.07) [paper Table I]. z is L2-normalised here (idempotent if the caller
    already did), since Eq. 1 uses cosine similarity as in CLIP / open_clip. Single process, no feature gathering.
    """
    _check_pair(z_image, z_text)
    z_image = F.normalize(z_image, dim=-1)
    z_text = F.normalize(z_text, dim=-1)
    if not isinstance(logit_scale, torch.Tensor):
        logit_scale = torch.tensor(float(logit_scale), device=z_image.device)
    return {"clip": _CLIP_LOSS(z_image, z_text, logit_scale)}


@torch.no_grad()
def clamp_logit_scale_(param: torch.Tensor, max_scale: float = 100.0) -> torch.Tensor:
    """Clamp a log-scale parameter in place to [0, log(max_scale)] (1/tau <= 100, tau <= 1); returns it.

    "Clipped at 100" [paper Sec. IV-A2, Table I], done the way open_clip and the authors do it: after every
    optimizer step, on the *log* scale [ref-code src/training/train.py: ``logit_scale.clamp_(0, math.log(100))``].
    """
    if max_scale <= 1.0:
        raise ValueError(f"clamp_logit_scale_: max_scale must be > 1, got {max_scale}")
    param.clamp_(0.0, math.log(max_scale))
    return param


__all__ = ["clip_loss", "clamp_logit_scale_"]
