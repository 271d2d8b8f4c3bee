"""``method: clip``: the instance-level InfoNCE L_CLIP (ProtoCLIP Eq. 1) on one view + caption per item.

The distance is pluggable (``loss.distance``, :mod:`protoclip.losses.distances`): with ``class_tokens: m`` and
``distance: ps_negtrace`` this is the multi-class-token CLIP of the temperature paper (Multi(n, m)). Under DDP
L_CLIP contrasts the *global* batch (:class:`CLIPMethod`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from protoclip.registry import register
from protoclip.similarity import Similarity
from protoclip.train.config import TrainConfig
from protoclip.train.methods.base import Method

if TYPE_CHECKING:
    import torch

    from protoclip.train.distributed import DistInfo


class ProductSphere(Similarity):
    """The sum over the m tokens (chunks) of per-token cosines: the negative trace distance of the temperature
    paper (Fig. 6, PS(n, m)). Prompts are ensembled by averaging the per-prompt scores (its Sec. 5.2 averages
    logits, not embeddings: spec 2.5 / 2.7.7), i.e. the mean of the chunk-normalised text embeddings."""

    name = "product_sphere"
    dot_product = True

    @property
    def tokens(self) -> int:
        return self.subspheres

    def pre(self, z: torch.Tensor, h: torch.Tensor | None) -> torch.Tensor:
        from protoclip.losses.distances import product_sphere  # heavy: torch, config loads methods

        return product_sphere(z.float(), self.subspheres).flatten(1)

    def image(self, z: torch.Tensor, h: torch.Tensor | None) -> torch.Tensor:
        return self.pre(z, h)

    def text(self, pre: torch.Tensor) -> torch.Tensor:
        return pre


@register("clip")
class CLIPMethod(Method):
    """L_CLIP with the configured distance; the base class of ``protoclip``, ``nclip`` and ``xclip``.

    Under DDP (``info.enabled``) open_clip's ``ClipLoss`` all-gathers the normalised features of every rank with
    gradient, so each rank computes the loss of the whole global ``batch_size`` batch (B / world per rank,
    :func:`protoclip.train.schedule.per_rank_batch`) and, after DDP's gradient averaging, the update equals a
    single process's on that batch (open_clip's multi-GPU recipe, which the authors' code uses).
    """
    @classmethod
    def similarity_for(cls, cfg: TrainConfig) -> type[Similarity]:
        """A product-sphere distance (``ps_*``) is scored as the sum of per-token cosines, else by cosine."""
        return ProductSphere if cfg.loss.distance.startswith("ps_") else Similarity

    @classmethod
    def similarity_class(cls, name: str) -> type[Similarity]:
        return ProductSphere if name == ProductSphere.name else super().similarity_class(name)

    def __init__(self, cfg: TrainConfig, info: DistInfo | None = None):
        super().__init__(cfg, info)
        self._global_clip = None
        self._clip_stats: dict[str, float] = {}
        if self.info.enabled:
            from open_clip.loss import ClipLoss  # heavy: open_clip, config loads methods

            self._global_clip = ClipLoss(local_loss=False, gather_with_grad=True, rank=self.info.rank,
                                         world_size=self.info.world_size)

    def uses_clip(self) -> bool:
        return True

    def outputs(self) -> set[str]:
        return {"z_image", "z_text", "logit_scale"}

    def find_unused_parameters(self) -> bool:
        return True  # the ProtoCLIP heads and tau_Proto get no gradient

    def clip_terms(self, model: torch.nn.Module, out: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """L_CLIP with the configured distance (``loss.distance``; sphere = ProtoCLIP Eq. 1 / open_clip)."""
        import torch.nn.functional as F  # heavy: torch, config loads methods

        from protoclip.losses.clip import clip_loss  # heavy: torch, config loads methods
        from protoclip.losses.distances import contrastive_loss, temperature_stats  # heavy: torch, config loads methods

        scale = out["logit_scale"] if "logit_scale" in out else model.logit_scale.exp()
        zi, zt = out["z_image"].float(), out["z_text"].float()
        distance, m = self.cfg.loss.distance, self.cfg.subspheres()
        self._clip_stats = {"clip_scale": scale.detach(), "clip_log_scale": scale.detach().log(),
                            **temperature_stats(zi.detach(), zt.detach(), scale.detach(), distance, m)}
        if distance != "sphere":
            if self.info.enabled:  # global batch, gathered with gradient as open_clip's ClipLoss does
                from open_clip.loss import gather_features  # heavy: open_clip, config loads methods

                zi, zt = gather_features(zi, zt, local_loss=False, gather_with_grad=True, rank=self.info.rank,
                                         world_size=self.info.world_size)
            return {"clip": contrastive_loss(zi, zt, scale, distance, m)}
        if self._global_clip is not None:
            return {"clip": self._global_clip(F.normalize(zi, dim=-1), F.normalize(zt, dim=-1), scale)}
        return clip_loss(zi, zt, scale)

    def diagnostics(self) -> dict[str, torch.Tensor]:
        """Temperature-study statistics of the last batch (spec 2.5): raw and log CLIP scale, equilibrium
        mean(s_ii - E_p s_ij), in-batch retrieval accuracy (%); 0-d tensors on the device."""
        return dict(self._clip_stats)

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
        """1/tau clipped after every optimizer step: the CLIP scale at ``cfg.clip_max_logit_scale()`` (Table I:
        100 for the sphere; 3.95 for ps_negtrace, temperature paper Table 5), tau_Proto at ``max_logit_scale``."""
        from protoclip.losses.clip import clamp_logit_scale_  # heavy: torch, config loads methods

        clamp_logit_scale_(model.logit_scale, self.cfg.clip_max_logit_scale())
        if getattr(model, "proto_logit_scale", None) is not None:
            clamp_logit_scale_(model.proto_logit_scale, self.cfg.loss.max_logit_scale)
