"""A user CSV/TSV of image-caption pairs, read as a stream of data rows: the one reader and the one image-path rule.

    with CaptionRows(cfg) as rows:          # header checked here: a missing column is a ConfigError naming it
        for row in rows:                    # row.line (1-based, the header is line 1), row.image, row.caption, row.label
            path = rows.image_path(row.image)
    rows.drops                              # malformed_row / extra_fields / missing_fields counts
    rows.malformed                          # the first MAX_LISTED malformed records: line, lines consumed, quote line

Every pass over a caption file (prepare's fingerprint of the images it names, the repeated-path pass, the scan)
uses this reader, so each sees the same rows. The file is streamed, never read whole: UTF-8 (a BOM skipped),
undecodable bytes kept as surrogate escapes (the row survives; the scan drops its caption as non_utf8_caption).
``csv.reader(strict=True)`` (a stray quote is an error, not a guess), with the csv module's field limit raised
for the duration (captions are judged by length later, by the scan).

Records and lines. Without ``multiline_captions`` (the default) a record is one line: a quote opened and not
closed on its line makes that line malformed, and the next line is read as a record of its own. A typo (a quote
left open in a spreadsheet export) then costs exactly its own row; a reader that let the quote run on would
swallow every following line up to the next quote into one caption. With ``multiline_captions`` a quoted field
may span lines (open_clip's CSVs sometimes carry captions with line breaks); a record that is malformed after
spanning k lines counts k rows as ``malformed_row`` (each line it consumed was meant as a row, or was part of the
broken one: the count is an upper bound), and a quote that is never closed stops the scan (ConfigError naming the
line where it opened: everything after it would be one field).

Every malformed record is logged with the line it starts on, the lines it consumed and, when a quote ran past its
line, the line where that quote opened.
"""
from __future__ import annotations

import collections
import contextlib
import csv
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from protoclip.errors import ConfigError
from protoclip.data.config import UserDataConfig

log = logging.getLogger(__name__)

# the csv module's limit while reading: big enough that no real field trips it (rows are judged by the scan)
_CSV_FIELD_LIMIT = 1 << 30
MAX_LISTED = 20  # malformed records listed one by one (in the log and the prepare report); the rest are counted


def image_path(table: Path, image: str) -> Path:
    """Where a caption file's image path points: absolute as written, else relative to the file's folder
    (open_clip's CsvDataset reads paths as written, relative to the working directory; resolving against the
    file's folder makes a data set movable)."""
    p = Path(image)
    return p if p.is_absolute() else Path(table).parent / p


@contextlib.contextmanager
def csv_field_limit(limit: int):
    """The csv module's field limit is process-global: raise it for one read, then restore it."""
    old = csv.field_size_limit(limit)
    try:
        yield
    finally:
        csv.field_size_limit(old)


@dataclass
class Row:
    line: int  # the line the record starts on (1-based; the header is line 1)
    image: str  # the image path as written
    caption: str  # raw, as written (the scan decodes and cleans it)
    label: str  # raw label cell ("" without label_key)


@dataclass
class Malformed:
    line: int  # first line of the record
    lines: int  # lines it consumed (rows lost)
    quote_line: int | None  # where a quote opened that ran past its line (None: no quote ran on)
    error: str  # what was wrong

    def describe(self) -> str:
        span = f"line {self.line}" if self.lines == 1 else f"lines {self.line}-{self.line + self.lines - 1}"
        quote = f"; a quote opened on line {self.quote_line}" if self.quote_line else ""
        return f"{span}: {self.error}{quote} ({self.lines} {'row' if self.lines == 1 else 'rows'} dropped)"


class _Lines:
    """The file's lines for ``csv.reader``, numbered; in one-line mode at most one line per record.

    The reader asks for another line only when a quoted field is still open at the end of one; refusing it
    (StopIteration) makes the reader report "unexpected end of data" for that record, and the next record
    starts on the next line (the csv reader resets its state at every record).
    """

    def __init__(self, f, one_line: bool):
        self.f, self.one_line = f, one_line
        self.line = 0  # number of the last line handed out
        self.start = 0  # first line of the current record
        self.in_record = False
        self.parity = 0  # quote characters seen in the current record, mod 2 (doubled quotes cancel out)
        self.quote_line: int | None = None  # line where the quote that is open now opened

    def begin(self) -> None:
        self.in_record, self.parity, self.quote_line = False, 0, None

    def __iter__(self):
        return self

    def __next__(self) -> str:
        if self.in_record and self.one_line:
            raise StopIteration
        line = next(self.f)  # StopIteration at the end of the file
        self.line += 1
        if not self.in_record:
            self.start, self.in_record = self.line, True
        q = line.count('"') & 1
        if q and not self.parity:
            self.quote_line = self.line
        self.parity ^= q
        return line


