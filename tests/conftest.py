"""Shared test fixtures. Data fixtures (owned by protoclip.data): tiny rendered PNGs with captions.

* ``make_png(path, color, shape, size)``: draw one RGB PNG (a coloured circle/square/triangle on white);
* ``tiny_pairs(tmp_path)``: 40 such PNGs with captions ("a red circle") and labels (shape), as a list
  of dicts with absolute ``path``;
* ``tiny_manifest(tmp_path)``: a ``Layout`` under tmp_path whose ``manifest.parquet`` holds those 40
  pairs (paths relative to ``layout.prepared``, as ``protoclip prepare`` writes them; ids
  ``tiny/<n>``, source ``tiny``, seeded id-hash split with 25% held out);
* ``mark_evaluated(results_dir)``: write the completion marker (``tasks.json``, protoclip.completion) of every
  evaluation folder ``results_dir/runs/*/eval/*/``, for tests that write metrics files by hand.
* ``slurm_cluster``: a real single-node SLURM cluster with 4 fake GPUs, one per test session (tests/slurm_cluster.py).
"""
from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import pytest
from PIL import Image, ImageDraw

COLORS = {"red": (220, 30, 30), "green": (30, 180, 60), "blue": (40, 60, 220), "yellow": (230, 210, 20),
          "purple": (140, 40, 160)}
SHAPES = ("circle", "square", "triangle", "cross")


def make_png(path: Path, color: str, shape: str, size: int = 32) -> Path:
    img = Image.new("RGB", (size, size), (255, 255, 255))
    d = ImageDraw.Draw(img)
    m, c = size // 6, COLORS[color]
    box = (m, m, size - m, size - m)
    if shape == "circle":
        d.ellipse(box, fill=c)
    elif shape == "square":
        d.rectangle(box, fill=c)
    elif shape == "triangle":
        d.polygon([(size // 2, m), (size - m, size - m), (m, size - m)], fill=c)
    else:
        d.rectangle((size // 2 - m // 2, m, size // 2 + m // 2, size - m), fill=c)
        d.rectangle((m, size // 2 - m // 2, size - m, size // 2 + m // 2), fill=c)
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path, format="PNG")
    return path


@pytest.fixture
def tiny_pairs(tmp_path: Path) -> list[dict]:
    out = []
    sizes = (32, 40)  # two sizes so all 40 images differ byte-wise
    n = 0
    for size in sizes:
        for color in COLORS:
            for shape in SHAPES:
                p = make_png(tmp_path / "tiny_images" / f"{n:03d}.png", color, shape, size)
                out.append({"id": f"tiny/{n:03d}", "path": str(p), "caption": f"a {color} {shape}",
                            "label": shape, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()})
                n += 1
    return out


@pytest.fixture
def tiny_manifest(tmp_path: Path, tiny_pairs: list[dict]):
    from protoclip.data.manifest import Pair, to_frame, write_manifest
    from protoclip.data.split import split_of
    from protoclip.layout import Layout

    layout = Layout(tmp_path / "data", tmp_path / "results")
    pairs = []
    for r in tiny_pairs:
        dest = layout.prepared / "images" / "tiny" / Path(r["path"]).name
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(Path(r["path"]).read_bytes())
        pairs.append(Pair(r["id"], dest.relative_to(layout.prepared).as_posix(), r["caption"], "tiny", r["label"],
                          r["sha256"], "CC0-1.0", split_of(r["id"], 0, 0.25)))
    write_manifest(to_frame(pairs), layout.manifest)
    return layout


def mark_evaluated(results_dir: Path) -> None:
    """Vouch for every metrics file (and per-example file) of every evaluation folder under ``results_dir``, as
    `evaluate` does last, then write each run's metrics.json from them, as `collect` does."""
    from protoclip import records
    from protoclip.completion import finish
    from protoclip.layout import Layout

    for folder in sorted(Path(results_dir).glob("runs/*/eval/*/")):
        files = [p for p in folder.glob("*.json") if p.name != "tasks.json"] + list(folder.glob("*.examples.npz"))
        finish(folder / "tasks.json", {"tasks": {p.stem: "ran" for p in files if p.suffix == ".json"}}, files)
    layout = Layout(Path(results_dir).parent / "data", Path(results_dir))
    for run in sorted(p.name for p in Path(results_dir).glob("runs/*/") if (p / "eval").is_dir()):
        records.write_summary(layout.metrics_summary(run), records.run_results(layout, run))


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """The SLURM test cluster (tests/slurm_cluster.py), started once and stopped at the end of the session.
    Skipped with the reason where its Debian packages are missing (``.ci/install-slurm`` installs them as root,
    run by ``make test``) or the tests do not run as root (slurmd needs it); in CI both are failures."""
    sys.path.insert(0, str(Path(__file__).parent))
    from slurm_cluster import SlurmCluster, missing_commands

    why = None
    if (missing := missing_commands()):
        why = f"SLURM test cluster not installed (missing {', '.join(missing)}): run .ci/install-slurm as root"
    elif os.geteuid() != 0:
        why = "the SLURM test cluster needs root (slurmd starts jobs as their user)"
    if why:
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    with SlurmCluster(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster
