"""Helpers shared by the tests (on pytest's ``pythonpath``: ``from testkit.training import tiny_project``).

* :mod:`testkit.data`: drawn PNGs, SVG metadata, random webdataset shards;
* :mod:`testkit.training`: tiny configs, models and projects for the trainer and the train stage;
* :mod:`testkit.teachers`: a hashing stand-in teacher;
* :mod:`testkit.evaluation`: a tiny evaluation project and a recording tracker;
* :mod:`testkit.reports`: synthetic results for every run of a shipped config;
* :mod:`testkit.corpus`: the drawn-shapes corpus of the end-to-end pipeline tests;
* :mod:`testkit.processes`: subprocess environments, Snakemake runs, waiting on processes;
* :mod:`testkit.tmpdirs`: a module fixture's folder, removed after the module when its tests passed;
* :mod:`testkit.slurm`, :mod:`testkit.tracking_server`: the real SLURM cluster and MLflow server the tests start.
"""
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"  # the papers, docs and reference files beside the checkout