class CaptionRows:
    """The data rows of one CSV/TSV caption file (see the module docstring); a context manager and an iterable."""

    def __init__(self, cfg: UserDataConfig, quiet: bool = False):
        self.cfg, self.quiet = cfg, quiet  # quiet: a pass that only reads the rows (the scan logs what is wrong)
        self.path = Path(cfg.path)
        self.drops: collections.Counter = collections.Counter()
        self.malformed: list[Malformed] = []
        self.n_malformed = 0  # malformed records (all of them; ``malformed`` lists the first MAX_LISTED)
        self.columns: list[str] = []
        self._stack = contextlib.ExitStack()

    def image_path(self, image: str) -> Path:
        return image_path(self.path, image)

    def __enter__(self) -> "CaptionRows":
        if not self.path.is_file():
            raise FileNotFoundError(f"user data '{self.cfg.name}': {self.cfg.format.upper()} file not found: "
                                    f"{self.path}")
        try:
            self._stack.enter_context(csv_field_limit(_CSV_FIELD_LIMIT))
            f = self._stack.enter_context(open(self.path, encoding="utf-8-sig", errors="surrogateescape",
                                               newline=""))
            self._lines = _Lines(f, one_line=not self.cfg.multiline_captions)
            self._reader = csv.reader(self._lines, delimiter="\t" if self.cfg.format == "tsv" else ",", strict=True)
            self._header()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def _header(self) -> None:
        cfg = self.cfg
        self._lines.begin()
        try:
            self.columns = next(self._reader, None) or []
        except csv.Error as err:
            raise ConfigError(f"{self.path}: user data '{cfg.name}': unreadable header line ({err})") from None
        for key in (cfg.img_key, cfg.caption_key) + ((cfg.label_key,) if cfg.label_key else ()):
            if key not in self.columns:
                shown = ", ".join(repr(c[:40]) for c in self.columns[:20]) or "none: empty file"
                raise ConfigError(f"{self.path}: user data '{cfg.name}': no column '{key}' (columns: {shown})")
        self._i_img, self._i_cap = self.columns.index(cfg.img_key), self.columns.index(cfg.caption_key)
        self._i_lab = self.columns.index(cfg.label_key) if cfg.label_key else None

    def _bad(self, lines: int, error: str, quote_line: int | None) -> None:
        self.drops["malformed_row"] += lines
        self.n_malformed += 1
        m = Malformed(self._lines.start, lines, quote_line, error)
        if len(self.malformed) < MAX_LISTED:
            self.malformed.append(m)
            if not self.quiet:
                    log.warning("user data '%s': %s: %s", self.cfg.name, self.path, m.describe())

    def __iter__(self) -> Iterator[Row]:
        src, reader, ncols = self._lines, self._reader, len(self.columns)
        while True:
            src.begin()
            try:
                fields = next(reader)
            except StopIteration:
                break
            except csv.Error as err:
                lines = src.line - src.start + 1
                if "unexpected end of data" not in str(err):  # e.g. '"a"b' (text after a closing quote), a NUL
                    self._bad(lines, f"not a CSV record ({err})", src.quote_line if lines > 1 else None)
                elif src.one_line:  # the line ends inside a quoted field (see _Lines)
                    self._bad(1, "a quoted field is not closed on its line (user_data multiline_captions is off)",
                              src.start)
                else:
                    raise ConfigError(
                        f"{self.path}:{src.quote_line or src.start}: a quoted field starts on this line and is never "
                        f"closed (unterminated quote: the {src.line - (src.quote_line or src.start) + 1} lines to the "
                        "end of the file would be one field); fix the file") from None
                continue
            if not fields:  # a blank line is no row (csv.DictReader's rule)
                continue
            lines = src.line - src.start + 1
            if len(fields) != ncols:  # a stray delimiter or a cut line: the columns cannot be trusted
                if lines > 1:  # a quoted field ran over lines and the record came out wrong: count every line
                    self._bad(lines, f"{len(fields)} fields where the header has {ncols}", src.quote_line)
                else:
                    self.drops["extra_fields" if len(fields) > ncols else "missing_fields"] += 1
                continue
            yield Row(src.start, fields[self._i_img], fields[self._i_cap],
                      fields[self._i_lab] if self._i_lab is not None else "")
        if self.n_malformed > len(self.malformed) and not self.quiet:
            log.warning("user data '%s': %s: %d more malformed records not listed (%d in all)", self.cfg.name,
                        self.path, self.n_malformed - len(self.malformed), self.n_malformed)


__all__ = ["CaptionRows", "Row", "Malformed", "image_path", "csv_field_limit", "MAX_LISTED"]
