"""An image-only torchvision backbone in the place of an open_clip CLIP (``model: tv-resnet50``).

PCL and PAUC train torchvision's ResNet-50 "whose last fully-connected layer outputs a 128-D and L2-normalized
feature" [pcl-protonce.txt l.150; pauc-nemd.txt l.156], as MoCo's and PCL's code build it
(``torchvision.models.resnet50`` with its ``fc`` replaced); this puts it where the shared trainer and evaluation
expect a CLIP.
"""
from __future__ import annotations

import math

import torch
import torchvision
from torch import nn

from protoclip.config.architectures import TORCHVISION_MODELS

NO_TEXT_CONTEXT = 1  # width of the placeholder tokens: the tower reads none


class TorchvisionTower(nn.Module):
    """A torchvision classification network without its classifier (``.visual``) + CLIP's ``logit_scale``
    (unused by image-only methods; kept so the trainer's temperature logging reads every model alike).

    With ``fc = Identity``, z^I is the 2048-d global-average-pooled feature (the features PCL's linear protocol
    reads, pcl-protonce.txt l.388), and the replaced ``fc`` is the method's image head g^I on the
    :class:`~protoclip.models.ProtoCLIPModel` (``image_head``; PCL v1: Linear(2048, 128), v2: MoCo v2's MLP,
    :class:`~protoclip.models.model.MoCoHead`). There is no text tower: :meth:`encode_text` refuses and
    ``has_text`` is False (ProtoCLIPModel then builds no text head).

        model = build_model("tv-resnet50", head_hidden=2048, head_out=128, head="moco", image_size=224)
        model.encode_image(x)            # [B, 2048] pooled features; model.image_head(...) -> [B, 128]
    """

    has_text = False
    context_length = NO_TEXT_CONTEXT

    def __init__(self, name: str):
        super().__init__()
        if name not in TORCHVISION_MODELS:
            raise ValueError(f"unknown torchvision backbone '{name}' (known: {', '.join(TORCHVISION_MODELS)})")
        builder, self.width = TORCHVISION_MODELS[name]
        net = getattr(torchvision.models, builder)(weights=None)  # random init, nothing is fetched
        if net.fc.in_features != self.width:
            raise ValueError(f"{builder}: pooled width {net.fc.in_features}, expected {self.width}")
        net.fc = nn.Identity()  # the head replaces fc (ProtoCLIPModel.image_head)
        self.visual = net
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def encode_image(self, images: torch.Tensor, normalize: bool = False) -> torch.Tensor:
        z = self.visual(images)
        return nn.functional.normalize(z, dim=-1) if normalize else z

    def encode_text(self, tokens: torch.Tensor, normalize: bool = False) -> torch.Tensor:
        raise ValueError("an image-only torchvision backbone has no text tower: its method must not encode text")


def no_text_tokenizer(texts: str | list[str], context_length: int | None = None) -> torch.Tensor:
    """[n, 1] zero tokens for ``texts``: the placeholder a model without a text tower is given, so that the shared
    data set and the evaluation can tokenize captions they never read."""
    n = 1 if isinstance(texts, str) else len(texts)
    return torch.zeros((n, NO_TEXT_CONTEXT), dtype=torch.long)


__all__ = ["NO_TEXT_CONTEXT", "TorchvisionTower", "no_text_tokenizer"]
