"""pyproject.toml (pip) and environment.yml (conda, GPU) name the same top-level packages."""
import re
import tomllib
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
# conda names of packages whose pip name differs, and GPU-only conda additions
CONDA_TO_PIP = {"pytorch": "torch", "faiss-gpu": "faiss-cpu"}
CONDA_ONLY = {"python", "pip", "pytorch-cuda"}


def _name(req: str) -> str:
    return re.split(r"[=<>!~\[ ;]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_environment_yml_matches_pyproject():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    pip_names = {_name(d) for d in deps}
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    conda_names = set()
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            conda_names |= {_name(d) for d in dep["pip"] if not d.startswith("-e")}
        else:
            name = _name(dep)
            if name not in CONDA_ONLY:
                conda_names.add(CONDA_TO_PIP.get(name, name))
    assert conda_names == pip_names, (sorted(conda_names - pip_names), sorted(pip_names - conda_names))


def test_torch_pins_match():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert "torch==2.14.1" in deps and "torchvision==0.29.1" in deps
    env = (REPO / "environment.yml").read_text()
    assert "pytorch=2.14.1" in env and "torchvision=0.29.1" in env
