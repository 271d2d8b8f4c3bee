"""Save / load a trained ProtoCLIPModel as one self-describing file (``results/runs/<run>/model.pt``).

The file is a plain dict saved with torch.save (loadable with ``weights_only=True``)::

    format: "protoclip-model/1", model_name, head_hidden, head_out, embed_dim, image_size, context_length,
    head, class_tokens, state_dict, config_json (the run's resolved config, as JSON text)

``head`` and ``class_tokens`` rebuild the architecture of every training method (nCLIP heads, multi-token
towers); the method itself (and so the evaluation similarity) is ``config["method"]``.

The config is stored as JSON text so that the file needs no pickled Python objects; Paths become strings
and tuples become lists on the way back.

    from protoclip.models import save_model, load_model
    save_model("results/runs/x/model.pt", model, {"model": "tiny-rn", ...})
    model, config = load_model("results/runs/x/model.pt")   # model is in eval mode
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from protoclip.atomic import save_torch
from protoclip.models.build import build_model
from protoclip.models.model import ProtoCLIPModel

log = logging.getLogger(__name__)

FORMAT = "protoclip-model/1"


def save_model(path: str | Path, model: ProtoCLIPModel, config: dict) -> Path:
    """Write ``model`` (weights + architecture) and ``config`` to ``path`` atomically."""
    if not isinstance(model, ProtoCLIPModel):
        raise TypeError(f"save_model expects a ProtoCLIPModel, got {type(model).__name__}")
    if not isinstance(config, dict):
        raise TypeError(f"config must be a dict, got {type(config).__name__}")
    payload = {
        "format": FORMAT,
        "model_name": model.name,
        "head_hidden": model.head_hidden,
        "head_out": model.head_out,
        "embed_dim": model.embed_dim,
        "image_size": model.image_size,
        "context_length": model.context_length,
        "head": model.head,  # "swav" | "nclip" (absent in older files: swav)
        "class_tokens": int(getattr(model, "class_tokens", 0)),  # multi-class-token towers (absent: 0)
        "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "config_json": json.dumps(config, sort_keys=True, default=str),
    }
    save_torch(path, payload)  # byte-deterministic: same weights, same sha256
    log.info("saved %s model to %s", model.name, path)
    return Path(path)


def load_model(path: str | Path, device: str | torch.device = "cpu") -> tuple[ProtoCLIPModel, dict]:
    """Rebuild the model saved by :func:`save_model`; returns ``(model in eval mode, config)``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"model file not found: {path}")
    payload = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ValueError(f"{path}: not a {FORMAT} file (format={payload.get('format') if isinstance(payload, dict) else None!r})")
    class_tokens = int(payload.get("class_tokens", 0))
    model = build_model(payload["model_name"], head_hidden=payload["head_hidden"], head_out=payload["head_out"],
                        head=payload.get("head", "swav"), class_tokens=class_tokens,
                        # model.embed_dim is m tokens x d_z for multi-token towers: rebuild from d_z
                        embed_dim=payload.get("embed_dim") // max(class_tokens, 1) if payload.get("embed_dim") else None,
                        context_length=payload.get("context_length"), image_size=payload.get("image_size"))
    model.load_state_dict(payload["state_dict"], strict=True)
    model.to(device).eval()
    return model, json.loads(payload["config_json"])
