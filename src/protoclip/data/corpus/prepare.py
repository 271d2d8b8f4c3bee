"""The ``prepare`` stage's work: pinned packages and user data -> caption pairs, manifest, report, eval sets.

:func:`prepare_corpus` does it on the ``prepare`` section and the layout it is handed
(:func:`protoclip.data.stage.run_prepare`, the stage's entry, narrows the project config to them). Nothing bad in
the input is fatal or silent: it is dropped and counted. Design notes (memory, re-runs):
docs/offline-default.md#protoclipdatacorpusprepare.
"""
from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from protoclip.files.atomic import clean_stale_temps, write_json
from protoclip.data.corpus import debs, emoji, evalsets, openclipart, tuxpaint, userdata
from protoclip.data.corpus.captions import english_lexicon
from protoclip.data.config import PrepareConfig
from protoclip.data.corpus.csvfile import Malformed
from protoclip.data.corpus.dedup import REASONS, PairDedup, Removed
from protoclip.data.corpus.images import Candidate, render_all
from protoclip.data.loading.manifest import ManifestWriter, Pair, manifest_schema
from protoclip.data.corpus.split import split_score
from protoclip.files.layout import Layout
from protoclip.config.strict import to_dict

log = logging.getLogger(__name__)

FORMAT_VERSION = 3  # bump when the prepared outputs change meaning (forces a rebuild)
WORDLIST = Path("usr/share/dict/american-english")


def needed_packages(p: PrepareConfig) -> list[str]:
    names = [n for s in [*p.offline_sources, *p.eval_sets] for n in debs.SOURCE_PACKAGES[s]]
    return list(dict.fromkeys(names))


def fingerprint(p: PrepareConfig, layout: Layout) -> str:
    """sha256 of what the stage reads: prepare config, expected package hashes, user-data file sizes and mtimes,
    the size and mtime of every image a CSV/TSV names, ``FORMAT_VERSION`` (and the user-data rules' version).

    Images are fingerprinted by (size, mtime_ns), not by content: replacing a file changes its mtime, and hashing
    a million images to learn that nothing changed would cost as much as the scan.
    """
    stats = []
    for u in p.user_data:
        for f in userdata.input_files(u):
            st = f.stat() if f.exists() else None
            stats.append([str(f), st.st_size if st else None, st.st_mtime_ns if st else None])
    blob = {"version": FORMAT_VERSION, "prepare": to_dict(p),
            "packages": debs.expected_hashes(layout, needed_packages(p)), "user_data": stats}
    images = {u.name: userdata.image_stats_digest(u) for u in p.user_data if u.format != "wds"}
    if images:  # what the CSV/TSV rows point to (shards are covered by their own stats above)
        blob["user_images"] = images
    if p.user_data:  # the readers' rules changed what is kept: rebuild user data, not the offline-only default
        blob["user_data_rules"] = userdata.RULES_VERSION
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()


def is_up_to_date(p: PrepareConfig, layout: Layout, current: str | None = None) -> bool:
    """Whether the stored fingerprint equals ``current`` (computed now when not given) and every output exists."""
    fp = layout.prepare_fingerprint
    if not fp.exists() or not all(o.exists() for o in layout.prepared_files(p.eval_sets).values()):
        return False
    try:
        stored = json.loads(fp.read_text()).get("fingerprint")
    except (ValueError, AttributeError):  # a cut or foreign file: not up to date
        return False
    return stored == (current if current is not None else fingerprint(p, layout))


def scan_source(name: str, layout: Layout, p: PrepareConfig) -> tuple[list[Candidate], collections.Counter]:
    """Unpack what source ``name`` needs and list its candidates."""
    roots = {pkg: debs.ensure_unpacked(pkg, layout, strict=p.strict_hashes) for pkg in debs.SOURCE_PACKAGES[name]}
    if name == "tuxpaint":
        return tuxpaint.scan_tuxpaint(roots["tuxpaint-stamps-default"])
    if name == "openclipart":
        lex = english_lexicon(roots["wamerican"] / WORDLIST)
        return openclipart.scan_openclipart(roots["openclipart-svg"], lex, p.openclipart_max_title_uses,
                                            p.openclipart_max_keywords)
    if name == "emoji":
        return emoji.scan_emoji(roots["fonts-noto-color-emoji"], roots["unicode-data"], roots["unicode-cldr-core"])
    raise ValueError(f"unknown offline source {name!r}")


