"""The prepare stage end to end on fake unpacked packages (no apt-get): manifest, report, eval sets,
de-duplication, bad input counted, idempotent second run."""
from __future__ import annotations

import gzip
import hashlib
import json
import struct
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from protoclip.project import PathsConfig, ProjectConfig
from protoclip.data.corpus import debs, evalsets, openclipart, prepare, tuxpaint
from protoclip.data.config import PrepareConfig, UserDataConfig
from protoclip.data.corpus.split import split_of
from protoclip.data.stage import run_prepare
from protoclip.files.layout import Layout
from testkit.data import make_png, svg
from testkit.handoffs import WatchedConfig, protocol_members


def fake_package(layout: Layout, name: str) -> Path:
    root = layout.unpacked / name
    root.mkdir(parents=True, exist_ok=True)
    (root / debs.MARKER).write_text(debs.PINNED[name].sha256 + "\n")  # "already unpacked": no download
    return root


def idx_gz(path: Path, arr: np.ndarray) -> None:
    header = struct.pack(">IIII", 2051, *arr.shape) if arr.ndim == 3 else struct.pack(">II", 2049, len(arr))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(header + arr.astype(np.uint8).tobytes()))


@pytest.fixture
def world(tmp_path):
    layout = Layout(tmp_path / "data", tmp_path / "results")
    tux = fake_package(layout, "tuxpaint-stamps-default") / tuxpaint.STAMPS_DIR
    make_png(tux / "animals/mammals/cat.png", "red", "circle", 48)
    (tux / "animals/mammals/cat.txt").write_text("A red cat.\nfr.utf8=Un chat rouge.\n")
    make_png(tux / "animals/mammals/cat2.png", "red", "circle", 48)  # same bytes, other caption
    (tux / "animals/mammals/cat2.txt").write_text("Another cat.\n")
    make_png(tux / "food/apple.png", "green", "circle", 48)
    (tux / "food/apple.txt").write_text("A green apple.\n")
    (tux / "food/pear.png").write_bytes(b"")  # zero-byte image
    (tux / "food/pear.txt").write_text("A pear.\n")
    (tux / "food/plum.svg").write_text("<svg><not closed")  # undecodable SVG
    (tux / "food/plum.txt").write_text("A plum.\n")
    (tux / "food/star.svg").write_text('<svg xmlns="http://www.w3.org/2000/svg" width="10" height="20">'
                                       '<rect width="10" height="20" fill="#0000ff" fill-opacity="0.5"/></svg>')
    (tux / "food/star.txt").write_text("A blue bar.\n")
    oc = fake_package(layout, "openclipart-svg") / openclipart.SVG_DIR
    (oc / "animals").mkdir(parents=True)
    (oc / "animals/dog.svg").write_text(svg("Bored dog", ["mammal"]))
    (oc / "animals/ragno.svg").write_text(svg("Ragnetto", ["mammal"], body='<circle r="3"/>'))
    words = fake_package(layout, "wamerican") / prepare.WORDLIST
    words.parent.mkdir(parents=True)
    words.write_text("bored\ndog\nmammal\n")
    fm = fake_package(layout, "dataset-fashion-mnist") / evalsets.FASHION_DIR
    rng = np.random.default_rng(0)
    for part, n in (("train", 6), ("t10k", 4)):
        idx_gz(fm / f"{part}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)))
        idx_gz(fm / f"{part}-labels-idx1-ubyte.gz", np.arange(n) % 10)
    user = tmp_path / "user"
    make_png(user / "u1.png", "blue", "square")
    make_png(user / "u2.png", "yellow", "cross")
    (user / "u1_copy.png").write_bytes((user / "u1.png").read_bytes())
    (user / "pairs.csv").write_text("filepath,caption\nu1.png,a blue square\nu2.png,a yellow cross\n"
                                    "u1.png,again\nmissing.png,gone\nu1_copy.png,a blue square\n")
    cfg = ProjectConfig(paths=PathsConfig(data_dir=layout.data_dir, results_dir=layout.results_dir),
                        prepare=PrepareConfig(image_size=16, num_workers=1, heldout_fraction=0.3,
                                              offline_sources=["tuxpaint", "openclipart"],
                                              eval_sets=["fashion_mnist", "digits"],
                                              user_data=[UserDataConfig(name="mine", format="csv",
                                                                        path=str(user / "pairs.csv"))]))
    return cfg, layout


def test_prepare_end_to_end(world, capsys):
    cfg, layout = world
    report = run_prepare(cfg)
    df = pd.read_parquet(layout.manifest)
    assert list(df.columns) == ["id", "path", "caption", "source", "label", "sha256", "split", "licence", "offset",
                                "size"]
    assert (df["offset"] == -1).all() and (df["size"] == -1).all()  # plain files: no tar member offsets
    assert df["id"].is_unique
    got = {r.id: (r.caption, r.source, r.label) for r in df.itertuples()}
    assert got == {
        "tuxpaint/animals/mammals/cat": ("A red cat.", "tuxpaint", "animals/mammals"),
        "tuxpaint/food/apple": ("A green apple.", "tuxpaint", "food"),
        "tuxpaint/food/star": ("A blue bar.", "tuxpaint", "food"),
        "openclipart/animals/dog": ("Bored dog, mammal", "openclipart", "animals"),
        "mine/u1.png": ("a blue square", "mine", ""),
        "mine/u2.png": ("a yellow cross", "mine", ""),
    }
    for r in df.itertuples():
        assert r.split == split_of(r.id, cfg.prepare.seed, cfg.prepare.heldout_fraction)
        p = Path(r.path) if r.source == "mine" else layout.prepared / r.path
        assert hashlib.sha256(p.read_bytes()).hexdigest() == r.sha256
    star = Image.open(layout.prepared / df.set_index("id").loc["tuxpaint/food/star", "path"])
    assert star.mode == "RGB" and star.size == (16, 16)
    assert star.getpixel((0, 0)) == (255, 255, 255)  # padding is white
    r, g, b = star.getpixel((8, 8))  # 50% blue over white
    assert abs(r - 127) <= 3 and abs(g - 127) <= 3 and b == 255
    assert report["sources"] == {
        "tuxpaint": {"kept": 3, "dropped": {"duplicate_image": 1, "empty_file": 1, "undecodable_image": 1}},
        "openclipart": {"kept": 1, "dropped": {"non_english": 1}},
        "mine": {"kept": 2, "dropped": {"duplicate_id": 1, "duplicate_pair": 1, "missing_file": 1}},
    }
    assert report["total"] == {"kept": 6, "dropped": 7}
    # each reason the user data lost rows for comes with its rule and fix, printed under the counts
    assert list(report["drop_rules"]) == ["duplicate_id", "duplicate_pair", "missing_file"]
    printed = prepare.format_counts(report)
    assert all(f"  {k}: {v}" in printed for k, v in report["drop_rules"].items())
    assert "fix the path" in report["drop_rules"]["missing_file"]
    assert json.loads(layout.prepare_report.read_text())["sources"] == report["sources"]
    fm = evalsets.load_eval_set(layout.eval_set("fashion_mnist"))
    assert fm["images"].shape == (10, 28, 28, 3) and fm["images"].dtype == np.uint8
    assert fm["labels"].tolist() == [0, 1, 2, 3, 4, 5, 0, 1, 2, 3]
    assert fm["split"].tolist() == ["train"] * 6 + ["test"] * 4
    assert np.array_equal(fm["images"][..., 0], fm["images"][..., 2])
    assert report["eval_sets"]["digits"] == {"train": 1257, "test": 540, "classes": 10, "height": 32}
    out = capsys.readouterr().out
    assert "tuxpaint" in out and "total" in out


def test_the_stage_reads_its_section_and_the_paths_and_hands_on_no_project_config(world, monkeypatch):
    """run_prepare reads of the project config only what PrepareProject names (the prepare section, the paths),
    and the work (prepare_corpus) gets the section and the layout, never the config."""
    import protoclip.data.stage as stage
    from protoclip.data.config import PrepareProject

    cfg, layout = world
    watched = WatchedConfig(cfg)
    handed: list[tuple] = []

    def spy(*args, **kwargs):
        handed.append((*args, *kwargs.values()))
        return prepare.prepare_corpus(*args, **kwargs)
    monkeypatch.setattr(stage, "prepare_corpus", spy)
    report = stage.run_prepare(watched)
    assert report["total"] == {"kept": 6, "dropped": 7}
    members = protocol_members(PrepareProject)
    assert watched.read and watched.read <= members, watched.read - members
    (section, where), = handed
    assert section is cfg.prepare and isinstance(where, Layout)
    assert (where.data_dir, where.results_dir) == (layout.data_dir, layout.results_dir)


def test_prepare_second_run_is_up_to_date(world, capsys, monkeypatch):
    cfg, layout = world
    first = run_prepare(cfg)
    mtime = layout.manifest.stat().st_mtime_ns

    def boom(*a, **k):
        raise AssertionError("a second run must not rebuild")
    monkeypatch.setattr(prepare, "build_offline_pairs", boom)
    capsys.readouterr()
    assert run_prepare(cfg) == first
    assert "up to date" in capsys.readouterr().out
    assert layout.manifest.stat().st_mtime_ns == mtime
    # a changed user-data file or config is not up to date
    csv = Path(cfg.prepare.user_data[0].path)
    csv.write_text(csv.read_text() + "u2.png,more\n")
    assert not prepare.is_up_to_date(cfg.prepare, layout)
    cfg.prepare.heldout_fraction = 0.5
    assert prepare.fingerprint(cfg.prepare, layout) != json.loads(layout.prepare_fingerprint.read_text())[
        "fingerprint"]


def test_config_rejects_bad_user_data_names():
    cfg = PrepareConfig(user_data=[UserDataConfig(name="emoji", format="csv", path="x.csv")])
    with pytest.raises(ValueError, match="user_data names"):
        cfg.validate()


def test_unusable_user_file_stops_before_anything_prepared_is_touched(world):
    from protoclip.errors import ConfigError
    cfg, layout = world
    run_prepare(cfg)
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in layout.prepared.rglob("*") if p.is_file()}
    csv = Path(cfg.prepare.user_data[0].path)
    csv.write_text("filepath,text\nu1.png,a blue square\n")  # the configured caption column is gone
    with pytest.raises(ConfigError, match=r"pairs.csv: user data 'mine': no column 'caption'"):
        run_prepare(cfg)
    after = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in layout.prepared.rglob("*") if p.is_file()}
    assert after == before  # manifest, report, fingerprint, rendered images: untouched


