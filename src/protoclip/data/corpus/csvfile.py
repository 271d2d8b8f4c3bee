"""A user CSV/TSV of image-caption pairs, read as a stream of data rows: the one reader and the one image-path rule.

Every pass over a caption file (prepare's fingerprint of the images it names, the repeated-path pass, the scan) uses
:class:`CaptionRows`, so each sees the same rows; its docstring gives the reading rules.
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
MAX_LISTED = 20  # dropped records listed one by one (in the log and the prepare report); the rest are counted


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
    """A dropped record: where, why (the rule) and what to change."""
    line: int  # first line of the record
    lines: int  # lines dropped (rows lost)
    quote_line: int | None  # where a quote opened that was taken for one left open (None: no quote ran on)
    error: str  # what was wrong and the rule that dropped it
    fix: str = ""  # how to keep the row
    reason: str = "malformed_row"  # the drop count it is in
    swallowed: int | None = None  # rows the open quote would have swallowed (None: not a quote left open)
    closes: int | None = None  # the line whose quote would have closed it (None: the end of the file)

    def describe(self) -> str:
        span = f"line {self.line}" if self.lines == 1 else f"lines {self.line}-{self.line + self.lines - 1}"
        what = self.error
        if self.swallowed == 0:  # the quote opened on the last line
            what += f"; a quote opened on line {self.quote_line}, the file's last"
        elif self.swallowed is not None:
            to = f"to line {self.closes}, whose quote closes it" if self.closes else "to the end of the file"
            what += (f"; a quote opened on line {self.quote_line} and read as one field it would swallow the "
                     f"{self.swallowed} following {'row' if self.swallowed == 1 else 'rows'} ({to}): they are read "
                     "as rows instead")
        elif self.quote_line:
            what += f"; a quote opened on line {self.quote_line}"
        fix = f"; {self.fix}" if self.fix else ""
        return f"{span}: {what} ({self.reason}: {self.lines} {'row' if self.lines == 1 else 'rows'} dropped){fix}"


class _Quote:
    """A quote taken for one left open, followed to where it would close (rows it would swallow)."""

    def __init__(self, record: Malformed):
        self.record, self.count, self.open = record, 0, True

    def line(self, number: int, text: str) -> bool:
        """One more line after the quote's; True once the quote closes (an odd number of quote characters)."""
        self.count += 1
        if text.count('"') & 1:
            self.open, self.record.swallowed, self.record.closes = False, self.count, number
        return not self.open


