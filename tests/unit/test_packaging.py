"""environment.yml (conda) builds the environment of pyproject.toml (pip): Python and pip from conda-forge, then
the project's exact pins through pip, and no conda channel that cannot resolve them."""
import tomllib
import yaml

from testkit import REPO


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _environment_yml() -> dict:
    return yaml.safe_load((REPO / "environment.yml").read_text())


def test_environment_yml_pins_are_pyprojects():
    deps = _pyproject()["project"]["dependencies"]
    pip = next(d["pip"] for d in _environment_yml()["dependencies"] if isinstance(d, dict))
    # the same requirement strings, in the same order (comments aside), then the project itself
    assert [p for p in pip if not p.startswith("-e")] == deps
    assert pip[-1] == "-e ." and all("==" in p for p in pip[:-1])


def test_environment_yml_takes_only_python_and_pip_from_conda_forge():
    env = _environment_yml()
    assert env["channels"] == ["conda-forge", "nodefaults"]  # not `pytorch` (stopped at 2.5.1) nor `nvidia`
    conda = [d for d in env["dependencies"] if not isinstance(d, dict)]
    assert conda == ["python=3.11", "pip"]  # the Python the pins install on (torch's local wheels: 3.11)


def test_torch_pins_match():
    deps = _pyproject()["project"]["dependencies"]
    assert "torch==2.14.1" in deps and "torchvision==0.29.1" in deps


def test_slurm_extra_pins_a_plugin_that_does_not_split_gpu_jobs():
    # versions before 2.7.1 add --ntasks-per-gpu=1: a k-GPU run starts k times with 1 GPU each (plugin #459, #316)
    slurm = _pyproject()["project"]["optional-dependencies"]["slurm"]
    plugin = next(p for p in slurm if p.startswith("snakemake-executor-plugin-slurm=="))
    version = tuple(int(x) for x in plugin.split("==")[1].split("."))
    assert version >= (2, 7, 1)
