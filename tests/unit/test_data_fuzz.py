"""Fuzz test of the user-data readers (CSV, TSV, webdataset): many malformed inputs from a seeded generator.

``hypothesis`` is not in the environment, so the inputs come from ``random.Random(seed)``: every failure
is reproducible from the printed seed. Asserted for every input:

* no exception escapes the reader except a one-line :class:`ConfigError` naming the file (a CSV whose
  header lacks the configured columns is not usable at all);
* counts add up, computed here from what was generated, not from the reader: CSV/TSV with one record a line
  (``multiline_captions: false``), kept + dropped == the non-blank lines after the header, damaged files included;
  with multi-line captions (the default), rows written <= kept + dropped <= those lines (a quote taken for one left
  open drops its own line, the lines after it are read again as rows); webdataset: kept + dropped == samples,
  i.e. distinct keys of regular-file members, plus one per shard that cannot be opened;
* kept pairs have unique ids, a non-empty caption and readable image bytes.
"""
from __future__ import annotations

import csv
import io
import random
from pathlib import Path

import pytest

from protoclip.data.config import UserDataConfig
from protoclip.data.loading.pairs import read_image
from protoclip.data.corpus.userdata import scan_csv, scan_wds
from protoclip.errors import ConfigError
from testkit.data import make_png, make_shard

