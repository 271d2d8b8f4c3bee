"""Pinned Debian packages: download (``apt-get download NAME=VERSION``), verify sha256, unpack.

The offline default data (caption corpora, emoji font, Fashion-MNIST) comes from Debian's archive, each package
pinned by name, version and sha256 (``PINNED``; see shared/docs/offline-data.md). Work already done is skipped.
"""
from __future__ import annotations

import json
import logging
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from protoclip.files.atomic import write_json, write_text
from protoclip.errors import UserError
from protoclip.files.hashing import sha256_file
from protoclip.files.layout import Layout

log = logging.getLogger(__name__)

MARKER = ".unpacked"  # file inside layout.unpacked/<package>/ holding the sha256 of the unpacked .deb


class PackageHashError(UserError, RuntimeError):
    """A downloaded package's sha256 differs from the pinned one (raised only with strict hashes)."""

    kind = "package error"  # one line through the CLI: the download, not the code, is wrong


@dataclass(frozen=True)
class PinnedDeb:
    name: str
    version: str
    sha256: str

    @property
    def spec(self) -> str:
        return f"{self.name}={self.version}"

    @property
    def filename(self) -> str:
        # apt-get download writes the epoch colon URL-encoded: openclipart-svg_1%3a0.18+dfsg-19_all.deb
        return f"{self.name}_{self.version.replace(':', '%3a')}_all.deb"


# each package's sha256 when the data recipe was written; a mismatch warns and is recorded (see ensure_deb)
PINNED: dict[str, PinnedDeb] = {p.name: p for p in [
    PinnedDeb("tuxpaint-stamps-default", "2022.06.04-1",
              "6db6c1bfc870a47f1499d6203b083522eacb57c5f9c87d468f2e92eb6d9d5f34"),
    PinnedDeb("openclipart-svg", "1:0.18+dfsg-19",
              "989712d90d57dfa3230049f553bb43b76c30ee4d4b8c5f6e106e33f7db5cbdc5"),
    PinnedDeb("fonts-noto-color-emoji", "2.042-0+deb12u1",
              "a5ab0f69c7938423862320d9aca5dd187b3fd879d6a9a57dd52e17c3fa8d2751"),
    PinnedDeb("unicode-data", "15.0.0-1",
              "5efef23bbb1c6a133ecbdd63a2cfa07159ccacf5466a49e2426101c5ecd691fc"),
    PinnedDeb("unicode-cldr-core", "41-0.1",
              "35d30d5d3bee4d8244e95236259c4c2a0db06e21bad696515751fcfeee4d0260"),
    PinnedDeb("dataset-fashion-mnist", "0.0~git20200523.55506a9-1",
              "39e172fe32dd318ebb3e512220c3beea2fa47d7e20bab348fb4e0922d6beefc0"),
    # not in offline-data.md: the English word list behind the openclipart non-English-title rule
    PinnedDeb("wamerican", "2020.12.07-2",
              "c8f8e2b2ad0d37bfdd41f0e40f1e4c8e5f907467d768a1d3698b164e9617f0b4"),
]}

# which packages each offline source / eval set needs
SOURCE_PACKAGES: dict[str, list[str]] = {
    "tuxpaint": ["tuxpaint-stamps-default"],
    "openclipart": ["openclipart-svg", "wamerican"],
    "emoji": ["fonts-noto-color-emoji", "unicode-data", "unicode-cldr-core"],
    "fashion_mnist": ["dataset-fashion-mnist"],
    "digits": [],  # scikit-learn ships it
}


def recorded_hashes(layout: Layout) -> dict[str, str]:
    """{package name: sha256 recorded at a mismatch}; empty when every package matched its pin."""
    p = layout.deb_hashes
    return json.loads(p.read_text()) if p.exists() else {}


def expected_hashes(layout: Layout, names: list[str]) -> dict[str, str]:
    """The hash each package is expected to have now (recorded override, else the pin)."""
    rec = recorded_hashes(layout)
    return {n: rec.get(n, PINNED[n].sha256) for n in names}


