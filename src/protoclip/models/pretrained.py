"""A released open_clip checkpoint as the evaluation reads a trained run's model: towers, tokenizer, transform.

A run with a ``pretrained`` section (protoclip.train.config.PretrainedConfig) has no training job: its evaluation
loads the checkpoint here, through open_clip itself, so it is the checkpoint as released (docs/paper-runs.md,
"Released checkpoints").
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import open_clip
from open_clip.factory import _find_checkpoint_in_dir
from open_clip.pretrained import download_pretrained, get_pretrained_cfg
import torch
from torch import nn

from protoclip.config.architectures import LOCAL_DIR
from protoclip.errors import UserError
from protoclip.models.model import ProtoCLIPModel


class PretrainedError(UserError):
    """A ``pretrained`` checkpoint that cannot be loaded (a ``local-dir:`` folder missing or incomplete)."""

    kind = "pretrained checkpoint error"


def local_folder(tag: str) -> Path | None:
    """The folder of a ``local-dir:<folder>`` tag, else None."""
    return Path(tag[len(LOCAL_DIR):]) if tag.startswith(LOCAL_DIR) else None


def weights_file(folder: Path) -> Path:
    """The weights open_clip reads from ``folder`` (its own search: ``factory._find_checkpoint_in_dir``)."""
    found = _find_checkpoint_in_dir(folder)
    if not found:
        raise PretrainedError(f"{folder}: no open_clip weights file (open_clip_model.safetensors, "
                              "open_clip_pytorch_model.bin, ...)")
    return Path(found)


def source_label(model: str | None, tag: str) -> str:
    """How the run's checkpoint is named in logs and MLflow: ``RN50:yfcc15m`` or ``local-dir:<folder>``."""
    return tag if local_folder(tag) is not None else f"{model}:{tag}"


def load_pretrained(model: str | None, tag: str, device: torch.device | str = "cpu"
                    ) -> tuple[ProtoCLIPModel, Callable, Callable, Path]:
    """``(model in eval mode, tokenizer, image transform, weights file)`` of a released checkpoint.

    ``model`` + ``tag`` (``RN50`` + ``yfcc15m``): ``open_clip.create_model_and_transforms(model, pretrained=tag)``
    with the tag's own activation (OpenCLIP's YFCC RN50 / RN101 were trained with QuickGELU, which open_clip's
    ``RN50`` config does not use: the tag's ``quick_gelu`` is forced, as the ``RN50-quickgelu`` name would); the
    weights come from open_clip's download cache (fetched on first use). ``local-dir:<folder>`` (an open_clip
    folder, e.g. ``protoclip export``'s): the folder's config and weights. The transform is open_clip's for the
    checkpoint (its ``preprocess_cfg``), the tokenizer ``open_clip.get_tokenizer`` of the same name. The towers are
    wrapped in a :class:`ProtoCLIPModel` whose heads are identities (a released CLIP has no projection heads: h = z,
    so a task that reads h reads z) and whose ``logit_scale`` is the checkpoint's. The weights file's sha256 is the
    model's identity (the evaluation's ``model_sha256``: feature caches, metrics files, the MLflow run).

        model, tokenizer, transform, weights = load_pretrained("RN50", "yfcc15m", torch.device("cpu"))
    """
    folder = local_folder(tag)
    if folder is not None:
        config = folder / "open_clip_config.json"
        if not config.is_file():
            raise PretrainedError(f"pretrained.tag '{tag}': {config} not found (export the run first: "
                                  "protoclip export --run <run> --out <folder>)")
        name, weights = tag, weights_file(folder)
        model_cfg = json.loads(config.read_text("utf-8"))["model_cfg"]
        clip, _, transform = open_clip.create_model_and_transforms(name, device=device)
    else:
        released = get_pretrained_cfg(model, tag)
        name, model_cfg = model, open_clip.get_model_config(model)
        # the tag's weights, activation and preprocessing (open_clip merges the tag's mean / std / interpolation)
        clip, _, transform = open_clip.create_model_and_transforms(
            model, pretrained=tag, force_quick_gelu=bool(released.get("quick_gelu")), device=device)
        weights = Path(download_pretrained(released))  # the file it read: open_clip's cache
    size = model_cfg["vision_cfg"].get("image_size", 224)
    scale = clip.logit_scale.detach().clone()
    wrapped = ProtoCLIPModel(clip, name=name, embed_dim=int(model_cfg["embed_dim"]),
                             image_size=int(size[0] if isinstance(size, (list, tuple)) else size),
                             head_hidden=0, head_out=1)
    with torch.no_grad():  # ProtoCLIPModel sets its initial temperature: keep the checkpoint's
        wrapped.clip.logit_scale.copy_(scale)
    wrapped.image_head, wrapped.text_head = nn.Identity(), nn.Identity()
    wrapped.to(device).eval()
    return wrapped, open_clip.get_tokenizer(name), transform, weights


__all__ = ["PretrainedError", "load_pretrained", "local_folder", "source_label", "weights_file"]
