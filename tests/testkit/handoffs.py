"""Which config members a stage entry reads and which of its parts receive the whole config (issue 61's stage
shape: an entry narrows the project config and hands each part only its own section)::

    watched = WatchedConfig(cfg)
    handed = spy_handoffs(monkeypatch, stage, ["build_validator", "train"], watched)
    run_train(watched, "clip")
    assert watched.read <= protocol_members(stage.TrainProject) and handed == []
"""
from __future__ import annotations

from protoclip.project import ProjectConfig


class WatchedConfig:
    """``cfg`` as its readers see it, noting in ``read`` the name of each member read."""

    def __init__(self, cfg):
        self.__dict__.update(_cfg=cfg, read=set())

    def __getattr__(self, name):
        self.read.add(name)
        return getattr(self._cfg, name)


def protocol_members(protocol: type) -> set[str]:
    """The public members a config protocol (e.g. train.stage.TrainProject) names, its bases' too."""
    return {name for cls in protocol.__mro__ for name in vars(cls) if not name.startswith("_")}


def spy_handoffs(monkeypatch, module, names: list[str], watched: WatchedConfig) -> list[str]:
    """Wrap each function ``names`` of ``module``: the list returned gets a function's name each time it is called
    with the project config (``watched`` or a ProjectConfig) among its arguments."""
    handed: list[str] = []
    for name in names:
        def spy(*args, _real=getattr(module, name), _name=name, **kwargs):
            if any(a is watched or isinstance(a, ProjectConfig) for a in (*args, *kwargs.values())):
                handed.append(_name)
            return _real(*args, **kwargs)
        monkeypatch.setattr(module, name, spy)
    return handed
