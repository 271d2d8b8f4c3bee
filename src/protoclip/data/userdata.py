"""User image-text pairs in open_clip's formats: CSV/TSV files and webdataset tar shards.

* CSV/TSV (``format: csv | tsv``): one row per pair, image path in column ``img_key`` (open_clip's
  ``--csv-img-key``, default ``filepath``) and caption in ``caption_key`` (``--csv-caption-key``,
  default ``caption``). Relative image paths resolve against the CSV's folder. Sample id =
  ``<name>/<filepath as written>``. Optional ``label_key``: a column of coarse labels (our addition, not
  open_clip's) that the held-out pairs' zero-shot and linear probes use, as the offline sources' folders;
  an empty cell leaves that pair unlabelled.
* webdataset (``format: wds``): ``path`` is a shard pattern with brace ranges
  (``/data/cc3m/{00000..00331}.tar``); members sharing a key (the member path up to the first dot of
  its file name, webdataset's rule) form a sample; the image is the ``jpg``/``jpeg``/``png``/``webp``
  member, the caption the ``txt`` member. Images are not extracted: the manifest path is
  ``<shard>::<member>`` and ``protoclip.data.pairs`` reads the member by random access. Sample id =
  ``<name>/<shard file name>/<key>``.

Every image is decoded once here, so a pair that would crash training is skipped now and counted:
missing_file, bad_path, unreadable_file, empty_file, undecodable_image, empty_caption, non_utf8_caption,
caption_too_long, duplicate_id; CSV/TSV rows also extra_fields / missing_fields (more or fewer fields than
the header) and malformed_row; shards also duplicate_key and unreadable_member (a missing or unreadable
shard counts once as missing_file / undecodable_shard). Kept + dropped = rows (samples) seen. A file that
cannot be used at all (no such column) stops with a one-line ConfigError naming it (exit 2).
"""
from __future__ import annotations

import collections
import contextlib
import csv
import errno
import hashlib
import io
import logging
import tarfile
from pathlib import Path

from braceexpand import braceexpand
from tqdm import tqdm

from protoclip.config import ConfigError
from protoclip.data.captions import CaptionError, decode_caption
from protoclip.data.config import UserDataConfig
from protoclip.data.images import open_image_bytes
from protoclip.data.manifest import Pair

log = logging.getLogger(__name__)

RULES_VERSION = 2  # bump when what the readers keep or drop changes (part of prepare's fingerprint)
IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")
SEP = "::"  # path = "<shard>::<member>"


def expand_shards(pattern: str) -> list[str]:
    """``/d/{000..002}.tar`` -> three paths (webdataset's brace convention; ``::`` also separates lists)."""
    return [s for part in pattern.split("::") for s in braceexpand(part)]


def _image_reason(data: bytes | None) -> str:
    if data is None:
        return "missing_file"
    if not data:
        return "empty_file"
    try:
        open_image_bytes(data)
    except Exception:  # noqa: BLE001  any decoder error means the same thing here
        return "undecodable_image"
    return ""


def _pair_split(cfg: UserDataConfig) -> str:
    return "" if cfg.split == "auto" else cfg.split


# A caption longer than this is junk for a 76/77-token text encoder (and is the csv module's own default
# field limit, which used to stop the whole scan with a traceback): the row is dropped as caption_too_long.
MAX_CAPTION_CHARS = 131_072
# the csv module's limit while reading: big enough that no real field trips it (rows are judged by us)
_CSV_FIELD_LIMIT = 1 << 30


@contextlib.contextmanager
def _csv_field_limit(limit: int):
    """The csv module's field limit is process-global: raise it for one scan, then restore it."""
    old = csv.field_size_limit(limit)
    try:
        yield
    finally:
        csv.field_size_limit(old)


def _read_file(path: Path) -> tuple[bytes | None, str]:
    """(bytes, "") or (None, drop reason) for an image path from a CSV row (never raises)."""
    if "\x00" in str(path):  # no file system allows it (pathlib's is_file would just say False)
        return None, "bad_path"
    try:
        if not path.is_file():
            return None, "missing_file"
        return path.read_bytes(), ""
    except ValueError:  # an embedded NUL byte
        return None, "bad_path"
    except OSError as err:  # name too long, permission denied, a folder vanishing under us ...
        return None, "bad_path" if err.errno == errno.ENAMETOOLONG else "unreadable_file"