def test_stale_temp_files_of_killed_writes_are_cleaned_at_start(world):
    from protoclip.files.atomic import atomic_path, clean_stale_temps
    cfg, layout = world
    run_prepare(cfg)
    # what a write killed inside atomic_path leaves: make one for real, then "kill" it before the rename
    with pytest.raises(KeyboardInterrupt):
        with atomic_path(layout.manifest) as tmp:
            tmp.write_bytes(b"half")
            real_tmp = tmp
            raise KeyboardInterrupt
    assert not real_tmp.exists()  # the context manager itself cleans up an exception ...
    # ... but not a SIGKILL: simulate the leftovers of a killed process, in the folder and below it
    leftovers = [layout.prepared / ".manifest.parquet.a1b2c3d4.tmp.parquet",
                 layout.prepared / "images" / "tuxpaint" / ".cat.png.Zz9_x0yq.tmp.png",
                 layout.prepared / ".report.json.abcdefgh.tmp.json"]
    keep = [layout.prepared / ".hidden.tmp", layout.prepared / "notes.a1b2c3d4.tmp"]
    for path in leftovers + keep:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")
    from protoclip.files.atomic import TEMP_NAME
    assert TEMP_NAME.fullmatch(real_tmp.name)  # the pattern matches the names atomic_path really makes
    run_prepare(cfg)  # up to date, but the leftovers go
    assert not any(p.exists() for p in leftovers) and all(p.exists() for p in keep)
    assert clean_stale_temps(layout.prepared) == []