def apt_download(pkg: PinnedDeb, dest: Path) -> Path:
    """``apt-get download NAME=VERSION`` into ``dest``; runs ``apt-get update`` once if apt cannot locate it."""
    dest.mkdir(parents=True, exist_ok=True)

    def _get() -> subprocess.CompletedProcess:
        return subprocess.run(["apt-get", "download", pkg.spec], cwd=dest, capture_output=True, text=True)

    res = _get()
    err = res.stderr.lower()
    if res.returncode != 0 and ("unable to locate" in err or "was not found" in err or "can't find" in err):
        log.info("apt-get cannot locate %s; running apt-get update once", pkg.spec)
        subprocess.run(["apt-get", "update"], capture_output=True, text=True)
        res = _get()
    if res.returncode != 0:
        raise RuntimeError(f"apt-get download {pkg.spec} failed (exit {res.returncode}): {res.stderr.strip()}")
    out = dest / pkg.filename
    if not out.exists():
        raise RuntimeError(f"apt-get download {pkg.spec} did not produce {out}")
    return out


def ensure_deb(name: str, layout: Layout, strict: bool = False,
               download: Callable[[PinnedDeb, Path], Path] = apt_download) -> tuple[Path, str]:
    """The verified ``.deb`` of package ``name`` in ``layout.debs`` and its sha256.

    A cached file whose hash equals the pin (or a hash recorded at an earlier mismatch) is reused.
    On a mismatch: ``strict`` raises :class:`PackageHashError`; otherwise warn and record the new hash in
    ``layout.deb_hashes``, since Debian point releases can replace a file. The prepare fingerprint includes that
    file, so the change re-runs the stage.
    """
    if name not in PINNED:
        raise KeyError(f"unknown package {name!r} (pinned: {', '.join(PINNED)})")
    pkg = PINNED[name]
    path = layout.deb(pkg.filename)
    # strict: only the pin counts, even if an earlier non-strict run recorded another hash
    accepted = {pkg.sha256} if strict else {pkg.sha256, recorded_hashes(layout).get(name)}
    if path.exists():
        digest = sha256_file(path)
        if digest in accepted:
            return path, digest
        log.info("cached %s has an unexpected hash; downloading again", path.name)
        path.unlink()
    path = download(pkg, layout.debs)
    digest = sha256_file(path)
    if digest != pkg.sha256:
        msg = f"{pkg.filename}: sha256 {digest} differs from the pinned {pkg.sha256}"
        if strict:
            raise PackageHashError(msg + " (prepare.strict_hashes is true)")
        log.warning("%s; recording the new hash (set prepare.strict_hashes to make this an error)", msg)
        rec = recorded_hashes(layout)
        rec[name] = digest
        write_json(layout.deb_hashes, rec)
    return path, digest


def ensure_unpacked(name: str, layout: Layout, strict: bool = False,
                    download: Callable[[PinnedDeb, Path], Path] = apt_download) -> Path:
    """``dpkg-deb -x`` package ``name`` into ``layout.unpacked/<name>`` unless its marker says it is done.

    The marker names the unpacked ``.deb``'s hash, so a folder of the same hash is not unpacked again.

        root = ensure_unpacked("openclipart-svg", layout, strict=False)   # -> data/raw/unpacked/openclipart-svg
    """
    root = layout.unpacked_package(name)
    marker = root / MARKER
    expected = PINNED[name].sha256 if strict else expected_hashes(layout, [name])[name]
    if marker.exists() and marker.read_text().strip() == expected:
        return root
    deb, digest = ensure_deb(name, layout, strict=strict, download=download)
    if marker.exists() and marker.read_text().strip() == digest:
        return root
    if root.exists():  # a different version was unpacked here: start clean
        shutil.rmtree(root)
    root.mkdir(parents=True, exist_ok=True)
    log.info("unpacking %s", deb.name)
    res = subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"dpkg-deb -x {deb} failed: {res.stderr.strip()}")
    write_text(marker, digest + "\n")
    return root


__all__ = ["PINNED", "SOURCE_PACKAGES", "PinnedDeb", "PackageHashError", "sha256_file", "recorded_hashes",
           "expected_hashes", "apt_download", "ensure_deb", "ensure_unpacked"]
