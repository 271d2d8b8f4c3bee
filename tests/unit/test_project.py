"""The protocols that type ``cfg`` below the config assembler (protoclip.config.protocols and each package's extension)
are satisfied by the assembler's ``ProjectConfig``: every member they name exists on a loaded config, its runs
and its targets, so a renamed member fails here rather than at a stage's first use."""
from __future__ import annotations

import pytest

from protoclip.project import load_config
from protoclip.data.config import PrepareProject
from protoclip.evaluate.config import EvaluateProject
from protoclip.files.layout import HasPaths
from protoclip.config.protocols import PlacedProject, Project, RunSettings, Target
from protoclip.report.paper_targets import ReportProject
from protoclip.teacher.config import TeacherProject
from protoclip.toy.config import ToyProject
from protoclip.train.stage import TrainProject
from testkit import REPO

PROJECT_PROTOCOLS = [Project, PlacedProject, PrepareProject, EvaluateProject, ReportProject, TeacherProject,
                     ToyProject, TrainProject]


@pytest.fixture(scope="module")
def cfg():
    return load_config(REPO / "config" / "config.yaml")


@pytest.mark.parametrize("protocol", PROJECT_PROTOCOLS, ids=lambda p: p.__name__)
def test_the_project_config_has_every_member_a_protocol_names(cfg, protocol):
    assert isinstance(cfg, protocol)


def test_runs_and_targets_have_the_members_read_of_them(cfg):
    assert all(isinstance(cfg.run(name), RunSettings) for name in cfg.run_names())
    assert cfg.paper_targets() and all(isinstance(t, Target) for t in cfg.paper_targets())


def test_a_config_lacking_a_member_is_not_one():
    class PathsOnly:  # what Layout.from_config reads, and nothing else
        paths = object()

    assert isinstance(PathsOnly(), HasPaths)
    assert not any(isinstance(PathsOnly(), p) for p in PROJECT_PROTOCOLS)
