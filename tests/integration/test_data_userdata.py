"""User data in open_clip's formats (CSV, TSV, webdataset shards) and every bad-input case counted."""
from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import pytest

from protoclip.data.config import UserDataConfig
from protoclip.data.loading.pairs import read_image
from protoclip.data.corpus.userdata import expand_shards, scan_csv, scan_user_data, scan_wds
from testkit.data import make_png


def write_bad_files(d: Path) -> dict[str, str]:
    """Good and bad images next to a CSV; returns name -> relative path."""
    d.mkdir(parents=True, exist_ok=True)
    make_png(d / "good1.png", "red", "circle")
    make_png(d / "good2.png", "blue", "square")
    make_png(d / "good3.png", "green", "triangle")
    (d / "empty.png").write_bytes(b"")
    full = (d / "good1.png").read_bytes()
    (d / "truncated.png").write_bytes(full[: len(full) // 2])
    (d / "garbage.jpg").write_bytes(b"this is not an image at all")
    return {}


def test_csv_good_and_bad_rows(tmp_path):
    write_bad_files(tmp_path / "imgs")
    rows = [("imgs/good1.png", "a red circle"), ("imgs/good2.png", "a blue square"),
            (str(tmp_path / "imgs/good3.png"), "absolute path works"),
            ("imgs/good1.png", "same file again"),  # duplicate id
            ("imgs/missing.png", "missing"), ("imgs/empty.png", "zero bytes"), ("imgs/truncated.png", "cut"),
            ("imgs/garbage.jpg", "not an image"), ("imgs/good2.png", "")]  # duplicate id first
    text = "filepath,caption,extra\n" + "".join(f'{p},"{c}",x\n' for p, c in rows)
    data = text.encode("utf-8") + b"imgs/good3.png,caf\xe9 latin1,x\n" + b"imgs/good3.png2,,x\n"
    (tmp_path / "pairs.csv").write_bytes(data)
    pairs, drops = scan_csv(UserDataConfig(name="mine", format="csv", path=str(tmp_path / "pairs.csv")))
    assert [(p.id, p.caption) for p in pairs] == [
        ("mine/imgs/good1.png", "a red circle"), ("mine/imgs/good2.png", "a blue square"),
        (f"mine/{tmp_path}/imgs/good3.png", "absolute path works")]
    assert all(Path(p.path).is_absolute() and p.source == "mine" and p.split == "" for p in pairs)
    assert dict(drops) == {"duplicate_id": 2, "missing_file": 1, "empty_file": 1, "undecodable_image": 2,
                           "non_utf8_caption": 1, "empty_caption": 1}


def test_tsv_custom_columns_and_fixed_split(tmp_path):
    make_png(tmp_path / "a.png", "red", "circle")
    (tmp_path / "p.tsv").write_text("img\ttext\na.png\ta caption, with a comma\n")
    cfg = UserDataConfig(name="t", format="tsv", path=str(tmp_path / "p.tsv"), img_key="img", caption_key="text",
                         split="heldout")
    pairs, drops = scan_user_data(cfg)
    assert [(p.caption, p.split) for p in pairs] == [("a caption, with a comma", "heldout")] and not drops
    with pytest.raises(ValueError, match="column 'filepath'"):
        scan_csv(UserDataConfig(name="t", format="tsv", path=str(tmp_path / "p.tsv")))
    with pytest.raises(FileNotFoundError):
        scan_csv(UserDataConfig(name="t", format="csv", path=str(tmp_path / "nope.csv")))


def add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def test_webdataset_shards(tmp_path):
    png = make_png(tmp_path / "x.png", "red", "circle").read_bytes()
    png2 = make_png(tmp_path / "y.png", "blue", "cross").read_bytes()
    with tarfile.open(tmp_path / "shard-000.tar", "w") as tar:
        add(tar, "sub/0001.png", png)
        add(tar, "sub/0001.txt", b"a red circle")
        add(tar, "0002.jpg", png2)  # content sniffed, extension only routes it
        add(tar, "0002.txt", b"a blue cross")
        add(tar, "0003.png", png)  # no caption
        add(tar, "0004.txt", b"caption without image")
        add(tar, "0005.png", png[:40])
        add(tar, "0005.txt", b"truncated")
        add(tar, "0006.png", png)
        add(tar, "0006.txt", b"\xff\xfe")
    with tarfile.open(tmp_path / "shard-001.tar", "w") as tar:
        add(tar, "0007.png", png2)
        add(tar, "0007.txt", b"  ")
    (tmp_path / "shard-002.tar").write_bytes(b"not a tar")
    pattern = str(tmp_path / "shard-{000..003}.tar")
    assert len(expand_shards(pattern)) == 4
    pairs, drops = scan_wds(UserDataConfig(name="w", format="wds", path=pattern))
    assert [(p.id, p.caption) for p in pairs] == [("w/shard-000.tar/0002", "a blue cross"),
                                                  ("w/shard-000.tar/sub/0001", "a red circle")]
    assert pairs[1].path.endswith("shard-000.tar::sub/0001.png")
    assert read_image(pairs[1].path).size == (32, 32)  # random access into the tar
    assert dict(drops) == {"empty_caption": 2, "missing_file": 2, "undecodable_image": 1, "non_utf8_caption": 1,
                           "undecodable_shard": 1}


def test_csv_bad_rows_are_skipped_and_counted(tmp_path):
    make_png(tmp_path / "a.png", "red", "circle")
    make_png(tmp_path / "b.png", "blue", "square")
    long_caption = "x" * 200_000  # above the csv module's default field limit (131072): used to raise
    lines = ["filepath,caption", "a.png,a red circle", "b.png,a blue square,surplus",  # one field too many
             "c.png", f'd.png,"{long_caption}"', "x" * 5000 + ".png,name too long for the file system",
             "e.png,nul\x00byte path", "\x00.png,nul in the path", "", "f.png,missing image"]
    (tmp_path / "p.csv").write_text("\n".join(lines) + "\n")
    pairs, drops = scan_csv(UserDataConfig(name="c", format="csv", path=str(tmp_path / "p.csv")))
    assert [p.caption for p in pairs] == ["a red circle"]
    assert dict(drops) == {"extra_fields": 1, "missing_fields": 1, "caption_too_long": 1, "bad_path": 2,
                           "missing_file": 2}
    assert len(pairs) + sum(drops.values()) == 8  # every non-blank data row is accounted for
    import csv as csv_mod
    assert csv_mod.field_size_limit() == 131072  # the process-global limit is restored


def test_csv_without_the_caption_column_is_a_one_line_config_error(tmp_path, capsys):
    from protoclip.cli import main
    from protoclip.errors import ConfigError

    (tmp_path / "p.csv").write_text("filepath,text\na.png,hello\n")
    cfg = UserDataConfig(name="c", format="csv", path=str(tmp_path / "p.csv"))
    with pytest.raises(ConfigError) as err:
        scan_csv(cfg)
    msg = str(err.value)
    assert str(tmp_path / "p.csv") in msg and "no column 'caption'" in msg and "\n" not in msg
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(ConfigError, match="empty file"):
        scan_csv(UserDataConfig(name="c", format="csv", path=str(tmp_path / "empty.csv")))
    # through the CLI: exit 2 with one line
    import yaml
    conf = tmp_path / "config.yaml"
    conf.write_text(yaml.safe_dump({"paths": {"data_dir": str(tmp_path / "data"),
                                              "results_dir": str(tmp_path / "results")},
                                    "prepare": {"offline_sources": [], "eval_sets": [],
                                                "user_data": [{"name": "c", "format": "csv",
                                                               "path": str(tmp_path / "p.csv")}]}}))
    assert main(["prepare", "--config", str(conf)]) == 2
    err_lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err_lines) == 1 and "no column 'caption'" in err_lines[0]


def test_webdataset_repeated_key_is_dropped_and_counted(tmp_path):
    png = make_png(tmp_path / "x.png", "red", "circle").read_bytes()
    png2 = make_png(tmp_path / "y.png", "blue", "cross").read_bytes()
    with tarfile.open(tmp_path / "s.tar", "w") as tar:
        add(tar, "0001.png", png)
        add(tar, "0001.txt", b"first")
        add(tar, "0002.png", png2)
        add(tar, "0002.txt", b"ok")
        add(tar, "0001.png", png2)  # the key comes back: which image goes with "first"?
        add(tar, "0001.txt", b"second")
    pairs, drops = scan_wds(UserDataConfig(name="w", format="wds", path=str(tmp_path / "s.tar")))
    assert [(p.id, p.caption) for p in pairs] == [("w/s.tar/0002", "ok")]
    assert dict(drops) == {"duplicate_key": 1}


def test_webdataset_cut_shard_keeps_what_it_can_and_counts_the_rest(tmp_path):
    """A shard cut anywhere keeps every sample before the cut (webdataset's streaming reader yields them
    too) and drops the sample at the cut as unreadable_member, not the whole shard."""
    import webdataset as wds

    png = make_png(tmp_path / "x.png", "red", "circle").read_bytes()
    with tarfile.open(tmp_path / "s.tar", "w") as tar:
        for i in range(6):
            add(tar, f"{i:04d}.png", png)
            add(tar, f"{i:04d}.txt", f"caption {i}".encode())
    data = (tmp_path / "s.tar").read_bytes()
    with tarfile.open(tmp_path / "s.tar") as tar:
        ends = [(m.name, m.offset, m.offset_data + m.size) for m in tar.getmembers()]
    for cut in range(512, ends[-1][2] + 1, 256):
        (tmp_path / "cut.tar").write_bytes(data[:cut])
        pairs, drops = scan_wds(UserDataConfig(name="w", format="wds", path=str(tmp_path / "cut.tar")))
        # independent expectation: a sample is kept when its two members' data end before the cut and no
        # member of it has a whole header but cut data; the cut itself is counted once either way
        whole = {n for n, _, end in ends if end <= cut}
        overrun = {n.split(".")[0] for n, start, end in ends if start + 512 <= cut < end}
        kept = sorted(k for k in {n.split(".")[0] for n in whole}
                      if {f"{k}.png", f"{k}.txt"} <= whole and k not in overrun)
        assert [p.caption for p in pairs] == [f"caption {int(k)}" for k in kept], cut
        assert dict(drops) == {"unreadable_member": 1}, (cut, dict(drops))
        for p in pairs:
            assert read_image(p.path).size == (32, 32)
        # we keep every whole sample webdataset's own streaming reader yields before the cut (it also loses
        # the last whole sample when the cut falls in the next sample's data: it emits a sample on a key change)
        got = []
        try:
            for s in wds.WebDataset(str(tmp_path / "cut.tar"), shardshuffle=False, empty_check=False):
                if "png" in s and "txt" in s:
                    got.append(s["__key__"])
        except Exception:
            pass
        assert set(got) <= {p.id.rsplit("/", 1)[1] for p in pairs}, cut
    pairs, drops = scan_wds(UserDataConfig(name="w", format="wds", path=str(tmp_path / "s.tar")))
    assert len(pairs) == 6 and not drops  # the whole shard: nothing counted as cut


def test_webdataset_offsets_read_the_same_bytes_as_tarfile(tmp_path):
    from protoclip.data.loading.reading import TarCache
    png = make_png(tmp_path / "x.png", "red", "circle").read_bytes()
    png2 = make_png(tmp_path / "y.png", "blue", "cross").read_bytes()
    with tarfile.open(tmp_path / "s.tar", "w", format=tarfile.PAX_FORMAT) as tar:
        add(tar, "a" * 150 + "/0001.png", png)  # a long name: a pax header block before the member
        add(tar, "a" * 150 + "/0001.txt", b"long name")
        add(tar, "0002.png", png2)
        add(tar, "0002.txt", b"short")
    pairs, drops = scan_wds(UserDataConfig(name="w", format="wds", path=str(tmp_path / "s.tar")))
    assert len(pairs) == 2 and not drops
    cache = TarCache()
    with tarfile.open(tmp_path / "s.tar") as tar:
        for p in pairs:
            member = p.path.split("::", 1)[1]
            expected = tar.extractfile(member).read()
            assert cache.read(str(tmp_path / "s.tar"), member, p.offset, p.size) == expected
            assert cache.read(str(tmp_path / "s.tar"), member) == expected  # the lazily built index
            assert p.sha256 == hashlib.sha256(expected).hexdigest()


# a spreadsheet export with a typo: the quote opened in row 2 (line 3) closes in row 4 (line 5), before text
QUOTE_TYPO = ('filepath,caption\na.png,a red circle\nb.png,"a blue square\nc.png,a green thing\n'
              'd.png,the quote closes" here\ne.png,the last row\n')


def _five_images(d: Path) -> None:
    for name, colour, shape in [("a", "red", "circle"), ("b", "blue", "square"), ("c", "green", "triangle"),
                                ("d", "yellow", "circle"), ("e", "purple", "square")]:
        make_png(d / f"{name}.png", colour, shape)


def _scan(path: Path, caplog, **cfg):
    with caplog.at_level("WARNING", logger="protoclip.data.corpus.csvfile"):
        caplog.clear()
        pairs, drops = scan_csv(UserDataConfig(name="q", format="csv", path=str(path), **cfg))
    return pairs, dict(drops), [r.getMessage() for r in caplog.records]


def test_csv_as_rfc4180_allows_is_read_whole_by_default(tmp_path, caplog):
    """A UTF-8 BOM, CRLF line ends, a quoted delimiter, a doubled quote and a quoted line break: all 5 rows kept
    (pandas, which open_clip's CsvDataset uses, reads the same 5 records from the same file)."""
    import pandas as pd

    _five_images(tmp_path)
    text = ('filepath,caption\r\na.png,a red circle\r\nb.png,"a blue square,\r\non two lines"\r\n'
            'c.png,"a ""green"" thing"\r\nd.png,"yellow, round"\r\ne.png,the last row\r\n')
    (tmp_path / "p.csv").write_bytes(b"\xef\xbb\xbf" + text.encode())
    pairs, drops, warned = _scan(tmp_path / "p.csv", caplog)
    assert [p.caption for p in pairs] == ["a red circle", "a blue square, on two lines", 'a "green" thing',
                                          "yellow, round", "the last row"]
    assert drops == {} and warned == []
    theirs = pd.read_csv(tmp_path / "p.csv")
    assert list(theirs.columns) == ["filepath", "caption"] and list(theirs["filepath"]) == [f"{c}.png" for c in "abcde"]
    assert [" ".join(c.split()) for c in theirs["caption"]] == [p.caption for p in pairs]


def test_csv_quote_left_open_costs_its_own_row_only(tmp_path, caplog):
    """The quote opened on line 3 closes on line 5 before text, which breaks the record there: line 3 is dropped,
    lines 4 and 5 are read again as rows; the message says where the quote opened and what it would swallow. One
    record a line (multiline_captions false) keeps the same rows."""
    _five_images(tmp_path)
    (tmp_path / "p.csv").write_text(QUOTE_TYPO)
    for multiline in (True, False):
        pairs, drops, warned = _scan(tmp_path / "p.csv", caplog, multiline_captions=multiline)
        assert [p.caption for p in pairs] == ["a red circle", "a green thing", 'the quote closes" here',
                                              "the last row"]
        assert drops == {"malformed_row": 1} and len(pairs) + sum(drops.values()) == 5
        assert len(warned) == 1 and f"{tmp_path / 'p.csv'}: line 3: " in warned[0], warned
        assert "(malformed_row: 1 row dropped)" in warned[0]
        if multiline:
            assert "a quote opened on line 3 and read as one field it would swallow the 2 following rows (to line 5" \
                in warned[0] and "close the quote in the file" in warned[0]
        else:
            assert "multiline_captions is false" in warned[0] and "set multiline_captions: true" in warned[0]


def test_csv_quote_left_open_past_the_bound_counts_the_rows_it_would_swallow(tmp_path, caplog):
    """A quote opened on line 3 that no quote closes within quote_max_lines: line 3 is dropped, every row after it
    is kept, and the rows it would swallow are counted to the line whose lone quote closes it (here computed from
    where the test put that quote) or to the end of the file."""
    _five_images(tmp_path)
    rows = [f"a.png#{i},caption {i}" for i in range(30)]  # missing images: dropped as missing_file, but read
    for close_at in (None, 20):
        body = ["a.png,a red circle", 'b.png,"a blue square'] + rows
        if close_at is not None:
            body[close_at] = body[close_at].replace("caption", 'caption"')  # a lone quote: closes it
        (tmp_path / "p.csv").write_text("filepath,caption\n" + "\n".join(body) + "\n")
        line_of = {i: i + 2 for i in range(len(body))}  # body[i] is on line i + 2 (the header is line 1)
        pairs, drops, warned = _scan(tmp_path / "p.csv", caplog, quote_max_lines=4)
        assert [p.caption for p in pairs] == ["a red circle"]
        assert drops == {"malformed_row": 1, "missing_file": 30}
        swallowed = (line_of[close_at] if close_at else line_of[len(body) - 1]) - 3
        to = f"to line {line_of[close_at]}, whose quote closes it" if close_at else "to the end of the file"
        assert len(warned) == 1 and f"line 3: a quoted field is not closed within 4 lines or 131072 characters; " \
            f"a quote opened on line 3 and read as one field it would swallow the {swallowed} following rows ({to})" \
            in warned[0], warned
        assert "raise user_data quote_max_lines / quote_max_chars" in warned[0]
    # a quote opened on the last line swallows nothing: said so
    (tmp_path / "p.csv").write_text('filepath,caption\na.png,a red circle\nb.png,"left open\n')
    pairs, drops, warned = _scan(tmp_path / "p.csv", caplog)
    assert [p.caption for p in pairs] == ["a red circle"] and drops == {"malformed_row": 1}
    assert "line 3: a quoted field is not closed before the end of the file; a quote opened on line 3, the file's " \
        "last (malformed_row: 1 row dropped); close the quote in the file" in warned[0], warned
    # the bound in characters: the same open quote, lines of 50 characters, 120 allowed
    (tmp_path / "p.csv").write_text("filepath,caption\n" + 'b.png,"a blue square\n' + "\n".join(
        f"a.png#{i},{'x' * 40}" for i in range(10)) + "\n")
    pairs, drops, warned = _scan(tmp_path / "p.csv", caplog, quote_max_chars=120)
    assert drops == {"malformed_row": 1, "missing_file": 10}
    assert "not closed within 8 lines or 120 characters" in warned[0] and "swallow the 10 following rows" in warned[0]


def test_csv_a_long_quoted_caption_within_the_bounds_is_one_row(tmp_path, caplog):
    make_png(tmp_path / "a.png", "red", "circle")
    make_png(tmp_path / "b.png", "blue", "square")
    caption = "\n".join(f"line {i}" for i in range(8))  # 8 lines: the default bound
    (tmp_path / "p.csv").write_text(f'filepath,caption\na.png,"{caption}"\nb.png,x\n')
    pairs, drops, _ = _scan(tmp_path / "p.csv", caplog)
    assert [p.caption for p in pairs] == [" ".join(caption.split()), "x"] and drops == {}
    pairs, drops, warned = _scan(tmp_path / "p.csv", caplog, quote_max_lines=7)  # one line over: taken for a typo
    assert [p.caption for p in pairs] == ["x"] and drops == {"malformed_row": 1, "missing_fields": 7}
    assert len(warned) == 8 and "line 3: 1 fields where the header has 2: a row has exactly the header's columns " \
        "(missing_fields: 1 row dropped); fix the row (a caption holding a comma is quoted)" in warned[0]
    from protoclip.data.config import PrepareConfig
    with pytest.raises(ValueError, match="quote_max_lines and quote_max_chars must be >= 1"):
        PrepareConfig(user_data=[UserDataConfig(name="w", format="csv", path="x.csv", quote_max_lines=0)]).validate()


def test_csv_is_streamed_and_repeats_found_without_a_set_of_ids(tmp_path, monkeypatch):
    """More rows than a batch and than the key spill's block: repeated paths are found across batches."""
    import protoclip.data.corpus.dedup as dedup
    import protoclip.data.corpus.userdata as userdata
    monkeypatch.setattr(userdata, "CSV_BATCH", 7)
    monkeypatch.setattr(dedup, "BLOCK", 5)
    make_png(tmp_path / "a.png", "red", "circle")
    names = [f"a.png{'#' * (i % 9)}" for i in range(40)]  # 9 distinct paths, repeated; only a.png exists
    lines = ["filepath,caption"] + [f"{n},caption {i}" for i, n in enumerate(names)]
    (tmp_path / "p.csv").write_text("\n".join(lines) + "\n")
    pairs, drops = scan_csv(UserDataConfig(name="s", format="csv", path=str(tmp_path / "p.csv")), scratch=tmp_path)
    first = {}
    for i, n in enumerate(names):
        first.setdefault(n, i)
    assert [p.caption for p in pairs] == ["caption 0"]
    assert drops["duplicate_id"] == 40 - len(first) and drops["missing_file"] == len(first) - 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("csv-ids-")]  # the spill is removed


def test_csv_label_column_gives_coarse_labels(tmp_path):
    make_png(tmp_path / "a.png", "red", "circle")
    make_png(tmp_path / "b.png", "blue", "square")
    (tmp_path / "p.csv").write_text("filepath,caption,kind\na.png,a red circle, round \nb.png,a blue square,\n")
    pairs, drops = scan_csv(UserDataConfig(name="l", format="csv", path=str(tmp_path / "p.csv"), label_key="kind"))
    assert [(p.caption, p.label) for p in pairs] == [("a red circle", "round"), ("a blue square", "")] and not drops
    unlabelled, _ = scan_csv(UserDataConfig(name="l", format="csv", path=str(tmp_path / "p.csv")))
    assert [p.label for p in unlabelled] == ["", ""]
    with pytest.raises(ValueError, match="no column 'label'"):
        scan_csv(UserDataConfig(name="l", format="csv", path=str(tmp_path / "p.csv"), label_key="label"))
    from protoclip.data.config import PrepareConfig
    with pytest.raises(ValueError, match="label_key applies to csv/tsv"):
        PrepareConfig(user_data=[UserDataConfig(name="w", format="wds", path="x.tar", label_key="k")]).validate()
