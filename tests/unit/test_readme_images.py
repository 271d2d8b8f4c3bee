"""The README renders wherever the repository is browsed: every image it shows is a file in git (not under DVC's
results/), small; `make docs-figure` writes the README's figure from `make run`'s; and what the README says `make run`
runs is the Makefile's command, flag for flag."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from testkit import REPO

README = (REPO / "README.md").read_text()
MAX_IMAGE_BYTES = 150_000


def readme_images(text: str) -> list[str]:
    """Paths of the markdown images ``![alt](path)`` and HTML ``<img src="path">`` of one page."""
    return re.findall(r"!\[[^\]]*\]\(([^)\s]+)", text) + re.findall(r"<img [^>]*src=\"([^\"]+)\"", text)


def test_the_image_finder_finds_both_forms():
    assert readme_images('a ![x](docs/a.png) b <img alt="y" src="docs/b.png"> [link](c.md)') == [
        "docs/a.png", "docs/b.png"]


def test_every_readme_image_is_in_git_and_small():
    images = readme_images(README)
    assert images, "README.md shows no image"
    tracked = subprocess.run(["git", "ls-files", "--", *images], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
    if not tracked and not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    assert sorted(tracked) == sorted(images), f"README images not in git: {set(images) - set(tracked)}"
    for path in images:
        assert not path.startswith(("results/", "/", "http")), path
        assert (REPO / path).stat().st_size < MAX_IMAGE_BYTES, path
        with Image.open(REPO / path) as im:
            im.verify()  # a real image, not an LFS / DVC pointer


def _make_vars() -> dict[str, str]:
    make = (REPO / "Makefile").read_text()
    return {m[0]: m[1].strip() for m in re.findall(r"^(\w+)\s*\?=\s*(.*)$", make, flags=re.M)}


def test_readme_says_what_make_run_runs():
    """The Makefile's `run` recipe with its defaults filled in, as the README writes it, and each flag explained."""
    make = (REPO / "Makefile").read_text()
    recipe = re.search(r"^run: .*\n\t(.*)$", make, flags=re.M).group(1)
    values = _make_vars()
    command = re.sub(r"\$\((\w+)\)", lambda m: values.get(m.group(1), m.group(0)), recipe.split("$$PATH ", 1)[1])
    command = " ".join(command.split())
    assert command.startswith("protoclip forkserver -- snakemake --cores all"), command
    prose = " ".join(README.split())
    assert f"`{command}`" in prose, f"README.md does not show make run's command: {command}"
    said = prose.split("what `make run` adds:", 1)[1][:900]
    for flag in re.findall(r"--[a-z-]+(?: (?!--)\S+)?", command.split("snakemake ", 1)[1]):
        if not flag.startswith("--cores"):
            assert f"`{flag}`" in said, f"README.md does not say what {flag} adds"
    assert "fork server" in said


def test_docs_figure_writes_the_readmes_image_from_make_runs(tmp_path):
    """`make docs-figure` on a made-up results/figures/fig_8.png: the README's path, at most 1280 px wide, the
    aspect kept (the target runs in a scratch folder: the repository's image is not touched)."""
    image = next(p for p in readme_images(README) if p.endswith("fig_8.png"))
    (tmp_path / "results" / "figures").mkdir(parents=True)
    (tmp_path / "docs" / "img").mkdir(parents=True)
    Image.new("RGB", (2000, 900), (200, 30, 30)).save(tmp_path / "results" / "figures" / "fig_8.png")
    bin_dir = Path(sys.executable).parent
    subprocess.run(["make", "-s", "-f", str(REPO / "Makefile"), f"BIN={bin_dir}", "docs-figure"], cwd=tmp_path,
                   check=True, capture_output=True, timeout=120)
    with Image.open(tmp_path / image) as out:
        assert out.size == (1280, 576)
        assert out.getpixel((10, 10))[:3] == (200, 30, 30)
