"""``method: nclip`` and ``method: xclip`` (Zhou et al., nclip-xclip.txt Eqs. 2-5, Alg. 1; methods-spec 1): the
non-contrastive loss :class:`protoclip.losses.nclip.NCLIPLoss` on the nCLIP heads of both modalities, and xCLIP =
``nclip.clip_weight`` (0.2) * L_CLIP + ``nclip.weight`` (1.0) * L_nCLIP on shared encoders.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from protoclip.registry import register
from protoclip.similarity import Similarity
from protoclip.train.config import TrainConfig
from protoclip.train.methods.clip import CLIPMethod

if TYPE_CHECKING:
    import torch

    from protoclip.train.distributed import DistInfo


@dataclass
class NCLIPConfig:
    """The ``train.nclip`` section, registered by nCLIP and xCLIP (nclip-xclip.txt Eqs. 2-5, Table 14)."""
    lambda1: float = 0.5  # per-sample entropy weight, minimised (paper)
    lambda2: float = 1.5  # batch-mean entropy weight, maximised (paper: lambda1 = lambda2 - 1)
    weight: float = 1.0  # lambda_nCLIP of xCLIP (Eq. 5)
    clip_weight: float = 0.2  # lambda_CLIP of xCLIP (Eq. 5); nCLIP alone has no CLIP term

    def validate(self) -> None:
        """Run when the config loads, for every run (the message gets the prefix ``train.nclip.``)."""
        if min(self.lambda1, self.lambda2, self.weight, self.clip_weight) < 0:
            raise ValueError("lambda1, lambda2, weight and clip_weight must be >= 0")


def in_batch_accuracy(sim: torch.Tensor) -> torch.Tensor:
    """% of rows and columns of a square similarity matrix whose maximum is on the diagonal (mean of both);
    a float64 0-d tensor on the device."""
    import torch  # heavy: torch, config loads methods

    with torch.no_grad():
        target = torch.arange(sim.shape[0], device=sim.device)
        return 50.0 * ((sim.argmax(1) == target).float().mean() + (sim.argmax(0) == target).float().mean()).double()


class NCLIPCrossEntropy(Similarity):
    """nCLIP's score s = 1/2 (p_I . log p_T + p_T . log p_I), p the softmax of the nCLIP head (the paper's -L_CE;
    spec 1.7.4); prompts ensembled by averaging the probability vectors (spec 1.7.4). Carried as
    log-probabilities, never log(softmax): softmax underflows in float32 once head logits are sharp (spec 1.7.7).
    No distance: the temperature study does not apply."""

    name = "nclip_ce"
    dot_product = True
    distance = False

    def pre(self, z: torch.Tensor, h: torch.Tensor | None) -> torch.Tensor:
        import torch  # heavy: torch, config loads methods

        return torch.log_softmax(h.float(), dim=1)

    def ensemble(self, pre: torch.Tensor) -> torch.Tensor:
        """The log of the mean probability vector, logsumexp_k(log p_k) - log n (exact where p underflows)."""
        import numpy as np  # heavy: numpy, config loads methods
        import torch  # heavy: torch, config loads methods

        return torch.logsumexp(pre, 0, keepdim=True) - float(np.log(pre.shape[0]))

    def image(self, z: torch.Tensor, h: torch.Tensor | None) -> torch.Tensor:
        import torch  # heavy: torch, config loads methods

        logp = self.pre(z, h)
        return 0.5 * torch.cat([logp.exp(), logp], 1)

    def text(self, pre: torch.Tensor) -> torch.Tensor:
        import torch  # heavy: torch, config loads methods

        return torch.cat([pre, pre.exp()], 1)

    def zeroshot_extra(self, image_s, classes_s, labels, classify) -> dict[str, Any]:
        """The image-as-target score p_I . log p_T (the paper's L_CE with the image distribution as the target;
        spec 1.7.4 asks to log it beside the symmetric score): the first halves of the two embeddings."""
        k = image_s.shape[1] // 2
        return {"image_as_target": classify(2.0 * image_s[:, :k], classes_s[:, :k], labels, normalize=False)}


@register("nclip", sections={"nclip": NCLIPConfig})
class NCLIPMethod(CLIPMethod):
    """nCLIP: the model's second head is the nCLIP head (:class:`protoclip.models.model.NCLIPHead`, head_hidden
    -> head_out = K units, BN without affine) on each modality; the loss is symmetric CE with no stop-gradient
    + lambda1 * per-sample entropy - lambda2 * entropy of the global batch mean (docs/methods.md,
    "protoclip.losses.nclip").

    The nCLIP head reads z (the backbone feature times open_clip's projection), not the raw backbone feature of
    Alg. 1: the head's first Linear follows, so this is the same function class with the first layer factored
    through embed_dim (a choice for sharing open_clip's towers unchanged; spec 1.3 lists no such detail).

    Diagnostics per step (App. B.1, Table 11): nclip_kl / _eh / _he (terms), row / column std of P per modality,
    Acc_nC = % same argmax across modalities, and the in-batch retrieval accuracy (Acc_C, ``clip_acc``): by the
    CE similarity of the nCLIP distributions here, by cosine of z for xCLIP.
    """

    head = "nclip"
    similarity = NCLIPCrossEntropy

    def __init__(self, cfg: TrainConfig, info: DistInfo | None = None):
        from protoclip.losses.nclip import NCLIPLoss  # heavy: torch, config loads methods

        super().__init__(cfg, info)
        self._nclip = NCLIPLoss(cfg.nclip.lambda1, cfg.nclip.lambda2, world_size=self.info.world_size)
        self._acc: dict[str, torch.Tensor] = {}

    @classmethod
    def similarity_for(cls, cfg: TrainConfig) -> type[Similarity]:
        return cls.similarity

    @classmethod
    def similarity_class(cls, name: str) -> type[Similarity]:
        return NCLIPCrossEntropy if name == NCLIPCrossEntropy.name else super().similarity_class(name)

    def outputs(self) -> set[str]:
        return {"h_image", "h_text"}

    def find_unused_parameters(self) -> bool:
        return True  # tau_CLIP, tau_Proto

    def nclip_terms(self, out: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return self._nclip(out["h_image"], out["h_text"])

    def terms(self, model: torch.nn.Module, out: dict[str, torch.Tensor], positions: torch.Tensor,
              state: Any) -> dict[str, torch.Tensor]:
        import torch  # heavy: torch, config loads methods
        import torch.nn.functional as F  # heavy: torch, config loads methods

        from protoclip.losses.nclip import nclip_similarity  # heavy: torch, config loads methods

        terms = self.nclip_terms(out)
        with torch.no_grad():
            hi, ht = out["h_image"].detach().float(), out["h_text"].detach().float()
            self._acc = {"clip_acc": in_batch_accuracy(nclip_similarity(F.log_softmax(hi, 1), F.log_softmax(ht, 1)))}
        return terms

    def weights(self) -> dict[str, float]:
        return {"nclip": 1.0}

    def diagnostics(self) -> dict[str, torch.Tensor | float]:
        return {**self._nclip.last_stats, **self._acc}


@register("xclip", sections={"nclip": NCLIPConfig})
class XCLIPMethod(NCLIPMethod):
    """xCLIP = ``nclip.clip_weight`` * L_CLIP + ``nclip.weight`` * L_nCLIP on shared encoders (Eq. 5). Its "CLIP
    head" (a linear map of the backbone feature to 512-d, no bias) is open_clip's own projection, i.e. z."""

    similarity = Similarity  # zero-shot by cosine in the CLIP-head space (paper Sec. 4.1)

    def outputs(self) -> set[str]:
        return {"z_image", "z_text", "logit_scale", "h_image", "h_text"}

    def find_unused_parameters(self) -> bool:
        return True  # tau_Proto

    def terms(self, model: torch.nn.Module, out: dict[str, torch.Tensor], positions: torch.Tensor,
              state: Any) -> dict[str, torch.Tensor]:
        terms = self.clip_terms(model, out)
        terms.update(self.nclip_terms(out))
        self._acc = {"clip_acc": 0.5 * (self._clip_stats["clip_acc_i2t"] + self._clip_stats["clip_acc_t2i"])}
        return terms

    def weights(self) -> dict[str, float]:
        return {"clip": self.cfg.nclip.clip_weight, "nclip": self.cfg.nclip.weight}

    def diagnostics(self) -> dict[str, torch.Tensor | float]:
        return {**self._clip_stats, **self._nclip.last_stats, **self._acc}
