"""An atomic write reaches the disk in the order that survives a power cut: the temp file's data is synced before
the rename, the folder (the rename) after it. The real os.fsync runs; a spy records what each call synced and
whether the output had its new name yet (/proc/self/fd names the file behind a descriptor)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from protoclip.files.atomic import atomic_path, durable_replace, save_torch, write_json


@pytest.fixture
def synced(monkeypatch, tmp_path):
    calls: list[tuple[str, bool]] = []  # (path synced, did the output exist then)
    real = os.fsync

    def spy(fd):
        calls.append((os.readlink(f"/proc/self/fd/{fd}"), (tmp_path / "out.json").exists()))
        return real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    return calls


def test_file_synced_before_the_rename_and_the_folder_after(tmp_path, synced):
    write_json(tmp_path / "out.json", {"a": 1})
    assert (tmp_path / "out.json").read_text() == '{\n  "a": 1\n}\n'
    assert len(synced) == 2
    (file, existed_before), (folder, existed_after) = synced
    assert Path(file).parent == tmp_path and Path(file).name.startswith(".out.json.") and not existed_before
    assert folder == str(tmp_path) and existed_after


def test_a_failed_block_syncs_and_renames_nothing(tmp_path, synced):
    with pytest.raises(RuntimeError):
        with atomic_path(tmp_path / "out.json") as tmp:
            tmp.write_text("half")
            raise RuntimeError
    assert synced == [] and list(tmp_path.iterdir()) == []


def test_checkpoints_and_plain_replaces_are_synced_too(tmp_path, synced):
    save_torch(tmp_path / "last.pt", {"step": 3})
    (file, _), (folder, _) = synced
    assert Path(file).parent == tmp_path and Path(file).name.startswith(".last.pt.") and folder == str(tmp_path)
    synced.clear()
    (tmp_path / "frame.tmp.jpg").write_bytes(b"jpeg")
    durable_replace(tmp_path / "frame.tmp.jpg", tmp_path / "frame.jpg")
    assert [p for p, _ in synced] == [str(tmp_path / "frame.tmp.jpg"), str(tmp_path)]
    synced.clear()
    with atomic_path(tmp_path / "x.png", durable=False) as tmp:  # prepare's images: one sync for all at the end
        tmp.write_bytes(b"png")
    assert synced == [] and (tmp_path / "x.png").read_bytes() == b"png"
