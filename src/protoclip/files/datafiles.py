"""Reading the Parquet and NPZ files one stage writes for another: an empty, cut or foreign file stops the reader
with one line naming the file and the stage that rebuilds it (exit 2), not pyarrow's or numpy's traceback.

    with reading(layout.manifest, "manifest", PREPARE):
        table = pq.read_table(layout.manifest)
"""
from __future__ import annotations

import contextlib
import zipfile
import zlib
from pathlib import Path
from typing import Iterator

from protoclip.errors import ConfigError, UserError

# what the stages that write the files are called on the command line (the fix the message names)
PREPARE = "`protoclip prepare`"
TEACHER = "`protoclip teacher`"
EVALUATE = "`protoclip evaluate`"

# what pyarrow (ArrowInvalid is a ValueError, ArrowIOError an OSError) and numpy's npz reader (BadZipFile,
# ValueError for a bad header, EOFError / OSError for a cut member, zlib.error for a damaged deflate stream,
# KeyError for a missing member) raise for a file that is not what its writer wrote
READ_ERRORS = (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error)


class DataFileError(ConfigError):
    """A file one stage wrote and another reads is unreadable; the message names it and the stage that writes it (a
    ConfigError, as the other configured inputs that cannot be used)."""

    kind = "data file error"


def first_line(err: BaseException, limit: int = 200) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:limit] if text else ""


def unreadable(path: str | Path, what: str, writer: str, err: BaseException) -> DataFileError:
    """The one-line error for ``path`` (a ``what``, written by ``writer``) that failed with ``err``."""
    size = Path(path).stat().st_size if Path(path).is_file() else None
    state = " (0 bytes)" if size == 0 else ""
    return DataFileError(f"{path}{state}: not a readable {what}, empty, cut short or foreign "
                         f"({type(err).__name__}: {first_line(err)}); it is written by {writer}: rerun it "
                         "(or restore the file with `dvc checkout`)")


@contextlib.contextmanager
def reading(path: str | Path, what: str, writer: str) -> Iterator[None]:
    """Turn the read errors of the block into :func:`unreadable`'s one line (a :class:`UserError` raised inside,
    which already names its file, passes through)."""
    try:
        yield
    except UserError:
        raise
    except FileNotFoundError:
        if Path(path).exists():  # something else the block opened is missing: not this file's fault
            raise
        raise DataFileError(f"{path}: {what} not found; it is written by {writer}: run it first") from None
    except READ_ERRORS as err:
        raise unreadable(path, what, writer, err) from None


__all__ = ["DataFileError", "PREPARE", "TEACHER", "EVALUATE", "READ_ERRORS", "reading", "unreadable", "first_line"]
