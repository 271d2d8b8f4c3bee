"""The training methods' registry: method name -> class, and the config sections the methods bring.

A method is a ``Method`` subclass in a module of :mod:`protoclip.train.methods`, decorated with :func:`register`;
the package's modules are imported the first time the registry is asked, so adding a method edits no other file
(docs/architecture.md, "Adding a method: one file"). It imports nothing of the project, so the config loader reads
the sections without importing a method module.
"""
from __future__ import annotations

import importlib
import pkgutil
from typing import Callable

METHODS: dict[str, type] = {}  # method name -> its Method subclass
SECTIONS: dict[str, type] = {}  # train.<key> -> the dataclass of a section a method registered
METHODS_PACKAGE = "protoclip.train.methods"  # every module of it is a method module (or its base)
_loaded = False


def register(name: str, sections: dict[str, type] | None = None) -> Callable[[type], type]:
    """Class decorator: ``METHODS[name] = cls`` (``cls.name = name``) and the method's config ``sections``.

    A section is built strictly like the rest of the config; several methods may share one with the same class
    (nCLIP and xCLIP read ``nclip``)::

        @dataclass
        class MyConfig:
            weight: float = 1.0  # comment each default

            def validate(self) -> None:  # run when the config loads; the message is prefixed with `train.my.`
                if self.weight < 0:
                    raise ValueError("weight must be >= 0")

        @register("mymethod", sections={"my": MyConfig})
        class MyMethod(Method): ...   # every run's config then has train.my (cfg.my.weight)
    """
    sections = dict(sections or {})
    for key, section in sections.items():
        if SECTIONS.get(key, section) is not section:
            raise ValueError(f"config section train.{key} registered twice with different classes "
                             f"({SECTIONS[key].__qualname__}, {section.__qualname__})")

    def deco(cls: type) -> type:
        if name in METHODS:
            raise ValueError(f"training method {name!r} registered twice")
        cls.name = name
        cls.sections = sections
        METHODS[name] = cls
        SECTIONS.update(sections)
        return cls

    return deco


def load_methods() -> None:
    """Import every module of the methods package once (each registers its methods as it is imported).

    The modules are found, not listed, so that a method is one file. They import torch only inside their
    training hooks: the config loader comes here, and importing torch and open_clip would cost every config
    load (Snakemake's parse, each `collect` / `report` job) several seconds on a small machine."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    package = importlib.import_module(METHODS_PACKAGE)
    for info in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{METHODS_PACKAGE}.{info.name}")


def method_class(name: str) -> type:
    """The class registered as ``name``; ValueError naming the known methods otherwise."""
    load_methods()
    if name not in METHODS:
        raise ValueError(f"unknown training method {name!r} (known: {', '.join(sorted(METHODS))})")
    return METHODS[name]


def method_sections() -> dict[str, type]:
    """{key: dataclass} of every config section a registered method brings (``train.<key>``)."""
    load_methods()
    return dict(SECTIONS)


__all__ = ["METHODS", "SECTIONS", "register", "load_methods", "method_class", "method_sections"]
