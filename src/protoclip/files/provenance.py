"""What produced a result: git commit, package versions, device, seed (logged at the start of every stage)."""
from __future__ import annotations

import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from protoclip import __version__


def git_commit(cwd: str | Path = ".") -> str:
    """The checkout's commit SHA, with '-dirty' when tracked files differ; 'unknown' outside git."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, check=True).stdout.strip()
        return sha.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def versions(packages=("torch", "torchvision", "open_clip_torch", "faiss-cpu", "faiss-gpu-cu12", "scikit-learn",
                       "transformers", "numpy", "protoclip-repro")) -> dict[str, str]:
    """Python, platform and the versions of ``packages`` ("not installed" for absent ones: faiss is one of two
    extras, ``cpu`` or ``gpu``)."""
    out = {"python": sys.version.split()[0], "platform": platform.platform()}
    for name in packages:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def version_line() -> str:
    """``protoclip --version``: the package version, the commit of the code that runs, the libraries results depend
    on most."""
    v = versions(("torch", "open_clip_torch"))
    commit = git_commit(Path(__file__).resolve().parent)
    where = f"commit {commit}" if commit != "unknown" else "not a git checkout"
    return (f"protoclip {__version__} ({where}; python {v['python']}, torch {v['torch']}, "
            f"open_clip {v['open_clip_torch']})")


def device_info() -> dict[str, str]:
    import torch  # heavy: torch, only when the device is recorded

    if torch.cuda.is_available():
        return {"device": "cuda", "gpu": torch.cuda.get_device_name(0), "gpus": str(torch.cuda.device_count()),
                "cuda": str(torch.version.cuda)}
    return {"device": "cpu", "threads": str(torch.get_num_threads())}


def provenance(seed: int | None = None) -> dict[str, str]:
    info = {"git_commit": git_commit(), **versions(), **device_info()}
    if seed is not None:
        info["seed"] = str(seed)
    return info
