"""How the evaluation runs a task: :func:`adapter_of` gives the function of a task's declaration
(:class:`protoclip.tasks.Task` ``adapter``), which reads a :class:`SetInput` and returns a :class:`TaskResult`.

The adapters themselves live with their tasks, one module each under :mod:`protoclip.evaluate.tasks` (what each
reads of a set's features and which metric function of :mod:`protoclip.evaluate.metrics` it calls); the input and
result types are :mod:`protoclip.evaluate.tasks.base`'s, named here too for the stage and validation.
"""
from __future__ import annotations

import importlib
from typing import Callable

from protoclip.evaluate.tasks.base import SetInput, TaskResult, TextSide, zeroshot_classifier
from protoclip.tasks import TASKS


def adapter_of(task: str) -> Callable[[SetInput], TaskResult]:
    """The function that runs ``task``: its :class:`protoclip.tasks.Task`'s ``adapter`` (the function, or a
    "module:function" path imported here)."""
    ref = TASKS[task].adapter
    if callable(ref):
        return ref
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


__all__ = ["SetInput", "TaskResult", "TextSide", "adapter_of", "zeroshot_classifier"]
