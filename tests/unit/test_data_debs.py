"""Pinned packages: hash verification (warn vs strict), caching, unpack markers. No apt-get: fake downloads."""
from __future__ import annotations

import hashlib
import logging
import subprocess
from pathlib import Path

import pytest

from protoclip.data.corpus import debs
from protoclip.files.layout import Layout


def fake_download(payload: bytes, calls: list):
    def download(pkg: debs.PinnedDeb, dest: Path) -> Path:
        calls.append(pkg.name)
        dest.mkdir(parents=True, exist_ok=True)
        p = dest / pkg.filename
        p.write_bytes(payload)
        return p
    return download


@pytest.fixture
def pinned_fake(monkeypatch):
    payload = b"pretend .deb"
    pkg = debs.PinnedDeb("fake-pkg", "1:2.0-1", hashlib.sha256(payload).hexdigest())
    monkeypatch.setitem(debs.PINNED, "fake-pkg", pkg)
    return pkg, payload


def test_filename_encodes_epoch():
    assert debs.PINNED["openclipart-svg"].filename == "openclipart-svg_1%3a0.18+dfsg-19_all.deb"
    assert debs.PINNED["unicode-data"].spec == "unicode-data=15.0.0-1"


def test_matching_hash_downloads_once(tmp_path, pinned_fake):
    pkg, payload = pinned_fake
    layout, calls = Layout(tmp_path), []
    path, digest = debs.ensure_deb("fake-pkg", layout, download=fake_download(payload, calls))
    assert digest == pkg.sha256 and path.read_bytes() == payload
    debs.ensure_deb("fake-pkg", layout, download=fake_download(payload, calls))
    assert calls == ["fake-pkg"]  # cached file reused
    assert debs.recorded_hashes(layout) == {}


def test_mismatch_warns_and_records(tmp_path, pinned_fake, caplog):
    layout, calls = Layout(tmp_path), []
    other = b"a point release replaced it"
    with caplog.at_level(logging.WARNING, logger="protoclip.data.corpus.debs"):
        _, digest = debs.ensure_deb("fake-pkg", layout, download=fake_download(other, calls))
    assert digest == hashlib.sha256(other).hexdigest()
    assert "differs from the pinned" in caplog.text
    assert debs.recorded_hashes(layout) == {"fake-pkg": digest}
    assert debs.expected_hashes(layout, ["fake-pkg"]) == {"fake-pkg": digest}
    debs.ensure_deb("fake-pkg", layout, download=fake_download(other, calls))  # recorded hash accepted
    assert calls == ["fake-pkg"]
    with pytest.raises(debs.PackageHashError):  # ... but not under strict hashes
        debs.ensure_deb("fake-pkg", layout, strict=True, download=fake_download(other, calls))


def test_mismatch_strict_fails(tmp_path, pinned_fake):
    with pytest.raises(debs.PackageHashError, match="strict_hashes"):
        debs.ensure_deb("fake-pkg", Layout(tmp_path), strict=True, download=fake_download(b"other", []))
    assert debs.recorded_hashes(Layout(tmp_path)) == {}


def test_corrupt_cache_is_redownloaded(tmp_path, pinned_fake):
    pkg, payload = pinned_fake
    layout, calls = Layout(tmp_path), []
    layout.debs.mkdir(parents=True)
    (layout.debs / pkg.filename).write_bytes(b"half a fil")
    debs.ensure_deb("fake-pkg", layout, download=fake_download(payload, calls))
    assert calls == ["fake-pkg"]


def test_unknown_package(tmp_path):
    with pytest.raises(KeyError, match="unknown package"):
        debs.ensure_deb("nope", Layout(tmp_path))


def test_unpack_real_deb_and_marker(tmp_path, monkeypatch):
    """Build a real .deb with dpkg-deb, unpack it, and skip the second time."""
    src = tmp_path / "build"
    (src / "DEBIAN").mkdir(parents=True)
    (src / "DEBIAN/control").write_text("Package: tiny\nVersion: 1.0\nArchitecture: all\n"
                                        "Maintainer: t <t@t>\nDescription: t\n")
    (src / "usr/share/tiny").mkdir(parents=True)
    (src / "usr/share/tiny/hello.txt").write_text("hello\n")
    deb = tmp_path / "tiny.deb"
    if subprocess.run(["dpkg-deb", "--build", str(src), str(deb)], capture_output=True).returncode != 0:
        pytest.skip("dpkg-deb cannot build here")
    payload = deb.read_bytes()
    monkeypatch.setitem(debs.PINNED, "tiny", debs.PinnedDeb("tiny", "1.0", hashlib.sha256(payload).hexdigest()))
    layout, calls = Layout(tmp_path / "data"), []
    root = debs.ensure_unpacked("tiny", layout, download=fake_download(payload, calls))
    assert (root / "usr/share/tiny/hello.txt").read_text() == "hello\n"
    assert (root / debs.MARKER).read_text().strip() == hashlib.sha256(payload).hexdigest()
    (layout.debs / debs.PINNED["tiny"].filename).unlink()  # even without the .deb, the marker skips work
    debs.ensure_unpacked("tiny", layout, download=fake_download(payload, calls))
    assert calls == ["tiny"]


def test_apt_download_runs_update_once_when_unlocatable(tmp_path, monkeypatch):
    calls = []
    pkg = debs.PINNED["unicode-data"]

    def fake_run(cmd, cwd=None, capture_output=True, text=True):
        calls.append(cmd[1])
        if cmd[1] == "download" and calls.count("download") == 1:
            return subprocess.CompletedProcess(cmd, 100, "", "E: Unable to locate package unicode-data")
        if cmd[1] == "download":
            (Path(cwd) / pkg.filename).write_bytes(b"x")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(debs.subprocess, "run", fake_run)
    assert debs.apt_download(pkg, tmp_path).name == pkg.filename
    assert calls == ["download", "update", "download"]


def test_apt_download_failure_is_explained(tmp_path, monkeypatch):
    monkeypatch.setattr(debs.subprocess, "run",
                        lambda cmd, **k: subprocess.CompletedProcess(cmd, 100, "", "E: network down"))
    with pytest.raises(RuntimeError, match="apt-get download unicode-data=15.0.0-1 failed.*network down"):
        debs.apt_download(debs.PINNED["unicode-data"], tmp_path)
