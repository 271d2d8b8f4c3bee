"""The data path at scale, checked on small fixtures: the parallel shard scan writes the serial scan's
manifest byte for byte, the flat-array dataset returns what a naive list-and-tarfile reader returns, and an
image that changed or vanished after prepare stops the reader with one line naming it, and the bucketed
de-duplication that lets prepare stream drops what the in-memory rule drops.
Speed and memory at 10k-1M pairs are measured in bench/bench_data_scale.py, not here."""
from __future__ import annotations

import io
import random
import tarfile

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from protoclip.data.config import UserDataConfig
from protoclip.data.loading.manifest import to_frame, write_manifest
from protoclip.data.loading.pairs import ImageTextDataset, StringColumn
from protoclip.data.loading.reading import ImageReadError, read_image
from protoclip.data.loading.transforms import eval_transform
from protoclip.data.corpus.userdata import scan_wds
from testkit.data import make_png, make_shard


@pytest.fixture(scope="module")
def fuzz_shards(tmp_path_factory):
    """The fuzz test's random shards (missing, random-bytes, cut and scribbled ones among them), in two
    folders whose shard names repeat (the same sample id from two shards: dropped in the merge)."""
    root = tmp_path_factory.mktemp("scale_fuzz")
    d = root / "img"
    d.mkdir()
    good = make_png(d / "good.png", "red", "circle").read_bytes()
    images = {"good": good, "good2": make_png(d / "good2.png", "blue", "cross").read_bytes(),
              "cut": good[: len(good) // 2], "empty": b"", "junk": b"GIF89a not really"}
    rng = random.Random(7)
    patterns = []
    for folder in ("a", "b"):
        (root / folder).mkdir()
        for i in range(24):
            shard = root / folder / f"s-{i}.tar"
            r = rng.random()
            if r < 0.08:
                continue  # missing
            if r < 0.12:
                shard.write_bytes(bytes(rng.randrange(256) for _ in range(rng.randint(0, 2000))))
                continue
            make_shard(rng, shard, images)
            if rng.random() < 0.25:
                data = bytearray(shard.read_bytes())
                data = data[: rng.randrange(len(data) + 1)] if rng.random() < 0.5 else data
                for _ in range(rng.randint(0, 10)):
                    if data:
                        data[rng.randrange(len(data))] = rng.randrange(256)
                shard.write_bytes(bytes(data))
        patterns.append(str(root / folder / "s-{0..23}.tar"))
    return "::".join(patterns)


def test_parallel_scan_writes_the_serial_manifest(fuzz_shards, tmp_path):
    cfg = UserDataConfig(name="w", format="wds", path=fuzz_shards)
    serial, serial_drops = scan_wds(cfg, num_workers=1)
    parallel, parallel_drops = scan_wds(cfg, num_workers=2)
    assert serial and serial_drops["duplicate_id"] > 0  # the fixture exercises the cross-shard merge
    assert parallel_drops == serial_drops
    write_manifest(to_frame(serial), tmp_path / "serial.parquet")
    write_manifest(to_frame(parallel), tmp_path / "parallel.parquet")
    assert (tmp_path / "serial.parquet").read_bytes() == (tmp_path / "parallel.parquet").read_bytes()


def test_string_column_matches_a_list():
    values = ["", "a", "caf\u00e9", "\u4e2d\u6587 \U0001f600", "x" * 1000, None, "tab\tand\nnewline"]
    col = StringColumn(values)
    assert len(col) == len(values) and col.tolist() == [v or "" for v in values]
    assert col[-1] == values[-1]
    sliced = StringColumn(pd.Series(values, dtype="string").iloc[2:5])  # a frame's slice: offsets rebased
    assert sliced.tolist() == values[2:5]
    assert isinstance(col.data, np.ndarray) and isinstance(col.offsets, np.ndarray)  # no per-row objects
    with pytest.raises(IndexError):
        col[len(values)]


def naive_item(row, transform):
    """What ImageTextDataset returned before the flat arrays: tarfile's extractfile, PIL, the transform."""
    if "::" in row["path"]:
        shard, member = row["path"].split("::", 1)
        with tarfile.open(shard) as tar:
            data = tar.extractfile(member).read()
        img = Image.open(io.BytesIO(data))
    else:
        img = Image.open(row["path"])
    return transform(img.convert("RGB")), row["caption"], row["id"]


def test_flat_dataset_returns_the_samples_of_a_naive_reader(fuzz_shards, tmp_path):
    pairs, _ = scan_wds(UserDataConfig(name="w", format="wds", path=fuzz_shards))
    make_png(tmp_path / "f.png", "green", "triangle")
    df = to_frame(pairs)
    df = pd.concat([df, pd.DataFrame([{"id": "file/1", "path": str(tmp_path / "f.png"), "caption": "a plain file",
                                       "offset": -1, "size": -1, "sha256": ""}])], ignore_index=True)
    tf = eval_transform(16)

    def tokenizer(texts):
        return torch.tensor([[len(t), t.count(" ")] for t in texts])
    ds = ImageTextDataset(df, tf, tokenizer)
    assert len(ds) == len(df)
    for i in range(len(df)):
        img, tokens, sid = ds[i]
        want_img, caption, want_id = naive_item(df.iloc[i], tf)
        assert sid == want_id and torch.equal(img, want_img) and tokens.tolist() == [len(caption), caption.count(" ")]


def test_image_changed_or_gone_after_prepare_is_one_line_naming_it(tmp_path):
    for i, colour in enumerate(("red", "blue", "green")):
        make_png(tmp_path / f"{i}.png", colour, "circle")
    with tarfile.open(tmp_path / "s.tar", "w") as tar:
        for i in range(3):
            for ext, data in (("png", (tmp_path / f"{i}.png").read_bytes()), ("txt", f"caption {i}".encode())):
                info = tarfile.TarInfo(f"{i:04d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    pairs, _ = scan_wds(UserDataConfig(name="w", format="wds", path=str(tmp_path / "s.tar")))
    df = to_frame(pairs)
    ds = ImageTextDataset(df, eval_transform(16), lambda texts: torch.zeros(len(texts), 4, dtype=torch.long))
    ds[0], ds[1], ds[2]  # as prepared: readable
    # the shard rewritten with other images at the same places (same sizes: the offsets still fit)
    data = bytearray((tmp_path / "s.tar").read_bytes())
    p1 = pairs[1]
    data[p1.offset + 60: p1.offset + 64] = bytes(4)
    (tmp_path / "s.tar").write_bytes(bytes(data))
    with pytest.raises(ImageReadError) as err:
        ds[1]
    msg = str(err.value)
    assert p1.path in msg and "changed since" in msg and "\n" not in msg
    # the same error raised in a DataLoader worker reaches the main process as one line
    loader = torch.utils.data.DataLoader(torch.utils.data.Subset(ds, [1]), num_workers=1)
    with pytest.raises(ImageReadError) as err:
        next(iter(loader))
    assert str(err.value) == msg
    # a cut shard: the member is gone
    (tmp_path / "s.tar").write_bytes(bytes(data[: pairs[2].offset + 10]))
    with pytest.raises(ImageReadError, match=r"s\.tar::0002\.png: cannot read the image"):
        ds[2]
    # a plain file deleted, or replaced by junk (no sha256 known: an evaluation set's file)
    (tmp_path / "0.png").unlink()
    with pytest.raises(ImageReadError, match=r"0\.png: cannot read the image"):
        read_image(str(tmp_path / "0.png"))
    (tmp_path / "0.png").write_bytes(b"not an image")
    with pytest.raises(ImageReadError, match=r"0\.png: cannot decode the image"):
        read_image(str(tmp_path / "0.png"))


def test_image_read_error_exits_2_with_one_line_through_the_cli(tmp_path, capsys, monkeypatch):
    from protoclip import cli

    def boom(*a, **k):
        raise ImageReadError(f"{tmp_path}/x.png: the image changed since `protoclip prepare`")
    monkeypatch.setattr("protoclip.data.stage.run_prepare", boom)
    conf = tmp_path / "config.yaml"
    conf.write_text(f"paths: {{data_dir: {tmp_path}/data, results_dir: {tmp_path}/results}}\n")
    assert cli.main(["prepare", "--config", str(conf)]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "x.png: the image changed" in err[0]


@pytest.mark.parametrize("seed", range(5))
def test_bucketed_dedup_keeps_what_the_in_memory_rule_keeps(tmp_path, monkeypatch, seed):
    """PairDedup (keys spilled to buckets, only the conflicting rows replayed) drops exactly the rows, with the
    reasons, that deduplicate drops: random pairs over few ids / images / captions, so that the id and image
    rules interact (a row dropped for its image does not claim its id); rows start negative as prepare's do."""
    from protoclip.data.corpus import dedup
    from protoclip.data.loading.manifest import Pair, deduplicate

    monkeypatch.setattr(dedup, "BLOCK", 7)
    rng = random.Random(seed)
    pairs = [Pair(f"id{rng.randrange(40)}", "p", f"cap{rng.randrange(3)}", f"s{i % 3}", "", f"sha{rng.randrange(30)}")
             for i in range(300)]
    pairs += [Pair(f"unique{i}", "p", "c", "s0", "", f"usha{i}") for i in range(200)]  # never in conflict
    rng.shuffle(pairs)
    for i, p in enumerate(pairs):
        p.licence = str(i)  # the row, to find it again
    kept, _ = deduplicate(pairs)
    d = dedup.PairDedup(tmp_path)
    first = -123
    for i in range(0, len(pairs), 11):
        d.add(first + i, pairs[i:i + 11])
    removed = d.resolve()
    kept_rows = {int(p.licence) for p in kept}
    assert sorted(set(range(len(pairs))) - kept_rows) == (removed.rows - first).tolist()
    expected = {}  # the reason deduplicate gives, replayed
    ids, images = set(), {}
    for i, p in enumerate(pairs):
        if p.id in ids:
            expected[i] = "duplicate_id"
        elif p.sha256 in images:
            expected[i] = "duplicate_pair" if images[p.sha256] == p.caption else "duplicate_image"
        else:
            ids.add(p.id)
            images[p.sha256] = p.caption
    assert {int(r) - first: dedup.REASONS[c] for r, c in zip(removed.rows, removed.reasons)} == expected


def test_key_spill_finds_the_later_repeats(tmp_path, monkeypatch):
    from protoclip.data.corpus import dedup
    monkeypatch.setattr(dedup, "BLOCK", 5)
    rng = random.Random(3)
    keys = [f"k{rng.randrange(25)}" for _ in range(200)]
    spill = dedup.KeySpill(tmp_path)
    for i in range(0, 200, 9):
        spill.add(np.arange(i, min(i + 9, 200)), keys[i:i + 9])
    seen, later = set(), []
    for i, k in enumerate(keys):
        (later.append(i) if k in seen else seen.add(k))
    assert spill.later_repeats().tolist() == later
    assert len(list((tmp_path).iterdir())) > 10  # spread over bucket files
