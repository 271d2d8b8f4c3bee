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

Under pytest-xdist (``--dist loadgroup``) the tests that use one of these two run on one worker (``GROUPS`` below),
so each service starts once.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from testkit.data import COLORS, SHAPES, make_png

pytest_plugins = ["testkit.evaluation"]  # its `project` fixture
TIERS = ("unit", "integration", "e2e")


# Tests on xdist workers (`make test`: --dist loadgroup) that share a session fixture's service, or a file, share a
# worker, by file: the SLURM cluster's (the paper miniature's second test runs on it), the tracking server's, and
# the repository's resolved Snakemake config.
# Scheduled by file here because pytest-xdist 3.8.0's own loadgroup marks a test through a node id field pytest
# 9.2 no longer reads (xdist_group markers then group nothing); a test file that uses one of these fixtures must
# be listed.
GROUPS = {
    "slurm": ("tests/e2e/test_slurm_cluster.py", "tests/e2e/test_paper_miniature.py"),
    "tracking-server": ("tests/e2e/test_tracking_server.py",),
    # Snakemake on the repository itself: each run with --config or two config files rewrites the one resolved
    # config (.snakemake/protoclip/config.yaml) that the test then reads
    "repo-snakemake": ("tests/e2e/test_workflow.py",),
    # one module-scoped DAG read by both tests of the file
    "related-miniature": ("tests/e2e/test_paper_related_miniature.py",),
}
GROUP_OF_FIXTURE = {"slurm_cluster": "slurm", "mlflow_server": "tracking-server"}
# Started first, on different workers (longest first: the suite ends when its longest worker does): the SLURM
# group (~13 min with the paper miniature), the offline default's DAG (~8 min under the fork server) and the related
# papers' miniature.
LONGEST = ("slurm", "tests/e2e/test_pipeline_ci.py", "related-miniature")


def group_of(nodeid: str) -> str | None:
    path = nodeid.split("::")[0]
    return next((g for g, files in GROUPS.items() if path in files), None)


def pytest_xdist_make_scheduler(config, log):
    """With ``--dist loadgroup``: each group's files one scope (one worker, in order), every other test its own,
    handed out in collection order (``LONGEST`` first, see below) rather than xdist's largest-scope-first."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid) or nodeid

    return ByGroup(config, log)


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        key = group_of(item.nodeid) or item.nodeid.split("::")[0]
        return LONGEST.index(key) if key in LONGEST else len(LONGEST)

    items.sort(key=rank)  # stable: the order within a file stays
    for item in items:
        tier = Path(str(item.fspath)).parent.name
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))
        for fixture, group in GROUP_OF_FIXTURE.items():
            if fixture in getattr(item, "fixturenames", ()) and group_of(item.nodeid) != group:
                raise pytest.UsageError(f"{item.nodeid} uses {fixture}: list its file in tests/conftest.py's "
                                        f"GROUPS[{group!r}]")


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
    from protoclip.data.loading.manifest import Pair, to_frame, write_manifest
    from protoclip.data.corpus.split import split_of
    from protoclip.files.layout import Layout

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
