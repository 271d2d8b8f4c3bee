"""A config's ``device`` string -> a ``torch.device``, checked at the two moments it can be.

:func:`check_device_name` at config load, without torch (Snakemake parses the config on a head node that may
have no GPU): the spelling (``gpu`` -> write ``cuda``). :func:`resolve_device` when a stage starts: ``cuda:N``
without that GPU is one line (:class:`ConfigError`), not torch's traceback from the first ``.to(device)``.
"""
from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

from protoclip.errors import ConfigError

if TYPE_CHECKING:
    import torch

# auto: cuda when available, else cpu. cpu, cuda, cuda:N and mps are torch device strings; the other torch
# device types (xpu, meta, ...) are not used by this project and are refused here with the accepted list.
DEVICE_NAME = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


def check_device_name(device: str) -> None:
    """Raise ValueError unless ``device`` is one of ``auto``, ``cpu``, ``cuda``, ``cuda:N``, ``mps``."""
    if not DEVICE_NAME.fullmatch(device):
        hint = " (torch calls GPUs 'cuda')" if device.lower().startswith("gpu") else ""
        raise ValueError(f"device must be auto, cpu, cuda, cuda:N or mps, got '{device}'{hint}")


def resolve_device(device: str) -> torch.device:
    """'auto' -> cuda when available, else cpu; 'cuda[:N]' only when that GPU is visible."""
    import torch  # heavy: torch, only when a device is resolved

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda"):
        visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = torch.device(device).index or 0
        if index >= visible:
            env = os.environ.get("CUDA_VISIBLE_DEVICES")
            what = "no GPU is visible" if visible == 0 else f"only {visible} GPU(s) are visible"
            raise ConfigError(f"device '{device}': {what} to torch"
                              + (f" (CUDA_VISIBLE_DEVICES={env!r})" if env is not None else "")
                              + "; use device: auto or cpu, or run on a GPU machine")
    return torch.device(device)