def build_offline_pairs(layout: Layout, p: PrepareConfig) -> tuple[list[Pair], dict[str, collections.Counter]]:
    pairs: list[Pair] = []
    drops: dict[str, collections.Counter] = {}
    for name in p.offline_sources:
        cands, drop = scan_source(name, layout, p)
        shutil.rmtree(layout.source_images(name), ignore_errors=True)  # no stale images of an earlier config
        log.info("%s: rendering %d images at %d px", name, len(cands), p.image_size)
        by_id = {c.id: c for c in cands}
        for r in render_all(cands, layout.prepared_images, p.image_size, p.num_workers, desc=name):
            if r.reason:
                drop[r.reason] += 1
                continue
            c = by_id[r.id]
            rel = Path(r.path).relative_to(layout.prepared).as_posix()
            pairs.append(Pair(c.id, rel, c.caption, c.source, c.label, r.sha256, c.licence))
        drops[name] = drop
    return pairs, drops


def build_eval_sets(layout: Layout, p: PrepareConfig) -> dict[str, dict[str, int]]:
    out = {}
    for name in p.eval_sets:
        if name == "fashion_mnist":
            arrays = evalsets.build_fashion_mnist(debs.ensure_unpacked("dataset-fashion-mnist", layout,
                                                                       strict=p.strict_hashes))
        elif name == "digits":
            arrays = evalsets.build_digits()
        else:
            raise ValueError(f"unknown eval set {name!r}")
        evalsets.save_eval_set(layout.eval_set(name), arrays)
        out[name] = evalsets.summary(arrays)
    return out


def format_counts(report: dict) -> str:
    lines = [f"{'source':<16}{'kept':>8}{'dropped':>9}  reasons"]
    for src, r in report["sources"].items():
        reasons = ", ".join(f"{k}={v}" for k, v in sorted(r["dropped"].items()))
        lines.append(f"{src:<16}{r['kept']:>8}{sum(r['dropped'].values()):>9}  {reasons}")
    t = report["total"]
    lines.append(f"{'total':<16}{t['kept']:>8}{t['dropped']:>9}  splits: "
                 + ", ".join(f"{k}={v}" for k, v in report["splits"].items()))
    for name, s in report["eval_sets"].items():
        lines.append(f"eval {name}: {s['train']} train / {s['test']} test, {s['classes']} classes")
    rules = report.get("drop_rules", {})
    if rules:  # why the user data's rows were dropped, and how to keep them
        lines.append(f"user data drops (each record: {report.get('report_path', 'the prepare report')}):")
        lines += [f"  {reason}: {rule}" for reason, rule in rules.items()]
    return "\n".join(lines)


class _Spill:
    """The user data's pairs between the scan and the manifest: Arrow IPC batches on disk, keys logged for dedup."""

    def __init__(self, folder: Path):
        self.path = folder / "user_pairs.arrow"
        self.dedup = PairDedup(folder / "keys")
        self.schema = manifest_schema()
        self.rows = 0
        self._sink = pa.OSFile(str(self.path), "wb")
        self._writer = pa.ipc.new_stream(self._sink, self.schema)

    def add(self, packed: userdata.Packed) -> None:
        if packed.batch.num_rows:
            self.dedup.add_keys(self.rows, packed.keys)
            self._writer.write_batch(packed.batch)
            self.rows += packed.batch.num_rows

    def close(self) -> None:
        self._writer.close()
        self._sink.close()

    def batches(self):
        with pa.OSFile(str(self.path), "rb") as f:
            yield from pa.ipc.open_stream(f)


