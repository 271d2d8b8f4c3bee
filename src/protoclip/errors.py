"""The one base class of user errors: bad input that the user, not the code, must fix.

A config value, a data file or a model file that cannot be used raises a subclass of :class:`UserError`
whose message names the key or the file. The ``protoclip`` CLI turns any of them into one line on stderr
and exit code 2, with no traceback (``protoclip.cli.main``); every other exception is a bug and keeps its
traceback. Subclasses: :class:`ConfigError` (a config value or a configured input), and, beside the code that
reads them, ``protoclip.models.checkpoint.ModelFileError`` (a model file), ``protoclip.data.reading.ImageReadError``
(an image), ...
"""
from __future__ import annotations


class UserError(ValueError):
    """Bad input; the message names the key or the file and says what is wrong."""

    kind = "error"  # the word the CLI prints before the message ("config error", "model file error", ...)


class ConfigError(UserError):
    """A configuration problem, or a configured input that cannot be used; the message names the file and the key."""

    kind = "config error"


__all__ = ["UserError", "ConfigError"]