class _Lines:
    """The file's lines for ``csv.reader``, numbered, the current record's lines kept until it ends.

    The reader asks for another line only when a quoted field is still open at the end of one; refusing it
    (StopIteration: one-line mode, or past the quote's bounds) makes the reader report "unexpected end of data"
    for that record, and the next record starts on the next line handed out (the csv reader resets its state at
    every record). Lines handed back (:meth:`left_open`) are handed out again before the file's next ones.
    """

    def __init__(self, f, one_line: bool, max_lines: int, max_chars: int, closed=lambda record: None):
        self.f, self.one_line, self.max_lines, self.max_chars = f, one_line, max_lines, max_chars
        self.closed = closed  # called with a followed quote's record once its swallowed rows are counted
        self.line = 0  # number of the last line handed out
        self.start = 0  # first line of the current record
        self.record: list[tuple[int, str]] = []  # the current record's (number, line)
        self.chars = 0  # characters of the current record
        self.parity = 0  # quote characters seen in the current record, mod 2 (doubled quotes cancel out)
        self.quote_line: int | None = None  # line where the quote that is open now opened
        self.refused = False  # the record was cut at the quote's bounds
        self.pending: collections.deque[tuple[int, str]] = collections.deque()
        self.read = 0  # lines read from the file
        self.followed: list[_Quote] = []  # quotes left open, followed to where they would close

    def begin(self) -> None:
        self.record, self.chars, self.parity, self.quote_line, self.refused = [], 0, 0, None, False

    def __iter__(self):
        return self

    def _next_line(self) -> tuple[int, str]:
        if self.pending:
            return self.pending.popleft()
        text = next(self.f)  # StopIteration at the end of the file
        self.read += 1
        for q in [q for q in self.followed if q.line(self.read, text)]:
            self.followed.remove(q)
            self.closed(q.record)
        return self.read, text

    def __next__(self) -> str:
        if self.record and (self.one_line or len(self.record) >= self.max_lines or self.chars > self.max_chars):
            self.refused = not self.one_line
            raise StopIteration
        self.line, text = self._next_line()
        if not self.record:
            self.start = self.line
        self.record.append((self.line, text))
        self.chars += len(text)
        q = text.count('"') & 1
        if q and not self.parity:
            self.quote_line = self.line
        self.parity ^= q
        return text

    def left_open(self, record: Malformed) -> int:
        """Take the current record's quote for one left open: hand back the lines after the quote's line (they are
        read again as rows) and follow the quote to where it would close. Returns the lines dropped."""
        quote = self.quote_line or self.start
        after = [ln for ln in self.record if ln[0] > quote]
        self.pending.extendleft(reversed(after))
        follow = _Quote(record)
        for number, text in self.pending:  # lines read already (this record's and any handed back before)
            if follow.line(number, text):
                break
        else:
            self.followed.append(follow)
        return quote - self.start + 1

    def finish(self) -> None:
        """At the end of the file: the quotes still followed would run to it."""
        for q in self.followed:
            q.record.swallowed, q.record.closes = q.count, None
            self.closed(q.record)
        self.followed = []