def test_reader_rules_version_rebuilds_user_data_only(world, monkeypatch):
    from protoclip.data.corpus import userdata
    cfg, layout = world
    with_user = prepare.fingerprint(cfg.prepare, layout)
    offline = PrepareConfig(**{**cfg.prepare.__dict__, "user_data": []})
    offline_fp = prepare.fingerprint(offline, layout)
    monkeypatch.setattr(userdata, "RULES_VERSION", userdata.RULES_VERSION + 1)
    assert prepare.fingerprint(cfg.prepare, layout) != with_user  # kept/dropped rows may differ: rebuild
    assert prepare.fingerprint(offline, layout) == offline_fp  # nothing to rebuild without user data


def test_replaced_image_behind_an_unchanged_csv_is_not_up_to_date(world, capsys):
    """The fingerprint covers the images a CSV names (size + mtime), not only the CSV."""
    cfg, layout = world
    run_prepare(cfg)
    assert prepare.is_up_to_date(cfg.prepare, layout)
    user = Path(cfg.prepare.user_data[0].path).parent
    make_png(user / "u2.png", "green", "triangle")  # same name, other picture; the CSV is untouched
    assert not prepare.is_up_to_date(cfg.prepare, layout)
    capsys.readouterr()
    run_prepare(cfg)
    assert "up to date" not in capsys.readouterr().out
    df = pd.read_parquet(layout.manifest).set_index("id")
    assert df.loc["mine/u2.png", "sha256"] == hashlib.sha256((user / "u2.png").read_bytes()).hexdigest()
    (user / "missing.png").write_bytes((user / "u2.png").read_bytes())  # a row's missing image appears
    assert not prepare.is_up_to_date(cfg.prepare, layout)


