"""Save / load a trained ProtoCLIPModel as one self-describing file (``results/runs/<run>/model.pt``).

The file rebuilds the model and says how to evaluate it without the config that trained it (which may have
changed since), and loads with ``weights_only=True``; one that cannot be read back is a one-line error naming it.
"""
from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from protoclip.files.atomic import save_torch
from protoclip.errors import UserError
from protoclip.models.build import build_model
from protoclip.models.model import ProtoCLIPModel

log = logging.getLogger(__name__)

# A plain dict saved with torch.save, loadable with weights_only=True (no pickled objects: the config is JSON text):
# format, model_name, head_hidden, head_out, embed_dim, image_size, context_length, head, class_tokens (head and
# class_tokens rebuild every method's architecture), state_dict, config_json (the run's resolved config), eval_json
FORMAT = "protoclip-model/1"
REQUIRED = ("model_name", "head_hidden", "head_out", "head", "class_tokens", "state_dict", "config_json")  # load_model


class ModelFileError(UserError):
    """A model file that is not a readable ``protoclip-model/1`` file (empty, cut, foreign, weights that do not
    fit); the message names it (one line, exit 2)."""

    kind = "model file error"


@dataclass(frozen=True)
class EvalSpec:
    """How evaluation scores a model, as its training method declared it (``Method.eval_spec``); saved in the
    model file as ``eval_json``, so that evaluation reads the similarity and the image-only flag from the model
    file, never from a config that may have changed since."""

    method: str | None = None  # the training method's name (None: unknown, e.g. a model saved by a test)
    similarity: str = "cosine"  # image-text score: a name the method's module defines (protoclip.similarity)
    subspheres: int = 1  # m of the product sphere (similarity "product_sphere")
    image_only: bool = False  # the text tower is untrained: zero-shot / retrieval are not applicable

    def __post_init__(self):
        if not isinstance(self.similarity, str) or int(self.subspheres) < 1:
            raise ValueError(f"eval spec: similarity must be a name and subspheres >= 1, got {self.similarity!r}, "
                             f"{self.subspheres!r}")


def save_model(path: str | Path, model: ProtoCLIPModel, config: dict,
               eval_spec: EvalSpec | dict[str, Any] | None = None) -> Path:
    """Write ``model`` (weights + architecture), ``config`` and ``eval_spec`` (default: cosine, image and text;
    the train stage passes its method's) to ``path`` atomically."""
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
        "head": model.head,  # "swav" | "nclip"
        "class_tokens": int(getattr(model, "class_tokens", 0)),  # multi-class-token towers (0: one token)
        "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "config_json": json.dumps(config, sort_keys=True, default=str),
        "eval_json": json.dumps(asdict(_spec(eval_spec)), sort_keys=True),
    }
    save_torch(path, payload)  # byte-deterministic: same weights, same sha256
    log.info("saved %s model to %s", model.name, path)
    return Path(path)


def _spec(spec: EvalSpec | dict[str, Any] | None) -> EvalSpec:
    if spec is None or isinstance(spec, EvalSpec):
        return spec or EvalSpec()
    return EvalSpec(**spec)


def read_eval_spec(path: str | Path) -> EvalSpec:
    """The :class:`EvalSpec` of the model file ``path`` without loading its weights (memory-mapped read)."""
    path = Path(path)
    payload = _read(path, mmap=True)
    if "eval_json" not in payload:
        raise ModelFileError(f"{path}: no evaluation spec (eval_json): train the run again")
    try:
        return EvalSpec(**json.loads(payload["eval_json"]))
    except (ValueError, TypeError) as err:  # cut or foreign JSON text, unknown keys or values
        raise ModelFileError(f"{path}: its evaluation spec cannot be read ({type(err).__name__}: "
                             f"{_first_line(err)})") from None


def _read(path: Path, mmap: bool = False) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"model file not found: {path}")
    if path.stat().st_size == 0:
        raise ModelFileError(f"{path}: empty file (0 bytes): its write was cut short; train the run again")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as err:  # noqa: BLE001  torch.load raises many types for bad bytes (zip, pickle, EOF)
        raise ModelFileError(f"{path}: not a readable torch file (truncated or foreign: "
                             f"{type(err).__name__}: {_first_line(err)})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        found = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
        raise ModelFileError(f"{path}: not a {FORMAT} file (format={found!r})")
    missing = [k for k in REQUIRED if k not in payload]
    if missing:
        raise ModelFileError(f"{path}: {FORMAT} file without '{missing[0]}'")
    return payload


def load_model(path: str | Path, device: str | torch.device = "cpu") -> tuple[ProtoCLIPModel, dict]:
    """Rebuild the model saved by :func:`save_model`; returns ``(model in eval mode, config)``."""
    path = Path(path)
    payload = _read(path)
    try:
        config = json.loads(payload["config_json"])
        class_tokens = int(payload["class_tokens"])
        model = build_model(payload["model_name"], head_hidden=payload["head_hidden"],
                            head_out=payload["head_out"], head=payload["head"], class_tokens=class_tokens,
                            # model.embed_dim is m tokens x d_z for multi-token towers: rebuild from d_z
                            embed_dim=payload.get("embed_dim") // max(class_tokens, 1) if payload.get("embed_dim")
                            else None,
                            context_length=payload.get("context_length"), image_size=payload.get("image_size"))
        model.load_state_dict(payload["state_dict"], strict=True)
    except (ValueError, TypeError, RuntimeError) as err:  # architecture or weights the file describes wrongly
        raise ModelFileError(f"{path}: its architecture and weights do not fit ({type(err).__name__}: "
                             f"{_first_line(err)})") from None
    model.to(device).eval()
    return model, config


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:200] if text else "no detail"
