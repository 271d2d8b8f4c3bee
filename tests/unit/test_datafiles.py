"""Every Parquet / NPZ file one stage writes and another reads: empty, cut short or foreign, it is one line naming
the file and the stage that writes it (a DataFileError: exit 2 through the CLI), for every reader of it."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from protoclip.data.corpus.evalsets import load_eval_set, save_eval_set
from protoclip.data.loading.manifest import (Pair, manifest_batches, manifest_sources, read_manifest, to_frame,
                                             write_manifest)
from protoclip.files.datafiles import DataFileError
from protoclip.errors import UserError
from protoclip.teacher.cache import aligned_features, load_teacher_features


def _damage(path: Path, kind: str) -> None:
    data = path.read_bytes()
    path.write_bytes({"empty": b"", "cut": data[: len(data) // 2], "text": b"filepath,caption\na.png,x\n",
                      "tail": data[:-9]}[kind])


def _manifest(path: Path) -> Path:
    pairs = [Pair(f"s/{i}", f"{i}.png", f"caption {i}", "s", "", f"{i:064x}", split="train") for i in range(50)]
    return write_manifest(to_frame(pairs), path)


READERS = {
    "read_manifest": lambda p: read_manifest(p),
    "read_manifest_columns": lambda p: read_manifest(p, ["id", "split"], [("split", "==", "train")]),
    "manifest_batches": lambda p: list(manifest_batches(p, ["id", "caption"])),
    "manifest_sources": manifest_sources,
}
KINDS = ["empty", "cut", "text", "tail"]


def _one_line(err: BaseException, path: Path, stage: str) -> str:
    msg = str(err)
    assert isinstance(err, DataFileError) and isinstance(err, UserError)  # the CLI's exit 2, no traceback
    assert msg.startswith(f"{path}") and stage in msg and "\n" not in msg, msg
    return msg


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("kind", KINDS)
def test_a_broken_manifest_is_one_line_for_every_reader(tmp_path, reader, kind):
    path = _manifest(tmp_path / "manifest.parquet")
    assert len(read_manifest(path)) == 50 and manifest_sources(path) == ["s"]  # whole, every reader reads it
    _damage(path, kind)
    with pytest.raises(DataFileError) as err:
        READERS[reader](path)
    msg = _one_line(err.value, path, "`protoclip prepare`")
    assert ("(0 bytes)" in msg) == (kind == "empty")


def test_a_missing_manifest_still_says_to_prepare(tmp_path):
    for read in READERS.values():
        with pytest.raises(FileNotFoundError, match="run `protoclip prepare` first"):
            read(tmp_path / "none.parquet")


@pytest.mark.parametrize("kind", KINDS)
def test_a_broken_evaluation_set_npz_is_one_line(tmp_path, kind):
    path = tmp_path / "digits.npz"
    save_eval_set(path, {"images": np.zeros((4, 8, 8, 3), np.uint8), "labels": np.array([0, 1, 0, 1]),
                         "split": np.array(["train", "train", "test", "test"]), "classnames": np.array(["a", "b"])})
    assert len(load_eval_set(path)["labels"]) == 4
    _damage(path, kind)
    with pytest.raises(DataFileError) as err:
        load_eval_set(path)
    _one_line(err.value, path, "`protoclip prepare`")


@pytest.mark.parametrize("kind", KINDS)
def test_a_broken_teacher_cache_is_one_line_for_both_readers(tmp_path, kind):
    path = tmp_path / "teacher.npz"
    ids = np.array([f"s/{i}" for i in range(20)])
    feats = np.random.default_rng(0).standard_normal((20, 4)).astype(np.float32)
    np.savez(path, ids=ids, features=feats)
    np.testing.assert_array_equal(aligned_features(path, list(ids[::3])), feats[::3])
    _damage(path, kind)
    for read in (load_teacher_features, lambda p: aligned_features(p, list(ids[::3]))):
        with pytest.raises(DataFileError) as err:
            read(path)
        _one_line(err.value, path, "`protoclip teacher`")