def test_prepare_killed_after_the_manifest_is_not_trusted(world, monkeypatch, capsys):
    """Killed between replacing the manifest and writing its fingerprint: a rerun with the earlier config
    must rebuild, not find the earlier fingerprint and trust the other config's manifest."""
    cfg, layout = world
    run_prepare(cfg)
    old = cfg.prepare.heldout_fraction
    cfg.prepare.heldout_fraction = 0.6

    def killed(*a, **k):
        raise KeyboardInterrupt  # stands for SIGKILL after write_manifest
    monkeypatch.setattr(prepare, "build_eval_sets", killed)
    with pytest.raises(KeyboardInterrupt):
        run_prepare(cfg)
    monkeypatch.undo()
    assert not layout.prepare_fingerprint.exists()
    cfg.prepare.heldout_fraction = old
    assert not prepare.is_up_to_date(cfg.prepare, layout)
    capsys.readouterr()
    run_prepare(cfg)
    assert "up to date" not in capsys.readouterr().out
    df = pd.read_parquet(layout.manifest)
    assert all(r.split == split_of(r.id, cfg.prepare.seed, old) for r in df.itertuples())
    assert prepare.is_up_to_date(cfg.prepare, layout)


def _reference_manifest(offline, user, seed, fraction, path, row_group=None):
    """What prepare wrote before it streamed: every pair in memory, deduplicate, split, one DataFrame, to_parquet."""
    from protoclip.data.loading.manifest import deduplicate, to_frame, write_manifest

    kept, dup_drops = deduplicate(offline + user)
    for pair in kept:
        pair.split = pair.split or split_of(pair.id, seed, fraction)
    if row_group is None:
        write_manifest(to_frame(kept), path)  # the writer prepare used
    else:
        to_frame(kept).to_parquet(path, index=False, row_group_size=row_group)
    return kept, dup_drops