def _csv_rows(reader, drops: collections.Counter):
    """The reader's rows; a row the csv module cannot parse is counted as ``malformed_row`` and skipped."""
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error:
            drops["malformed_row"] += 1
            continue
        if row:  # a blank line is no row (csv.DictReader's rule)
            yield row


def scan_csv(cfg: UserDataConfig) -> tuple[list[Pair], collections.Counter]:
    """Pairs and drop counts of one CSV/TSV user data set.

    Every data row ends up either as a pair or in exactly one drop count: ``len(pairs) + sum(drops)``
    is the number of (non-blank) rows. A file that cannot be used at all (no header, no image or caption
    column) stops with a :class:`ConfigError` naming the file and the cause, before anything is written.
    """
    path = Path(cfg.path)
    if not path.is_file():
        raise FileNotFoundError(f"user data '{cfg.name}': {cfg.format.upper()} file not found: {path}")
    # the csv module (not pandas: its Arrow strings reject undecodable bytes) over surrogate-escaped
    # text keeps every row of a file with a few bad bytes; those captions are dropped below
    text = path.read_bytes().decode("utf-8-sig", errors="surrogateescape")
    drops: collections.Counter = collections.Counter()
    pairs: list[Pair] = []
    seen: set[str] = set()
    with _csv_field_limit(_CSV_FIELD_LIMIT):
        reader = csv.reader(io.StringIO(text, newline=""), delimiter="\t" if cfg.format == "tsv" else ",")
        try:
            columns = next(reader, None) or []
        except csv.Error as err:
            raise ConfigError(f"{path}: user data '{cfg.name}': unreadable header line ({err})") from None
        for key in (cfg.img_key, cfg.caption_key) + ((cfg.label_key,) if cfg.label_key else ()):
            if key not in columns:
                shown = ", ".join(repr(c[:40]) for c in columns[:20]) or "none: empty file"
                raise ConfigError(f"{path}: user data '{cfg.name}': no column '{key}' (columns: {shown})")
        i_img, i_cap = columns.index(cfg.img_key), columns.index(cfg.caption_key)
        i_lab = columns.index(cfg.label_key) if cfg.label_key else None
        for row in tqdm(_csv_rows(reader, drops), desc=cfg.name, leave=False):
            if len(row) != len(columns):  # a stray delimiter or a cut line: the columns cannot be trusted
                drops["extra_fields" if len(row) > len(columns) else "missing_fields"] += 1
                continue
            fp, cap = row[i_img], row[i_cap]
            sid = f"{cfg.name}/{fp}"
            if sid in seen:
                drops["duplicate_id"] += 1
                continue
            seen.add(sid)
            if len(cap) > MAX_CAPTION_CHARS:
                drops["caption_too_long"] += 1
                continue
            try:
                caption = decode_caption(cap.encode("utf-8", "surrogateescape"))
            except CaptionError as err:
                drops[err.reason] += 1
                continue
            if not fp:
                drops["missing_file"] += 1
                continue
            img = Path(fp) if Path(fp).is_absolute() else path.parent / fp
            data, reason = _read_file(img)
            reason = reason or _image_reason(data)
            if reason:
                drops[reason] += 1
                continue
            label = row[i_lab].strip() if i_lab is not None else ""  # empty: this pair is unlabelled
            pairs.append(Pair(sid, str(img.resolve()), caption, cfg.name, label, hashlib.sha256(data).hexdigest(),
                              split=_pair_split(cfg)))
    return pairs, drops


def _key_ext(member: str) -> tuple[str, str]:
    folder, _, base = member.rpartition("/")
    stem, _, ext = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), ext.lower()


def _shard_samples(tar: tarfile.TarFile) -> tuple[dict[str, dict[str, tarfile.TarInfo]], set[str]]:
    """Members grouped by key, and the keys that repeat a (key, extension) member."""
    samples: dict[str, dict[str, tarfile.TarInfo]] = collections.defaultdict(dict)
    repeated: set[str] = set()
    for m in tar.getmembers():
        if m.isfile():
            key, ext = _key_ext(m.name)
            if ext in samples[key]:
                repeated.add(key)
            samples[key][ext] = m
    return samples, repeated


