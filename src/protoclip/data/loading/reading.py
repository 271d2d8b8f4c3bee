"""Reading one manifest image: a plain file or a ``<shard.tar>::<member>`` webdataset member (no torch import,
so that light stages such as ``protoclip collect`` start fast).

An image that cannot be read as it was prepared stops the stage with one line (:class:`ImageReadError` says why).
"""
from __future__ import annotations

import collections
import hashlib
import io
import os
import tarfile

from PIL import Image

from protoclip.errors import ConfigError

SEP = "::"  # manifest path of a tar member: <shard.tar>::<member>
MAX_OPEN_SHARDS = 64  # open shard files kept per process (least recently used closed first)


class ImageReadError(ConfigError):
    """An image the manifest (or an evaluation set) names cannot be read as it was when prepared.

    Bad images (our choice, the same for every stage that reads prepared data: training, episode extraction,
    evaluation of file / shard sets): an image that is gone, cut, undecodable or, when its ``sha256`` is given,
    changed since ``prepare`` stops the stage with one line naming the file (a ``ConfigError``: exit 2). Skipping
    it would silently change what the run trains or is scored on (and the seeded episode draws), and prepare
    already dropped every image that was bad when it ran.

    The message is one line naming the file. A DataLoader worker's exception reaches the main process
    re-created from ``"Caught ... Original Traceback ...\\n<Class>: <message>"``; only our own last line is
    kept, so the CLI still prints one line.
    """

    kind = "data error"  # what the CLI prints before the message (the image, not the config, is wrong)

    def __init__(self, msg: str) -> None:
        line = str(msg).strip().splitlines()[-1] if str(msg).strip() else str(msg)
        prefix = f"{__name__}.{type(self).__name__}: "
        super().__init__(line[len(prefix):] if line.startswith(prefix) else line)


class TarCache:
    """Open shard files and lazily built member indexes, per process.

    A tar member is read with one ``os.pread`` at the byte offset ``prepare`` stored in the manifest (``offset`` /
    ``size`` columns), so reading never lists the tar. Without an offset (a frame without those columns, an
    evaluation set's shard) the shard's member offsets are indexed once per process, lazily, by one pass over its
    headers. Open shards are kept per process (a DataLoader worker gets its own after fork/spawn), at most
    ``MAX_OPEN_SHARDS`` at a time.
    """

    def __init__(self) -> None:
        self.pid: int | None = None
        self.fds: collections.OrderedDict[str, int] = collections.OrderedDict()
        self.index: dict[str, dict[str, tuple[int, int]]] = {}

    def _fd(self, shard: str) -> int:
        if self.pid != os.getpid():  # forked: the parent's descriptors share a file position; start afresh
            self.pid, self.fds, self.index = os.getpid(), collections.OrderedDict(), {}
        fd = self.fds.get(shard)
        if fd is None:
            while len(self.fds) >= MAX_OPEN_SHARDS:
                os.close(self.fds.popitem(last=False)[1])
            fd = self.fds[shard] = os.open(shard, os.O_RDONLY)
        else:
            self.fds.move_to_end(shard)
        return fd

    def member_index(self, shard: str) -> dict[str, tuple[int, int]]:
        """``{member name: (data offset, size)}`` of a shard's regular files (one header pass, cached)."""
        self._fd(shard)
        idx = self.index.get(shard)
        if idx is None:
            idx = {}
            with tarfile.open(shard) as tar:
                while True:  # member by member: a shard cut after prepare still serves what precedes the cut
                    try:
                        m = tar.next()
                    except (tarfile.TarError, OSError, EOFError):
                        break
                    if m is None:
                        break
                    if m.isfile():
                        idx[m.name] = (m.offset_data, m.size)
            self.index[shard] = idx
        return idx

    def read(self, shard: str, member: str, offset: int = -1, size: int = -1) -> bytes:
        """The bytes of ``member`` (at ``offset`` / ``size`` when known)."""
        if offset < 0:
            try:
                offset, size = self.member_index(shard)[member]
            except KeyError:
                raise FileNotFoundError(f"{shard}{SEP}{member}") from None
        data = os.pread(self._fd(shard), size, offset)
        if len(data) != size:
            raise EOFError(f"{shard}{SEP}{member}: shard ends before the member does (cut since prepare?)")
        return data

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()

    def __getstate__(self) -> dict:  # a pickled dataset (spawned worker) opens its own files
        return {"pid": None, "fds": collections.OrderedDict(), "index": {}}


def read_bytes(path: str, tars: TarCache | None = None, offset: int = -1, size: int = -1) -> bytes:
    """The stored bytes of a manifest path (file or ``shard.tar::member``)."""
    if SEP in path:
        shard, member = path.split(SEP, 1)
        return (tars or TarCache()).read(shard, member, offset, size)
    with open(path, "rb") as f:
        return f.read()


def read_image(path: str, tars: TarCache | None = None, offset: int = -1, size: int = -1,
               sha256: str | None = None) -> Image.Image:
    """Open a manifest path (file or ``shard.tar::member``) as an RGB PIL image.

    ``sha256`` (the manifest's hash of the image bytes): the bytes read must have it. Any failure raises
    :class:`ImageReadError` naming the path (its docstring says why nothing is skipped).

        img = read_image("/data/cc3m/00000.tar::000000001.jpg", TarCache())                 # RGB PIL image
        img = read_image(path, tars, offset=1536, size=2113, sha256=row_sha)   # manifest offsets: one pread
    """
    return decode_image(read_checked(path, tars, offset, size, sha256), path)


def read_checked(path: str, tars: TarCache | None = None, offset: int = -1, size: int = -1,
                 sha256: str | None = None) -> bytes:
    """:func:`read_image`'s bytes before decoding: read, and checked against ``sha256`` when given."""
    try:
        data = read_bytes(path, tars, offset, size)
    except (OSError, EOFError, tarfile.TarError) as err:
        # a manifest path (it carries its sha256) was readable when prepare ran; an evaluation set's own file
        # (image folder, COCO) was never prepared, so the only advice is to restore it
        hint = ("it was readable when `protoclip prepare` ran: restore it or rerun prepare" if sha256
                else "restore it")
        raise ImageReadError(f"{path}: cannot read the image ({type(err).__name__}: {err}); {hint}") from None
    if sha256 and hashlib.sha256(data).hexdigest() != sha256:
        raise ImageReadError(f"{path}: the image changed since `protoclip prepare` (sha256 differs from the "
                             "manifest's); rerun prepare")
    return data


def decode_image(data: bytes, path: str) -> Image.Image:
    """Image bytes -> RGB PIL image; bytes that do not decode raise :class:`ImageReadError` naming ``path``."""
    try:
        img = Image.open(io.BytesIO(data))
        img.load()
        return img.convert("RGB")
    except Exception as err:  # noqa: BLE001  PIL raises many types for a bad file; all mean "cannot decode"
        raise ImageReadError(f"{path}: cannot decode the image ({type(err).__name__}: {err})") from None


__all__ = ["SEP", "MAX_OPEN_SHARDS", "ImageReadError", "TarCache", "decode_image", "read_bytes", "read_checked",
           "read_image"]
