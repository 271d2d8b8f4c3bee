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
    # the same requirement strings, in the same order (comments aside), then the project itself with its faiss: the
    # `cpu` extra, as `make run` installs it (pyproject.toml's extras are pinned; a test of its own checks them)
    assert [p for p in pip if not p.startswith("-e")] == deps
    assert pip[-1] == "-e .[cpu]" and all("==" in p for p in pip[:-1])


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


def test_pytest_is_a_test_extra_not_a_runtime_dependency():
    """A user's environment (pip or conda) does not get pytest; `make test` (so CI) installs the `test` extra."""
    deps = _pyproject()["project"]["dependencies"]
    assert not [d for d in deps if d.split("==")[0].lower() == "pytest"]
    extras = _pyproject()["project"]["optional-dependencies"]
    assert extras["test"] == ["pytest==9.2.0", "pytest-xdist==3.8.0"]
    make = (REPO / "Makefile").read_text()
    # `make test` installs the extras every test needs, with `make run`'s faiss (FAISS ?= cpu)
    assert "pip install -qq -e '.[$(FAISS),slurm,tracking-server,ucf101,prompts,test]'" in make
    assert "\nFAISS  ?= cpu\n" in make and "pip install -qq -e '.[$(FAISS)]'" in make
    assert set(extras) >= {"cpu", "gpu", "slurm", "tracking-server", "ucf101", "prompts", "test"}
    importing = [str(p) for p in (REPO / "src").rglob("*.py")
                 if any(ln.split()[:2] in (["import", "pytest"], ["from", "pytest"]) or ln.startswith("import pytest")
                        for ln in p.read_text().splitlines())]
    assert importing == []


def test_version_is_the_packages_and_names_the_commit(capsys):
    import subprocess

    import pytest

    import protoclip
    from protoclip.cli import main

    assert protoclip.__version__ == _pyproject()["project"]["version"]
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    out = capsys.readouterr().out.strip()
    assert exit_.value.code == 0 and out.startswith(f"protoclip {protoclip.__version__} (") and "\n" not in out
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    if head:  # a git checkout (CI's clone is one): the commit of the code that runs
        assert f"commit {head}" in out
    from importlib import metadata
    assert f"torch {metadata.version('torch')}," in out and f"open_clip {metadata.version('open_clip_torch')})" in out


def test_make_installs_one_faiss_and_switches_cleanly(tmp_path):
    """The Makefile's install with a stand-in venv python that logs its calls: `cpu` by default; FAISS=gpu
    uninstalls faiss-cpu before installing the `gpu` extra (never both in one environment); the same choice again
    installs nothing."""
    import os
    import subprocess

    log = tmp_path / "calls.log"
    (tmp_path / "pyproject.toml").write_text("")
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
    (bin_dir / "python").chmod(0o755)

    def make(*args: str) -> list[str]:
        log.write_text("")
        subprocess.run(["make", "-s", "-f", str(REPO / "Makefile"), *args, ".venv/.installed"], cwd=tmp_path,
                       check=True, capture_output=True, timeout=60, env={**os.environ, "MAKEFLAGS": ""})
        return [line for line in log.read_text().splitlines() if "install" in line and "--upgrade pip" not in line]

    assert make() == ["-m pip uninstall -qq -y faiss-gpu-cu12", "-m pip install -qq -e .[cpu]"]
    assert make() == []
    assert make("FAISS=gpu") == ["-m pip uninstall -qq -y faiss-cpu", "-m pip install -qq -e .[gpu]"]
    assert make("FAISS=gpu") == []
    assert make() == ["-m pip uninstall -qq -y faiss-gpu-cu12", "-m pip install -qq -e .[cpu]"]
