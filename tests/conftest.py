"""Fixtures shared by every tier; helper functions live in the ``testkit`` package (tests/testkit/).

The tiers are folders, and each test gets its folder's marker: ``unit`` (functions on in-memory or tiny files),
``integration`` (a stage on a tiny project), ``e2e`` (Snakemake, DVC, SLURM, the MLflow server, kills). One tier:
``pytest tests/unit`` or ``pytest -m unit``.

* ``tiny_pairs(tmp_path)``: 40 drawn PNGs with captions ("a red circle") and labels (shape), as dicts with an
  absolute ``path``;
* ``tiny_manifest(tmp_path)``: a ``Layout`` under tmp_path whose ``manifest.parquet`` holds those 40 pairs (paths
  relative to ``layout.prepared``, ids ``tiny/<n>``, source ``tiny``, seeded id-hash split with 25 % held out);
* ``slurm_cluster``: a real single-node SLURM cluster with 4 fake GPUs, one per test session (testkit.slurm);
* ``mlflow_server``: PostgreSQL and ``mlflow server --app-name basic-auth`` on it, one per test session
  (testkit.tracking_server).

Under pytest-xdist the tests that use one of these two run in one group (``xdist_group``), so ``--dist loadgroup``
starts each service once.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from testkit import WHOLE_DAGS
from testkit.data import COLORS, SHAPES, make_png

pytest_plugins = ["testkit.evaluation"]  # its `project` fixture
TIERS = ("unit", "integration", "e2e")


# tests on 2 xdist workers (`make test`: -n 2 --dist loadgroup) share a session fixture's service within a group.
# WHOLE_DAGS: the SLURM cluster's tests and the tests that run a whole DAG (the paper miniature, locally and on the
# cluster; the offline default's) run on one worker, one after another: their projects are the largest on disk
# (3-5 GB each), and side by side they would pass the suite's 6 GB of temporary disk
GROUPS = {"slurm_cluster": WHOLE_DAGS, "mlflow_server": "tracking-server"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        tier = Path(str(item.fspath)).parent.name
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))
        for fixture, group in GROUPS.items():
            if fixture in getattr(item, "fixturenames", ()) and not item.get_closest_marker("xdist_group"):
                item.add_marker(pytest.mark.xdist_group(group))


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


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """The SLURM test cluster (testkit.slurm), started once and stopped at the end of the session.
    Skipped with the reason where its Debian packages are missing (``.ci/install-slurm`` installs them as root,
    run by ``make test``) or the tests do not run as root (slurmd needs it); in CI both are failures."""
    from testkit.slurm import SlurmCluster, missing_commands

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


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """PostgreSQL and an authenticating ``mlflow server`` on it, started once on loopback and stopped at the end of
    the session. Skipped with the reason where PostgreSQL's Debian packages or the pip extra ``tracking-server`` are
    missing (``make test`` installs both); in CI that is a failure."""
    from testkit import tracking_server

    reason = tracking_server.missing()
    if reason:
        (pytest.fail if os.environ.get("CI") else pytest.skip)(reason)
    root = tmp_path_factory.mktemp("tracking")
    with tracking_server.Postgres(root) as pg, tracking_server.MlflowServer(root / "server", pg, auth=True) as srv:
        yield srv