def _read_member(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    f = tar.extractfile(member)
    if f is None:
        raise tarfile.ReadError(f"{member.name} is not a regular file")
    return f.read()


def scan_wds(cfg: UserDataConfig) -> tuple[list[Pair], collections.Counter]:
    """Pairs and drop counts of one webdataset shard set (images stay inside the tars).

    Every sample (distinct key of a shard) ends up as a pair or in one drop count; a shard that cannot
    be opened or listed counts once (missing_file / undecodable_shard). A key that repeats a member
    (two ``0001.jpg``, or a second ``0001.txt``) is ambiguous, since webdataset would split it into two samples
    with one id; it is dropped as ``duplicate_key``. A member that cannot be read (cut-off shard) drops its
    sample as ``unreadable_member``.
    """
    drops: collections.Counter = collections.Counter()
    pairs: list[Pair] = []
    seen: set[str] = set()
    for shard in tqdm(expand_shards(cfg.path), desc=cfg.name, unit="shard", leave=False):
        sp = Path(shard)
        if not sp.is_file():
            log.warning("user data '%s': shard not found: %s", cfg.name, sp)
            drops["missing_file"] += 1
            continue
        try:
            tar = tarfile.open(sp)
        except (tarfile.TarError, OSError, EOFError) as err:
            log.warning("user data '%s': cannot read shard %s: %s", cfg.name, sp, err)
            drops["undecodable_shard"] += 1
            continue
        with tar:
            try:
                samples, repeated = _shard_samples(tar)
            except (tarfile.TarError, OSError, EOFError) as err:
                log.warning("user data '%s': cannot list shard %s: %s", cfg.name, sp, err)
                drops["undecodable_shard"] += 1
                continue
            if repeated:
                log.warning("user data '%s': shard %s repeats %d keys (first: %s)", cfg.name, sp, len(repeated),
                            sorted(repeated)[0])
            for key in sorted(samples):
                members = samples[key]
                sid = f"{cfg.name}/{sp.name}/{key}"
                if sid in seen:
                    drops["duplicate_id"] += 1
                    continue
                seen.add(sid)
                if key in repeated:
                    drops["duplicate_key"] += 1
                    continue
                img_m = next((members[e] for e in IMAGE_EXTS if e in members), None)
                if "txt" not in members:
                    drops["empty_caption"] += 1
                    continue
                try:
                    raw_caption = _read_member(tar, members["txt"])
                    data = _read_member(tar, img_m) if img_m is not None else None
                except (tarfile.TarError, OSError, EOFError):
                    drops["unreadable_member"] += 1
                    continue
                if len(raw_caption) > 4 * MAX_CAPTION_CHARS:  # UTF-8: at most 4 bytes a character
                    drops["caption_too_long"] += 1
                    continue
                try:
                    caption = decode_caption(raw_caption)
                except CaptionError as err:
                    drops[err.reason] += 1
                    continue
                if len(caption) > MAX_CAPTION_CHARS:
                    drops["caption_too_long"] += 1
                    continue
                reason = _image_reason(data)
                if reason:
                    drops[reason] += 1
                    continue
                pairs.append(Pair(sid, f"{sp.resolve()}{SEP}{img_m.name}", caption, cfg.name, "",
                                  hashlib.sha256(data).hexdigest(), split=_pair_split(cfg)))
    return pairs, drops


def scan_user_data(cfg: UserDataConfig) -> tuple[list[Pair], collections.Counter]:
    return scan_wds(cfg) if cfg.format == "wds" else scan_csv(cfg)


def input_files(cfg: UserDataConfig) -> list[Path]:
    """The files whose stats fingerprint this data set (the CSV/TSV, or every shard)."""
    return [Path(cfg.path)] if cfg.format != "wds" else [Path(s) for s in expand_shards(cfg.path)]


__all__ = ["IMAGE_EXTS", "SEP", "expand_shards", "scan_csv", "scan_wds", "scan_user_data", "input_files"]