N_CSV = 60  # files per delimiter
N_WDS = 60  # shard sets


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> dict[str, bytes]:
    d = tmp_path_factory.mktemp("fuzz_images")
    good = make_png(d / "good.png", "red", "circle").read_bytes()
    return {"good": good, "good2": make_png(d / "good2.png", "blue", "cross").read_bytes(),
            "cut": good[: len(good) // 2], "empty": b"", "junk": b"GIF89a not really"}


def random_text(rng: random.Random) -> str:
    pieces = ["a red circle", "", " ", "caf\u00e9", "\u4e2d\u6587", "comma, inside", "tab\tinside", "quote \" in",
              "new\nline", "\r\n", "\x00", "\udcff\udcfe", "x" * rng.choice([1, 1000, 140_000]), ";", "\ufeff"]
    return "".join(rng.choice(pieces) for _ in range(rng.randint(0, 3)))


def random_path(rng: random.Random, names: list[str]) -> str:
    return rng.choice(names + ["missing.png", "", "sub/../good.png", "/nonexistent/x.png", "a" * 300 + ".png",
                               "nul\x00.png", "good.png\udcff", "folder"])


def make_csv(rng: random.Random, folder: Path, delimiter: str) -> tuple[Path, int, bool]:
    """A CSV/TSV with random rows; returns (path, data rows written, header usable)."""
    names = ["good.png", "good2.png", "cut.png", "empty.png", "junk.png"]
    header = ["filepath", "caption"] + rng.sample(["extra", "url", "caption2"], rng.randint(0, 2))
    rng.shuffle(header)
    usable = True
    if rng.random() < 0.08:  # a header without the configured caption column
        header = [h if h != "caption" else "text" for h in header]
        usable = False
    buf = io.StringIO(newline="")
    writer = csv.writer(buf, delimiter=delimiter, lineterminator=rng.choice(["\n", "\r\n"]))
    writer.writerow(header)
    n_rows = rng.randint(0, 25)
    for _ in range(n_rows):
        row = {h: random_text(rng) for h in header}
        row["filepath"] = random_path(rng, names)
        if "caption" in row and rng.random() < 0.5:
            row["caption"] = rng.choice(["a red circle", "a blue cross", "two words"])
        fields = [row[h] for h in header]
        r = rng.random()
        if r < 0.15:
            fields += [random_text(rng)] * rng.randint(1, 3)  # more fields than the header
        elif r < 0.25:
            fields = fields[: rng.randint(1, len(fields))]  # fewer (at least one, so it is not a blank line)
        if fields == [""]:
            fields = ["", ""]  # csv.writer would write a single empty field as '""', still a row; keep it simple
        writer.writerow(fields)
    path = folder / f"pairs.{'tsv' if delimiter == chr(9) else 'csv'}"
    path.write_bytes(buf.getvalue().encode("utf-8", "surrogateescape"))
    return path, n_rows, usable


def check_pairs(pairs) -> None:
    assert len({p.id for p in pairs}) == len(pairs)
    for p in pairs:
        assert p.caption.strip() and p.caption == " ".join(p.caption.split())
        read_image(p.path)  # what was kept can be trained on


def data_lines(path: Path) -> int:
    """Non-blank lines after the header, split as the reader splits them (newline='': \\n, \\r\\n and \\r)."""
    text = path.read_bytes().decode("utf-8-sig", errors="surrogateescape")
    return sum(1 for line in list(io.StringIO(text, newline=""))[1:] if line not in ("\n", "\r", "\r\n"))


@pytest.mark.parametrize("multiline", [False, True])
@pytest.mark.parametrize("delimiter", [",", "\t"])
def test_csv_reader_fuzz(tmp_path, images, delimiter, multiline):
    for seed in range(N_CSV):
        rng = random.Random(seed)
        folder = tmp_path / f"{seed}"
        folder.mkdir()
        for name in ("good", "good2", "cut", "empty", "junk"):
            (folder / f"{name}.png").write_bytes(images[name])
        (folder / "folder").mkdir()
        path, n_rows, usable = make_csv(rng, folder, delimiter)
        mutated = rng.random() < 0.3
        if mutated:  # byte-level damage on top: flipped, inserted, deleted bytes, a cut tail
            data = bytearray(path.read_bytes())
            for _ in range(rng.randint(1, 8)):
                if not data:
                    break
                i = rng.randrange(len(data))
                op = rng.random()
                if op < 0.4:
                    data[i] = rng.randrange(256)
                elif op < 0.7:
                    data.insert(i, rng.choice(b'",\t\n\r\x00\xff'))
                else:
                    del data[i]
            if rng.random() < 0.3:
                data = data[: rng.randrange(len(data) + 1)]
            path.write_bytes(bytes(data))
        cfg = UserDataConfig(name="f", format="tsv" if delimiter == "\t" else "csv", path=str(path),
                             multiline_captions=multiline)
        try:
            pairs, drops = scan_csv(cfg)
        except ConfigError as err:  # the only acceptable way out: a file that cannot be used at all
            msg = str(err)
            assert str(path) in msg and "\n" not in msg, f"seed {seed}: {msg}"
            assert mutated or not usable, f"seed {seed}: a usable header was refused: {msg}"
            continue
        assert usable or mutated, f"seed {seed}: a header without 'caption' was accepted"
        assert all(isinstance(v, int) and v > 0 for v in drops.values()), f"seed {seed}: {drops}"
        total, lines = len(pairs) + sum(drops.values()), data_lines(path)
        if not multiline:  # every non-blank line is one record, counted once, whatever damage the file has
            assert total == lines, f"seed {seed}: {len(pairs)} + {dict(drops)} != {lines} lines"
        elif not mutated:
            assert n_rows <= total <= lines, f"seed {seed}: {len(pairs)} + {dict(drops)}: {n_rows} rows, {lines} lines"
        check_pairs(pairs)
        assert csv.field_size_limit() == 131072, f"seed {seed}: the global csv limit leaked"


def test_webdataset_reader_fuzz(tmp_path, images):
    for seed in range(N_WDS):
        rng = random.Random(1000 + seed)
        folder = tmp_path / f"{seed}"
        folder.mkdir()
        expected, damaged, ambiguous = 0, False, set()
        n_shards = rng.randint(1, 3)
        for i in range(n_shards):
            shard = folder / f"s-{i}.tar"
            r = rng.random()
            if r < 0.1:
                expected += 1  # missing shard: counted once as missing_file
                continue
            if r < 0.15:
                shard.write_bytes(bytes(rng.randrange(256) for _ in range(rng.randint(0, 2000))))
                damaged = True  # random bytes: refused as one undecodable shard, or (rarely) read as a tar
                continue
            n_samples, repeated = make_shard(rng, shard, images)
            expected += n_samples
            ambiguous |= {f"w/{shard.name}/{key}" for key in repeated}
            if rng.random() < 0.2:  # cut or scribbled-over shard
                data = bytearray(shard.read_bytes())
                if rng.random() < 0.5:
                    data = data[: rng.randrange(len(data) + 1)]
                else:
                    for _ in range(rng.randint(1, 20)):
                        data[rng.randrange(len(data))] = rng.randrange(256)
                shard.write_bytes(bytes(data))
                damaged = True
        pattern = str(folder / f"s-{{0..{n_shards - 1}}}.tar")
        pairs, drops = scan_wds(UserDataConfig(name="w", format="wds", path=pattern))  # must not raise
        assert all(isinstance(v, int) and v > 0 for v in drops.values()), f"seed {seed}: {drops}"
        if not damaged:
            assert len(pairs) + sum(drops.values()) == expected, f"seed {seed}: {len(pairs)} + {dict(drops)}"
        assert not {p.id for p in pairs} & ambiguous, f"seed {seed}: a sample with a repeated key was kept"
        check_pairs(pairs)
