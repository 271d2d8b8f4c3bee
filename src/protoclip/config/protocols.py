"""The project config as the packages below its assembler read it: typing protocols for their ``cfg`` parameter.

``protoclip.project.ProjectConfig`` imports every package that owns a config section, so they cannot import it
back (a circle); they type a whole-config ``cfg`` with :class:`Project` or a package's extension of it, and
``ProjectConfig`` implements each (docs/architecture.md, after the layer table).
"""
from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

from protoclip.claims.config import ClaimConfig, ClaimsConfig
from protoclip.files.layout import PathsConfig


@runtime_checkable
class RunSettings(Protocol):
    """What is read of one run's resolved settings (protoclip.train.config.TrainConfig)."""

    @property
    def name(self) -> str: ...
    @property
    def method(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def data(self) -> list[str]: ...
    @property
    def epochs(self) -> float: ...
    @property
    def teacher(self) -> str | None: ...
    @property
    def pretrained(self) -> Any: ...  # train.config.PretrainedConfig: model, tag, enabled (a released checkpoint)

    def n_gpus(self) -> int: ...


@runtime_checkable
class Target(Protocol):
    """A resolved paper target (protoclip.report.paper_targets.TargetConfig)."""

    @property
    def id(self) -> str: ...

    def runs(self) -> list[str]: ...


@runtime_checkable
class Project(Protocol):
    """The sections and run lookups every package may read (protoclip.project.ProjectConfig, the one
    implementation: tests/unit/test_project.py checks it has every member). Only code above the assembler
    (protoclip.dag, the CLI) uses ``ProjectConfig`` itself."""

    @property
    def source(self) -> str: ...  # the config file it was read from
    @property
    def paths(self) -> PathsConfig: ...
    @property
    def claims(self) -> ClaimsConfig: ...

    def run(self, name: str) -> RunSettings: ...
    def run_names(self) -> list[str]: ...
    def run_group(self, name: str) -> list[str]: ...
    def paper_targets(self) -> Sequence[Target]: ...
    def paper_claims(self) -> list[ClaimConfig]: ...
    def run_targets(self, run: str) -> list[str]: ...


@runtime_checkable
class Device(Protocol):
    """A section with a ``device`` (the teacher's, the evaluation's)."""

    @property
    def device(self) -> str: ...


@runtime_checkable
class PlacedProject(Project, Protocol):
    """What GPU placement reads (protoclip.jobs.launch): the devices of the teacher and of the evaluation."""

    @property
    def teacher(self) -> Device: ...
    @property
    def evaluate(self) -> Device: ...


__all__ = ["Device", "PlacedProject", "Project", "RunSettings", "Target"]