class CaptionRows:
    """The data rows of one CSV/TSV caption file; a context manager and an iterable.

        with CaptionRows(cfg) as rows:      # header checked here: a missing column is a ConfigError naming it
            for row in rows:                # row.line (1-based; header: line 1), row.image, row.caption, row.label
                path = rows.image_path(row.image)
        rows.drops                          # malformed_row / extra_fields / missing_fields counts
        rows.malformed                      # the first MAX_LISTED dropped records: line, rule, how to change it

    The file is streamed, never read whole: UTF-8 (a BOM skipped), undecodable bytes kept as surrogate escapes (the
    row survives; the scan drops its caption as non_utf8_caption), any line ends (LF, CRLF, CR).
    ``csv.reader(strict=True)`` (a stray quote is an error, not a guess), with the csv module's field limit raised
    for the duration (captions are judged by length later, by the scan).

    Records and lines (RFC 4180, what pandas reads for open_clip): a quoted field may span lines. A quote left open
    (a typo in a spreadsheet export) would then swallow every following line up to the next quote into one caption,
    so a quoted field is bounded: still open after ``quote_max_lines`` lines or ``quote_max_chars`` characters, or
    breaking its record where it ends (a stray character after the closing quote, another number of fields than the
    header), it is taken for a quote left open. The line where it opened is dropped (``malformed_row``), the lines
    after it are read again as rows of their own, and the message gives the line where it opened and how many rows
    it would have swallowed (up to the line whose quote closes it, or to the end of the file). A typo therefore
    costs its own row, and the bounded look-ahead is all that is held. ``multiline_captions: false`` reads one
    record a line instead.

    Every dropped record is logged (the first ``MAX_LISTED``) with its line, the rule that dropped it and the
    setting or fix that changes it; they are also listed in prepare's report.
    """

    def __init__(self, cfg: UserDataConfig, quiet: bool = False):
        self.cfg, self.quiet = cfg, quiet  # quiet: a pass that only reads the rows (the scan logs what is wrong)
        self.path = Path(cfg.path)
        self.drops: collections.Counter = collections.Counter()
        self.malformed: list[Malformed] = []
        self._listed: set[int] = set()  # ids of the records in ``malformed``
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
            self._lines = _Lines(f, not self.cfg.multiline_captions, self.cfg.quote_max_lines, self.cfg.quote_max_chars,
                                 closed=self._warn)
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

    def _bad(self, m: Malformed, warn: bool = True) -> None:
        self.drops[m.reason] += m.lines
        self.n_malformed += 1
        if len(self.malformed) < MAX_LISTED:
            self.malformed.append(m)
            self._listed.add(id(m))
            if warn:
                self._warn(m)

    def _warn(self, m: Malformed) -> None:
        if not self.quiet and id(m) in self._listed:
            log.warning("user data '%s': %s: %s", self.cfg.name, self.path, m.describe())

    def _left_open(self, error: str) -> None:
        """The current record's quote is taken for one left open (see the class docstring)."""
        src = self._lines
        fix = "close the quote in the file"
        if src.refused:
            fix += ", or raise user_data quote_max_lines / quote_max_chars if a caption really is that long"
        m = Malformed(src.start, 0, src.quote_line or src.start, error, fix, swallowed=0)
        m.lines = src.left_open(m)
        self._bad(m, warn=False)
        if m.closes is not None:  # else logged once the rows the quote would swallow are counted (_Lines.closed)
            self._warn(m)

    def __iter__(self) -> Iterator[Row]:
        src, reader, ncols, cfg = self._lines, self._reader, len(self.columns), self.cfg
        bounds = f"within {cfg.quote_max_lines} lines or {cfg.quote_max_chars} characters"
        while True:
            src.begin()
            try:
                fields = next(reader)
            except StopIteration:
                break
            except csv.Error as err:
                lines = len(src.record)
                if "unexpected end of data" not in str(err):  # e.g. '"a"b' (text after a closing quote), a NUL
                    if lines > 1:
                        self._left_open(f"a quoted field runs over lines and its record is not a CSV record ({err})")
                    else:
                        self._bad(Malformed(src.start, 1, None, f"not a CSV record ({err}): quoted fields are read "
                                            "strictly (RFC 4180)", "fix the row: a quote inside a quoted field is "
                                            "doubled, and nothing but the delimiter follows a closing quote"))
                elif src.one_line:  # the line ends inside a quoted field (see _Lines)
                    self._bad(Malformed(src.start, 1, None, "a quoted field is not closed on its line (user_data "
                                        "multiline_captions is false: one record a line)",
                                        "close the quote, or set multiline_captions: true to read quoted line "
                                        "breaks"))
                elif src.refused:
                    self._left_open(f"a quoted field is not closed {bounds}")
                else:
                    self._left_open("a quoted field is not closed before the end of the file")
                continue
            if not fields:  # a blank line is no row (csv.DictReader's rule)
                continue
            if len(fields) != ncols:  # a stray delimiter or a cut line: the columns cannot be trusted
                if len(src.record) > 1:  # a quoted field ran over lines and the record came out wrong
                    self._left_open(f"a quoted field runs over lines and its record has {len(fields)} fields where "
                                    f"the header has {ncols}")
                else:
                    reason = "extra_fields" if len(fields) > ncols else "missing_fields"
                    delim = "a tab" if cfg.format == "tsv" else "a comma"
                    self._bad(Malformed(src.start, 1, None, f"{len(fields)} fields where the header has {ncols}: "
                                        "a row has exactly the header's columns",
                                        f"fix the row (a caption holding {delim} is quoted)", reason))
                continue
            yield Row(src.start, fields[self._i_img], fields[self._i_cap],
                      fields[self._i_lab] if self._i_lab is not None else "")
        src.finish()
        if self.n_malformed > len(self.malformed) and not self.quiet:
            log.warning("user data '%s': %s: %d more dropped records not listed (%d in all)", self.cfg.name,
                        self.path, self.n_malformed - len(self.malformed), self.n_malformed)


__all__ = ["CaptionRows", "Row", "Malformed", "image_path", "csv_field_limit", "MAX_LISTED"]