@pytest.mark.parametrize("row_group", [None, 3])
def test_streamed_manifest_is_the_old_writers_bytes(world, monkeypatch, tmp_path, row_group):
    """The streamed, spilled, bucket-deduplicated manifest equals byte for byte what the in-memory writer wrote for
    the same input: offline sources, a CSV and webdataset shards, with duplicate ids across data sets (names 'x'
    and 'x/y') and duplicate images within and across them; with row_group 3 over several row groups."""
    import copy
    import io
    import tarfile

    from protoclip.data.corpus import dedup, userdata
    from protoclip.data.loading import manifest

    cfg, layout = world
    monkeypatch.setattr(dedup, "BLOCK", 4)  # spread the keys over many flushes
    monkeypatch.setattr(userdata, "CSV_BATCH", 2)  # several batches a source
    if row_group:
        monkeypatch.setattr(manifest, "ROW_GROUP", row_group)
    user = Path(cfg.prepare.user_data[0].path).parent
    make_png(user / "y" / "u1.png", "blue", "square")  # the bytes of u1.png: a duplicate image
    (user / "x.csv").write_text("filepath,caption\ny/u1.png,a blue square\nu2.png,other caption\n")
    (user / "y" / "xy.csv").write_text("filepath,caption\nu1.png,the id of x's first row\n")
    make_png(user / "y" / "u3.png", "purple", "circle")
    (user / "y" / "u4.png").write_bytes((user / "y" / "u3.png").read_bytes())
    (user / "y" / "more.csv").write_text("filepath,caption\nu3.png,purple\nu4.png,purple\n")
    with tarfile.open(user / "s.tar", "w") as tar:
        for key, img, cap in (("k1", "u2.png", b"a yellow cross"), ("k2", "y/u3.png", b"purple again"),
                              ("k3", "y/u1.png", b"a blue square"), ("k4", "u2.png", b"yellow")):
            for name, data in ((f"{key}.png", (user / img).read_bytes()), (f"{key}.txt", cap)):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    cfg.prepare.user_data += [UserDataConfig(name="x", format="csv", path=str(user / "x.csv")),
                              UserDataConfig(name="x/y", format="csv", path=str(user / "y" / "xy.csv")),
                              UserDataConfig(name="more", format="csv", path=str(user / "y" / "more.csv"),
                                             split="heldout"),
                              UserDataConfig(name="shards", format="wds", path=str(user / "s.tar"))]
    captured = {}
    build = prepare.build_offline_pairs

    def keep_offline(*a, **k):
        out = build(*a, **k)
        captured["offline"] = copy.deepcopy(out)  # before prepare adds its duplicate counts to the drops
        return out
    monkeypatch.setattr(prepare, "build_offline_pairs", keep_offline)
    report = run_prepare(cfg)
    offline, offline_drops = captured["offline"]
    user_pairs, user_drops = [], {}
    for u in cfg.prepare.user_data:
        pairs, user_drops[u.name] = userdata.scan_user_data(u)
        user_pairs += pairs
    kept, dup_drops = _reference_manifest(offline, user_pairs, cfg.prepare.seed, cfg.prepare.heldout_fraction,
                                          tmp_path / "reference.parquet", row_group)
    assert all(dup_drops.get(s) for s in ("x/y", "more", "shards"))  # the fixture exercises each kind of duplicate
    assert layout.manifest.read_bytes() == (tmp_path / "reference.parquet").read_bytes()
    import pyarrow.parquet as pq
    assert pq.ParquetFile(layout.manifest).metadata.num_row_groups == (1 if row_group is None else -(-len(kept) // 3))
    for src, counts in {**offline_drops, **user_drops}.items():
        assert report["sources"][src]["dropped"] == dict(sorted((counts + dup_drops.get(src, Counter())).items()))
    assert report["total"]["kept"] == len(kept)
    assert not layout.prepare_scratch.exists()  # the spill is removed


def test_empty_manifest_is_the_old_writers_bytes(tmp_path):
    from protoclip.data.loading.manifest import ManifestWriter, to_frame, write_manifest
    write_manifest(to_frame([]), tmp_path / "old.parquet")
    with ManifestWriter(tmp_path / "new.parquet"):
        pass
    assert (tmp_path / "new.parquet").read_bytes() == (tmp_path / "old.parquet").read_bytes()
    with pytest.raises(KeyboardInterrupt), ManifestWriter(tmp_path / "cut.parquet"):
        raise KeyboardInterrupt
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.parquet", "old.parquet"]  # nothing of the cut write


def test_max_pairs_keeps_a_seeded_subset_independent_of_order(tmp_path):
    """A capped user data set keeps the max_pairs of its (de-duplicated) pairs with the smallest hash of
    ("subset/<id>", seed), computed here independently: the same pairs whatever the CSV's row order, a larger cap
    a superset, the rest counted as over_max_pairs; an uncapped set beside it keeps everything."""
    from protoclip.data.corpus.split import split_score

    user = tmp_path / "user"
    names = [f"img{i:02d}.png" for i in range(12)]
    for i, n in enumerate(names):
        make_png(user / n, ["red", "blue", "green", "yellow"][i % 4], ["circle", "square", "cross"][i % 3], 8 + i)
    (user / "dup.png").write_bytes((user / names[0]).read_bytes())
    for i in range(3):
        make_png(user / f"w{i}.png", "red", "circle", 30 + i)  # sizes no capped image has

    def project(order, cap, seed=3):
        rows = [f"{n},caption {n}" for n in order] + [f"dup.png,caption {names[0]}"]  # a duplicate pair: dropped
        (user / "pairs.csv").write_text("filepath,caption\n" + "\n".join(rows) + "\n")
        (user / "other.csv").write_text("filepath,caption\n" + "\n".join(f"w{i}.png,other {i}" for i in range(3)) + "\n")
        root = tmp_path / f"p{len(list(tmp_path.iterdir()))}"
        return ProjectConfig(paths=PathsConfig(data_dir=root / "data", results_dir=root / "results"),
                             prepare=PrepareConfig(image_size=8, num_workers=1, seed=seed, offline_sources=[],
                                                   eval_sets=[], heldout_fraction=0.0, user_data=[
                                                       UserDataConfig(name="capped", format="csv", max_pairs=cap,
                                                                      path=str(user / "pairs.csv")),
                                                       UserDataConfig(name="whole", format="csv",
                                                                      path=str(user / "other.csv"))]))

    def kept(cfg):
        report = run_prepare(cfg)
        df = pd.read_parquet(Layout.from_config(cfg).manifest)
        return set(df[df["source"] == "capped"]["id"]), set(df[df["source"] == "whole"]["id"]), report

    ids = [f"capped/{n}" for n in names]
    want5 = set(sorted(ids, key=lambda i: split_score(f"subset/{i}", 3))[:5])
    got5, whole, report = kept(project(names, 5))
    assert got5 == want5 and len(whole) == 3
    assert report["sources"]["capped"] == {"kept": 5, "dropped": {"duplicate_pair": 1, "over_max_pairs": 7}}
    assert kept(project(list(reversed(names)), 5))[0] == want5  # row order does not matter
    got8 = kept(project(names, 8))[0]
    assert len(got8) == 8 and want5 < got8  # nested
    assert kept(project(names, 50))[0] == set(ids)  # a cap above the set: every pair
    assert kept(project(names, 5, seed=4))[0] != want5  # another seed, another subset (known for these ids)
    with pytest.raises(ValueError, match="max_pairs"):
        PrepareConfig(user_data=[UserDataConfig(name="x", format="csv", path="x.csv", max_pairs=0)]).validate()


def test_a_corpus_the_user_has_not_got_is_skipped_and_the_others_prepared(tmp_path, caplog):
    """The paper config names every corpus; a clone with some of them prepares those and skips the others (their
    runs are skipped, ProjectConfig.runs_without_data): an absent CSV as an absent set of shards."""
    user = tmp_path / "user"
    for i in range(3):
        make_png(user / f"w{i}.png", "red", "circle", 30 + i)
    (user / "pairs.csv").write_text("filepath,caption\n" + "\n".join(f"w{i}.png,a red circle {i}" for i in range(3)))
    cfg = ProjectConfig(paths=PathsConfig(data_dir=tmp_path / "data", results_dir=tmp_path / "results"),
                        prepare=PrepareConfig(image_size=8, num_workers=1, offline_sources=[], eval_sets=[],
                                              heldout_fraction=0.0, user_data=[
                                                  UserDataConfig(name="have", format="csv", path=str(user / "pairs.csv")),
                                                  UserDataConfig(name="imagenet", format="csv",
                                                                 path=str(tmp_path / "absent" / "train.csv")),
                                                  UserDataConfig(name="shards", format="wds",
                                                                 path=str(tmp_path / "absent" / "{0..1}.tar"))]))
    with caplog.at_level("WARNING"):
        run_prepare(cfg)
    df = pd.read_parquet(Layout.from_config(cfg).manifest)
    assert sorted(df["id"]) == [f"have/w{i}.png" for i in range(3)]
    assert any("user data 'imagenet' skipped: imagenet: no file of" in r.getMessage() for r in caplog.records)
    cfg.prepare.user_data = cfg.prepare.user_data[1:]  # nothing there to prepare: the absence is an error
    with pytest.raises(FileNotFoundError, match="train.csv"):
        run_prepare(cfg)
