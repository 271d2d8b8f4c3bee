"""The one base class of user errors: bad input that the user, not the code, must fix.

A subclass of :class:`UserError` names the key or file; the CLI prints it as one line with exit code 2 and no
traceback. :class:`ConfigError` is here; the others live beside the code that reads their input
(``protoclip.models.checkpoint.ModelFileError``, ``protoclip.data.reading.ImageReadError``, ...).
"""
from __future__ import annotations


class UserError(ValueError):
    """Bad input; the message names the key or the file and says what is wrong."""

    kind = "error"  # the word the CLI prints before the message ("config error", "model file error", ...)


class ConfigError(UserError):
    """A configuration problem, or a configured input that cannot be used; the message names the file and the key."""

    kind = "config error"


__all__ = ["UserError", "ConfigError"]
