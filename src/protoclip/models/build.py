"""Build ProtoCLIP models and tokenizers by open_clip model name; never downloads weights.

Any open_clip architecture works by name (the paper's RN50 and RN101, ViT-B-32, ...), plus the CPU-sized configs
shipped in ``protoclip/models/configs/`` and ``tv-resnet50`` (torchvision's ResNet-50 alone, PCL / PAUC's encoder).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

import open_clip
import torch

from protoclip.config.architectures import TORCHVISION_MODELS, check_torchvision, image_step, is_torchvision
from protoclip.models.model import ProtoCLIPModel
from protoclip.models.multitoken import make_multitoken
from protoclip.models.torchvision_image import TorchvisionTower, no_text_tokenizer

log = logging.getLogger(__name__)

# registered with open_clip on import: ``tiny-rn`` (CLIP's ModifiedResNet, layers [1,1,1,1], width 32) and
# ``tiny-vit`` (patch 8, width 128, 4 layers), both 64 px, embed_dim 128, with a narrow CLIP text transformer
# (width 128, 4 layers, context 32, open_clip's BPE vocab)
CONFIG_DIR = Path(__file__).resolve().parent / "configs"
open_clip.add_model_config(CONFIG_DIR)


def model_config(name: str) -> dict:
    """The open_clip architecture config (embed_dim, vision_cfg, text_cfg) of ``name``."""
    if is_torchvision(name):
        raise ValueError(f"model '{name}' is a torchvision image backbone, not an open_clip architecture")
    cfg = open_clip.get_model_config(name)
    if cfg is None:
        known = ", ".join(m for m in open_clip.list_models() if m.startswith(("tiny", "RN", "ViT-B")))
        raise ValueError(f"unknown model '{name}' (open_clip configs include: {known}, ...)")
    return cfg


def _image_size(cfg: dict) -> int:
    size = cfg["vision_cfg"].get("image_size", 224)
    if isinstance(size, (list, tuple)):
        if len(set(size)) != 1:
            raise ValueError(f"non-square image_size {size} is not supported")
        size = size[0]
    return int(size)


def architecture_overrides(cfg: dict, embed_dim: int | None, context_length: int | None,
                           image_size: int | None = None) -> dict:
    """open_clip ``create_model`` keyword overrides for a changed d_z, text context length and/or input size.

    open_clip merges these keys *shallowly* into the model config, so a new context length (image size) is
    passed as a whole ``text_cfg`` (``vision_cfg``) with only that key changed. Why they exist: ProtoCLIP
    Table I / Sec. IV-C2 give RN101 a 1024-d z^I where open_clip's RN101 config has 512, Sec. IV-A1 sets the
    text "max sequence length" to 76 where open_clip (and OpenAI CLIP) use 77, and the offline default trains
    the tiny configs at 32 px on 2 CPU cores (docs/speed.md).
    """
    out: dict = {}
    if embed_dim is not None and embed_dim != cfg["embed_dim"]:
        if embed_dim < 1:
            raise ValueError(f"embed_dim must be >= 1, got {embed_dim}")
        out["embed_dim"] = int(embed_dim)
    if context_length is not None and context_length != cfg["text_cfg"].get("context_length", 77):
        if context_length < 2:
            raise ValueError(f"context_length must be >= 2 (start and end tokens), got {context_length}")
        out["text_cfg"] = {**cfg["text_cfg"], "context_length": int(context_length)}
    if image_size is not None and image_size != _image_size(cfg):
        vision = cfg["vision_cfg"]
        step = image_step(vision)  # the rule the config loader checks (whole ViT patches, else 32)
        if image_size < step or image_size % step:
            raise ValueError(f"image_size must be a positive multiple of {step} for this architecture, got {image_size}")
        out["vision_cfg"] = {**vision, "image_size": int(image_size)}
    return out


def build_model(
    name: str,
    head_hidden: int = 2048,
    head_out: int = 128,
    init_temperature: float = 0.07,
    device: str | torch.device = "cpu",
    head: str = "swav",
    class_tokens: int = 0,
    embed_dim: int | None = None,
    context_length: int | None = None,
    image_size: int | None = None,
) -> ProtoCLIPModel:
    """A randomly initialised :class:`ProtoCLIPModel` of open_clip architecture ``name`` (fp32).

    ``head``: ``swav`` (ProtoCLIP) or ``nclip`` (nCLIP/xCLIP heads). ``class_tokens`` m >= 1: multi-class-token
    towers (:mod:`protoclip.models.multitoken`; ViT configs only), z = m tokens x embed_dim; 0 = open_clip's.
    ``embed_dim`` (d_z per token), ``context_length`` and ``image_size`` override open_clip's config when given (see
    :func:`architecture_overrides`); the tokenizer must then be built with the same context length
    (:func:`get_tokenizer` with ``context_length=model.context_length``). A :data:`TORCHVISION_MODELS` name builds
    an image-only torchvision tower (:func:`build_torchvision_model`).

    Activation: open_clip's configs use nn.GELU; OpenAI's RN50 (and the official ProtoCLIP code, which forced it)
    use QuickGELU. Training from scratch either works; pass e.g. ``RN50-quickgelu`` to get QuickGELU.

        model = build_model("tiny-vit", class_tokens=4, head="nclip")   # multi-token towers / nCLIP heads
    """
    if is_torchvision(name):
        return build_torchvision_model(name, head_hidden, head_out, init_temperature, device, head, class_tokens,
                                       embed_dim, context_length, image_size)
    cfg = model_config(name)
    overrides = architecture_overrides(cfg, embed_dim, context_length, image_size)
    # pretrained=None and pretrained_image/text False: random init, nothing is fetched
    clip = open_clip.create_model(name, pretrained=None, pretrained_image=False, pretrained_text=False, device=device,
                                  force_custom_text=class_tokens > 0, **overrides)
    embed_dim = overrides.get("embed_dim", cfg["embed_dim"])
    if class_tokens > 0:
        clip = make_multitoken(clip, class_tokens).to(device)
        embed_dim *= class_tokens
    model = ProtoCLIPModel(
        clip, name=name, embed_dim=embed_dim, image_size=_image_size({**cfg, **overrides}),
        head_hidden=head_hidden, head_out=head_out, init_temperature=init_temperature, head=head,
    )
    model.class_tokens = int(class_tokens)
    log.info("built %s: %.1fM parameters", name, sum(p.numel() for p in model.parameters()) / 1e6)
    return model.to(device)


def build_torchvision_model(name: str, head_hidden: int, head_out: int, init_temperature: float,
                            device: str | torch.device, head: str, class_tokens: int, embed_dim: int | None,
                            context_length: int | None, image_size: int | None) -> ProtoCLIPModel:
    """The image-only torchvision backbone ``name`` + image head ``head`` (:mod:`protoclip.models.torchvision_image`).
    224 px by default (the papers' input); ``embed_dim`` may only restate the pooled width, ``context_length`` the
    placeholder's (a model file records both)."""
    width = TORCHVISION_MODELS[name][1]
    check_torchvision(name, embed_dim=embed_dim, class_tokens=class_tokens, image_size=image_size,
                      context_length=None if context_length == TorchvisionTower.context_length else context_length)
    model = ProtoCLIPModel(TorchvisionTower(name), name=name, embed_dim=width, image_size=image_size or 224,
                           head_hidden=head_hidden, head_out=head_out, init_temperature=init_temperature, head=head)
    model.class_tokens = 0
    log.info("built %s (torchvision, image only): %.1fM parameters", name,
             sum(p.numel() for p in model.parameters()) / 1e6)
    return model.to(device)


def get_tokenizer(name: str, context_length: int | None = None) -> Callable[..., torch.Tensor]:
    """open_clip's tokenizer for ``name`` (BPE for CLIP text towers); the context length is the model
    config's unless given (pass ``model.context_length`` for a model built with an override). A torchvision
    backbone has no text tower: its placeholder (:func:`~protoclip.models.torchvision_image.no_text_tokenizer`)."""
    if is_torchvision(name):
        return no_text_tokenizer
    cfg = model_config(name)
    if context_length is None:
        context_length = int(cfg["text_cfg"].get("context_length", 77))
    return open_clip.get_tokenizer(name, context_length=int(context_length))
