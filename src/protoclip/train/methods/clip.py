"""``method: clip``: the instance-level InfoNCE L_CLIP (ProtoCLIP Eq. 1) on one view + caption per item.

Under DDP (``info.enabled``) L_CLIP contrasts the *global* batch: open_clip's ``ClipLoss`` all-gathers the
normalised features of every rank with gradient, so each rank computes the loss of the whole
``batch_size * world`` batch and, after DDP's gradient averaging, the update equals a single process's on that
batch (open_clip's multi-GPU recipe, which the authors' code uses).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from protoclip.losses.clip import clamp_logit_scale_, clip_loss
from protoclip.train.config import TrainConfig
from protoclip.train.distributed import DistInfo
from protoclip.train.methods.base import Method, register


@register("clip")
class CLIPMethod(Method):
    def __init__(self, cfg: TrainConfig, info: DistInfo | None = None):
        super().__init__(cfg, info)
        self._global_clip = None
        if self.info.enabled:
            from open_clip.loss import ClipLoss

            self._global_clip = ClipLoss(local_loss=False, gather_with_grad=True, rank=self.info.rank,
                                         world_size=self.info.world_size)

    def uses_clip(self) -> bool:
        return True

    def outputs(self) -> set[str]:
        return {"z_image", "z_text", "logit_scale"}

    def find_unused_parameters(self) -> bool:
        return True  # the ProtoCLIP heads and tau_Proto get no gradient

    def clip_terms(self, model: torch.nn.Module, out: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        scale = out["logit_scale"] if "logit_scale" in out else model.logit_scale.exp()
        if self._global_clip is not None:
            return {"clip": self._global_clip(F.normalize(out["z_image"].float(), dim=-1),
                                              F.normalize(out["z_text"].float(), dim=-1), scale)}
        return clip_loss(out["z_image"].float(), out["z_text"].float(), scale)

    def terms(self, model: torch.nn.Module, out: dict[str, torch.Tensor], positions: torch.Tensor,
              state: Any) -> dict[str, torch.Tensor]:
        return self.clip_terms(model, out)

    def weights(self) -> dict[str, float]:
        return {"clip": self.cfg.loss.clip_weight}

    def total(self, terms: dict[str, torch.Tensor]) -> torch.Tensor:
        weights = self.weights()
        total = None
        for name, value in terms.items():
            if name not in weights:
                continue  # diagnostics (e.g. directional halves) are logged, not optimised
            part = weights[name] * value
            total = part if total is None else total + part
        if total is None:
            raise RuntimeError(f"no optimisable loss term among {list(terms)}")
        return total

    def after_step(self, model: torch.nn.Module) -> None:
        """1/tau clipped at ``max_logit_scale`` (Table I: 100) after every optimizer step."""
        clamp_logit_scale_(model.logit_scale, self.cfg.loss.max_logit_scale)
        if getattr(model, "proto_logit_scale", None) is not None:
            clamp_logit_scale_(model.proto_logit_scale, self.cfg.loss.max_logit_scale)
