"""What the claims ledger resamples of an evaluation is decided by the task's declared kind of per-example arrays
(``Task.examples``, protoclip.tasks), never by its name: a task registered under a new name with the kind of an
existing one gets that kind's resampling units and chance level (protoclip.claims.units). The ledger's files are
named fields of ``Layout.claims_files()``."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from protoclip.claims.bootstrap import RandIndex
from protoclip.claims.units import chance_of, examples_kind, metric_units
from protoclip.files.layout import Layout
from protoclip.tasks import Task, register, unregister


@pytest.fixture
def toy_tasks():
    """Three tasks under names the ledger has never seen, one per kind of per-example arrays, and one keeping
    none."""
    made = [register(Task(f"toy_{kind or 'none'}", ("top1",), "no.such:adapter", examples=kind))
            for kind in ("hits", "ranks", "clusters", "")]
    yield {t.examples: t.name for t in made}
    for t in made:
        unregister(t.name)


def test_units_and_chance_follow_the_tasks_examples_kind(toy_tasks):
    hits = np.arange(20) % 4 == 0  # 25 %
    labels = np.arange(20) % 5
    units = metric_units(toy_tasks["hits"], "top1", {"top1": hits, "labels": labels})
    assert units.value()[0] == pytest.approx(25.0)
    assert chance_of(toy_tasks["hits"], "top1", {"labels": labels}, {}) == (pytest.approx(20.0),
                                                                          "5 classes in the test labels")
    owner = np.repeat(np.arange(10), 2)  # two captions per image
    ranks = {"image_to_text_rank": np.zeros(10, int), "text_to_image_rank": np.arange(20) % 3,
             "text_to_image": owner}
    recall = metric_units(toy_tasks["ranks"], "text_to_image_R@1", ranks)
    assert recall.value()[0] == pytest.approx(100.0 * np.mean(np.arange(20) % 3 < 1))
    assert chance_of(toy_tasks["ranks"], "image_to_text_R@5", ranks, {})[1] == "10 candidates"
    clusters = metric_units(toy_tasks["clusters"], "ari", {"cluster": labels, "labels": labels})
    assert isinstance(clusters, RandIndex)
    # a task that keeps no per-example arrays has no units, whatever arrays lie beside it
    assert examples_kind(toy_tasks[""]) == "" and metric_units(toy_tasks[""], "top1", {"top1": hits}) is None
    assert examples_kind("not_a_task") == ""


def test_claims_files_by_name(tmp_path: Path):
    files = Layout(tmp_path / "data", tmp_path / "results").claims_files()
    assert [p.name for p in files] == ["claims.md", "claims.csv", "claims.tex", "claims.html", "claims.json",
                                       "claims.png", "claims.rst"]
    assert files.json.parent == files.md.parent and files.png.parent.name == "figures"
    assert files.rst.suffix == ".rst" and files.rst not in files.artifacts() and len(files.artifacts()) == 6
