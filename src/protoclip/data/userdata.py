"""User image-text pairs in open_clip's formats: CSV/TSV files and webdataset tar shards.

* CSV/TSV (``format: csv | tsv``): one row per pair, image path in column ``img_key`` (open_clip's
  ``--csv-img-key``, default ``filepath``) and caption in ``caption_key`` (``--csv-caption-key``,
  default ``caption``). Relative image paths resolve against the CSV's folder. Sample id =
  ``<name>/<filepath as written>``.
* webdataset (``format: wds``): ``path`` is a shard pattern with brace ranges
  (``/data/cc3m/{00000..00331}.tar``); members sharing a key (the member path up to the first dot of
  its file name, webdataset's rule) form a sample; the image is the ``jpg``/``jpeg``/``png``/``webp``
  member, the caption the ``txt`` member. Images are not extracted: the manifest path is
  ``<shard>::<member>`` and ``protoclip.data.pairs`` reads the member by random access. Sample id =
  ``<name>/<shard file name>/<key>``.

Every image is decoded once here, so a pair that would crash training is skipped now and counted:
missing_file, empty_file, undecodable_image, empty_caption, non_utf8_caption, duplicate_id
(a missing or unreadable shard counts once as missing_file / undecodable_shard).
"""
from __future__ import annotations

import collections
import csv
import hashlib
import io
import logging
import tarfile
from pathlib import Path

from braceexpand import braceexpand
from tqdm import tqdm

from protoclip.data.captions import CaptionError, decode_caption
from protoclip.data.config import UserDataConfig
from protoclip.data.images import open_image_bytes
from protoclip.data.manifest import Pair

log = logging.getLogger(__name__)

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


def scan_csv(cfg: UserDataConfig) -> tuple[list[Pair], collections.Counter]:
    """Pairs and drop counts of one CSV/TSV user data set."""
    path = Path(cfg.path)
    if not path.is_file():
        raise FileNotFoundError(f"user data '{cfg.name}': {cfg.format.upper()} file not found: {path}")
    # the csv module (not pandas: its Arrow strings reject undecodable bytes) over surrogate-escaped
    # text keeps every row of a file with a few bad bytes; those captions are dropped below
    text = path.read_bytes().decode("utf-8-sig", errors="surrogateescape")
    reader = csv.DictReader(io.StringIO(text, newline=""), delimiter="\t" if cfg.format == "tsv" else ",")
    columns = reader.fieldnames or []
    for key in (cfg.img_key, cfg.caption_key):
        if key not in columns:
            raise ValueError(f"user data '{cfg.name}': column '{key}' not in {path} (columns: {columns})")
    rows = [(r.get(cfg.img_key) or "", r.get(cfg.caption_key) or "") for r in reader]
    drops: collections.Counter = collections.Counter()
    pairs: list[Pair] = []
    seen: set[str] = set()
    for fp, cap in tqdm(rows, desc=cfg.name, leave=False):
        sid = f"{cfg.name}/{fp}"
        if sid in seen:
            drops["duplicate_id"] += 1
            continue
        seen.add(sid)
        try:
            caption = decode_caption(cap.encode("utf-8", "surrogateescape"))
        except CaptionError as err:
            drops[err.reason] += 1
            continue
        img = Path(fp) if Path(fp).is_absolute() else path.parent / fp
        data = img.read_bytes() if fp and img.is_file() else None
        reason = _image_reason(data)
        if reason:
            drops[reason] += 1
            continue
        pairs.append(Pair(sid, str(img.resolve()), caption, cfg.name, "", hashlib.sha256(data).hexdigest(),
                          split=_pair_split(cfg)))
    return pairs, drops


def _key_ext(member: str) -> tuple[str, str]:
    folder, _, base = member.rpartition("/")
    stem, _, ext = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), ext.lower()


def scan_wds(cfg: UserDataConfig) -> tuple[list[Pair], collections.Counter]:
    """Pairs and drop counts of one webdataset shard set (images stay inside the tars)."""
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
            with tarfile.open(sp) as tar:
                samples: dict[str, dict[str, tarfile.TarInfo]] = collections.defaultdict(dict)
                for m in tar.getmembers():
                    if m.isfile():
                        key, ext = _key_ext(m.name)
                        samples[key][ext] = m
                for key in sorted(samples):
                    members = samples[key]
                    sid = f"{cfg.name}/{sp.name}/{key}"
                    if sid in seen:
                        drops["duplicate_id"] += 1
                        continue
                    seen.add(sid)
                    img_m = next((members[e] for e in IMAGE_EXTS if e in members), None)
                    if "txt" not in members:
                        drops["empty_caption"] += 1
                        continue
                    try:
                        caption = decode_caption(tar.extractfile(members["txt"]).read())
                    except CaptionError as err:
                        drops[err.reason] += 1
                        continue
                    data = tar.extractfile(img_m).read() if img_m is not None else None
                    reason = _image_reason(data)
                    if reason:
                        drops[reason] += 1
                        continue
                    pairs.append(Pair(sid, f"{sp.resolve()}{SEP}{img_m.name}", caption, cfg.name, "",
                                      hashlib.sha256(data).hexdigest(), split=_pair_split(cfg)))
        except (tarfile.TarError, OSError) as err:
            log.warning("user data '%s': cannot read shard %s: %s", cfg.name, sp, err)
            drops["undecodable_shard"] += 1
    return pairs, drops


def scan_user_data(cfg: UserDataConfig) -> tuple[list[Pair], collections.Counter]:
    return scan_wds(cfg) if cfg.format == "wds" else scan_csv(cfg)


def input_files(cfg: UserDataConfig) -> list[Path]:
    """The files whose stats fingerprint this data set (the CSV/TSV, or every shard)."""
    return [Path(cfg.path)] if cfg.format != "wds" else [Path(s) for s in expand_shards(cfg.path)]


__all__ = ["IMAGE_EXTS", "SEP", "expand_shards", "scan_csv", "scan_wds", "scan_user_data", "input_files"]
