"""Reading one manifest image: a plain file or a ``<shard.tar>::<member>`` webdataset member (no torch import,
so that light stages such as ``protoclip collect`` start fast).

    from protoclip.data.reading import read_image, TarCache
    img = read_image("/data/cc3m/00000.tar::000000001.jpg", TarCache())   # RGB PIL image

Tar members are read by random access through a per-process cache of open ``TarFile`` objects (their
member index is built once per shard and process; a DataLoader worker gets its own after fork/spawn).
"""
from __future__ import annotations

import io
import os
import tarfile

from PIL import Image

SEP = "::"  # manifest path of a tar member: <shard.tar>::<member>


class TarCache:
    """Open tar files per process (a DataLoader worker gets its own after fork/spawn)."""

    def __init__(self) -> None:
        self.pid = None
        self.tars: dict[str, tarfile.TarFile] = {}

    def read(self, shard: str, member: str) -> bytes:
        if self.pid != os.getpid():
            self.pid, self.tars = os.getpid(), {}
        tar = self.tars.get(shard)
        if tar is None:
            tar = self.tars[shard] = tarfile.open(shard)
        f = tar.extractfile(member)
        if f is None:
            raise FileNotFoundError(f"{shard}{SEP}{member}")
        return f.read()


def read_image(path: str, tars: TarCache | None = None) -> Image.Image:
    """Open a manifest path (file or ``shard.tar::member``) as an RGB PIL image."""
    if SEP in path:
        shard, member = path.split(SEP, 1)
        data = (tars or TarCache()).read(shard, member)
        img = Image.open(io.BytesIO(data))
    else:
        img = Image.open(path)
    img.load()
    return img.convert("RGB")


__all__ = ["SEP", "TarCache", "read_image"]