def scan_all_user_data(p: PrepareConfig, spill: _Spill, scratch: Path
                       ) -> tuple[dict[str, collections.Counter], dict[str, list[Malformed]]]:
    """Scan every user data set into ``spill``; (drops, malformed CSV records) per data set."""
    drops: dict[str, collections.Counter] = {}
    malformed: dict[str, list[Malformed]] = {}
    # A corpus the user has not got is skipped (its runs are: ProjectConfig.runs_without_data) while something else
    # is there to prepare; with nothing else, its absence is the error it reads as (a wrong path).
    absent = {u.name: why for u in p.user_data if (why := userdata.absent_reason(u)) is not None}
    if len(absent) == len(p.user_data) and not p.offline_sources:
        absent = {}
    for u in p.user_data:
        drops[u.name], malformed[u.name], before = collections.Counter(), [], spill.rows
        if u.name in absent:
            log.warning("user data '%s' skipped: %s", u.name, absent[u.name])
            continue
        for packed in userdata.packed_batches(u, drops[u.name], (p.seed, p.heldout_fraction), p.num_workers,
                                              scratch, malformed[u.name]):
            spill.add(packed)
        log.info("user data '%s': %d pairs kept by the scan, %d dropped", u.name, spill.rows - before,
                 sum(drops[u.name].values()))
    return drops, malformed


SUBSET_SALT = "subset"  # the subset's hash differs from the held-out split's (corpus.split), which uses the same seed


def subset_removed(batches, removed: Removed, caps: dict[str, int], seed: int) -> Removed:
    """``removed`` plus, for each user data set ``caps`` names, the rows outside its seeded subset: of its pairs
    that ``removed`` keeps, the ``caps[source]`` with the smallest ``split_score("subset/<id>", seed)`` stay (the
    order of the scan, shards and workers does not matter; a larger cap keeps a superset).

    One more pass over the spill after de-duplication; it holds a score and a row number per pair of the capped
    sets (16 bytes a pair).
    """
    rows, scores, sources = [], [], []
    for first, batch in batches:
        src = np.asarray(batch.column("source").to_pylist(), dtype=object)
        idx = np.flatnonzero(np.isin(src, list(caps)))
        idx = idx[~np.isin(first + idx, removed.rows)]
        if len(idx):
            ids = batch.column("id").take(pa.array(idx)).to_pylist()
            rows.append(first + idx)
            sources.append(src[idx])
            scores.append(np.array([split_score(f"{SUBSET_SALT}/{i}", seed) for i in ids]))
    if not rows:
        return removed
    rows, scores, sources = (np.concatenate(a) for a in (rows, scores, sources))
    over = [np.zeros(0, np.int64)]
    for name, cap in caps.items():
        mine = np.flatnonzero(sources == name)
        over.append(rows[mine[np.argsort(scores[mine], kind="stable")[cap:]]])
    drop = np.concatenate(over).astype(np.int64)
    all_rows = np.concatenate([removed.rows, drop])
    reasons = np.concatenate([removed.reasons, np.full(len(drop), REASONS.index("over_max_pairs"), np.int8)])
    order = np.argsort(all_rows, kind="stable")
    return Removed(all_rows[order], reasons[order].astype(removed.reasons.dtype))


def write_deduplicated(path: Path, batches, removed: Removed, drops: dict[str, collections.Counter]
                       ) -> tuple[collections.Counter, collections.Counter]:
    """Stream ``batches`` ((first row, record batch) in manifest order) into the manifest at ``path``, leaving out
    the rows ``removed`` names (counted into ``drops`` per source and reason). Returns the kept pairs per source and
    per split."""
    kept, splits = collections.Counter(), collections.Counter()
    with ManifestWriter(path) as writer:
        for first, batch in batches:
            n = batch.num_rows
            lo, hi = np.searchsorted(removed.rows, [first, first + n])
            if hi > lo:
                gone = removed.rows[lo:hi] - first
                sources = batch.column("source").take(pa.array(gone)).to_pylist()
                for src, code in zip(sources, removed.reasons[lo:hi].tolist()):
                    drops[src][REASONS[code]] += 1
                keep = np.ones(n, bool)
                keep[gone] = False
                batch = batch.filter(pa.array(keep))
            for counter, column in ((kept, "source"), (splits, "split")):
                for entry in pc.value_counts(batch.column(column)).to_pylist():
                    counter[entry["values"]] += entry["counts"]
            writer.write(batch)
    return kept, splits


