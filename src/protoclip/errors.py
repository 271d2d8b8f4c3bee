"""The one base class of user errors: bad input that the user, not the code, must fix.

A subclass of :class:`UserError` names the key or file; the CLI prints it as one line with exit code 2 and no
traceback. :class:`ConfigError` is here; the others live beside the code that reads their input
(``protoclip.models.checkpoint.ModelFileError``, ``protoclip.data.loading.reading.ImageReadError``, ...).
"""
from __future__ import annotations

import importlib
from types import ModuleType


class UserError(ValueError):
    """Bad input; the message names the key or the file and says what is wrong."""

    kind = "error"  # the word the CLI prints before the message ("config error", "model file error", ...)


class ConfigError(UserError):
    """A configuration problem, or a configured input that cannot be used; the message names the file and the key."""

    kind = "config error"


class MissingExtraError(UserError, ImportError):
    """A command needs a package of one of the project's pip extras that this environment lacks (an ImportError
    too, so code that falls back when an optional package is missing still catches it)."""

    kind = "missing package"


def import_extra(module: str, extra: str, needed_by: str, or_extra: str | None = None) -> ModuleType:
    """``import module``, or a :class:`MissingExtraError` naming the pip extra (pyproject.toml) that installs it
    (``or_extra``: another extra that does too): the heavy packages that serve one command each are extras, not
    base dependencies."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        if err.name != module.split(".")[0]:  # installed, but something it loads is broken: not a missing extra
            raise
        extras, alt = (f"'{extra}' or '{or_extra}' extra", f" (or '.[{or_extra}]')") if or_extra else (
            f"'{extra}' extra", "")
        raise MissingExtraError(f"{needed_by} needs the {extras} ({err.name} is not installed): "
                                f"pip install -e '.[{extra}]'{alt}") from None


__all__ = ["UserError", "ConfigError", "MissingExtraError", "import_extra"]