def prepare_corpus(p: PrepareConfig, layout: Layout) -> dict:
    """Build (or confirm up to date) every prepared output of section ``p`` where ``layout`` names them; return
    the report dict.

    Steps: download/verify/unpack the pinned Debian packages the configured sources need
    (``protoclip.data.corpus.debs``); scan each offline source (``tuxpaint``, ``openclipart``, ``emoji``) and
    render its images to ``layout.source_images(<source>)`` (PNG, ``image_size`` px, RGB on white); scan user data
    (CSV/TSV, webdataset); de-duplicate; split train/held-out by id hash; write ``manifest.parquet``, the offline
    eval sets and ``report.json`` (kept and dropped counts per source and reason). When the stored
    :func:`fingerprint` matches and every output exists it logs "up to date" and returns the stored counts.
    """
    clean_stale_temps(layout.prepared)  # a killed earlier run's half-written outputs
    current = fingerprint(p, layout)  # before anything is read: a change during the scan shows next time
    if is_up_to_date(p, layout, current):
        report = json.loads(layout.prepare_report.read_text())
        log.info("prepare: up to date (%s)", layout.prepared)
        print("prepare: up to date")
        print(format_counts(report))
        return report

    scratch = layout.prepare_scratch
    shutil.rmtree(scratch, ignore_errors=True)  # a killed run's spill
    scratch.mkdir(parents=True)
    try:
        report = _prepare(layout, p, scratch, current)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(format_counts(report))
    return report


def _prepare(layout: Layout, p: PrepareConfig, scratch: Path, current: str) -> dict:
    # user data first: a file that cannot be used at all stops the stage (ConfigError) before the offline
    # images are re-rendered, so nothing already prepared is touched
    spill = _Spill(scratch)
    try:
        user_drops, malformed = scan_all_user_data(p, spill, scratch)
    finally:
        spill.close()
    # the outputs are about to be replaced: a kill from here on must not leave a fingerprint that vouches
    # for them (the old one could match a rerun with the old config)
    layout.prepare_fingerprint.unlink(missing_ok=True)
    offline, drops = build_offline_pairs(layout, p)
    for name, udrops in user_drops.items():
        if name in drops:
            raise ValueError(f"user data name {name!r} is already a source name")
        drops[name] = udrops
    # manifest order: the offline pairs, then the user data; the offline pairs are logged after the user data's
    # scan, at the rows before it (negative)
    offline = userdata.Packed.of(offline, (p.seed, p.heldout_fraction))
    spill.dedup.add_keys(-len(offline.keys), offline.keys)
    removed = spill.dedup.resolve()
    spill.dedup.close()
    caps = {u.name: u.max_pairs for u in p.user_data if u.max_pairs is not None}
    if caps:
        def spilled():
            first = 0
            for batch in spill.batches():
                yield first, batch
                first += batch.num_rows

        removed = subset_removed(spilled(), removed, caps, p.seed)

    def batches():
        yield -offline.batch.num_rows, offline.batch
        first = 0
        for batch in spill.batches():
            yield first, batch
            first += batch.num_rows

    kept_per, splits = write_deduplicated(layout.manifest, batches(), removed, drops)
    eval_summary = build_eval_sets(layout, p)

    sources = {s: {"kept": kept_per.get(s, 0), "dropped": dict(sorted(d.items()))} for s, d in drops.items()}
    for name, records in malformed.items():
        if records:  # where the malformed CSV records were (the first MAX_LISTED)
            sources[name]["malformed"] = [m.describe() for m in records]
    report = {
        "sources": sources,
        "total": {"kept": sum(kept_per.values()), "dropped": sum(sum(d.values()) for d in drops.values())},
        "splits": dict(sorted(splits.items())),
        "eval_sets": eval_summary,
        "package_hashes": debs.expected_hashes(layout, needed_packages(p)),
        "hash_mismatches": debs.recorded_hashes(layout),
        "image_size": p.image_size,
        # the rule and the fix of every reason the user data's rows were dropped for
        "drop_rules": {r: userdata.DROP_RULES[r] for r in sorted({r for u in user_drops.values() for r in u})
                       if r in userdata.DROP_RULES},
        "report_path": str(layout.prepare_report),
    }
    write_json(layout.prepare_report, report)
    os.sync()  # the rendered images (written without a sync each) on disk before the fingerprint vouches for them
    write_json(layout.prepare_fingerprint, {"fingerprint": current})  # last: it vouches for every output above
    return report


__all__ = ["FORMAT_VERSION", "prepare_corpus", "fingerprint", "is_up_to_date", "needed_packages", "format_counts",
           "write_deduplicated"]
