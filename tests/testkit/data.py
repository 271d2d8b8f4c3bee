"""Data fixtures made by the tests: drawn PNGs, openclipart-style SVG metadata, random webdataset shards."""
from __future__ import annotations

import io
import random
import tarfile
from pathlib import Path

from PIL import Image, ImageDraw

COLORS = {"red": (220, 30, 30), "green": (30, 180, 60), "blue": (40, 60, 220), "yellow": (230, 210, 20),
          "purple": (140, 40, 160)}
SHAPES = ("circle", "square", "triangle", "cross")


def make_png(path: Path, color: str, shape: str, size: int = 32) -> Path:
    img = Image.new("RGB", (size, size), (255, 255, 255))
    d = ImageDraw.Draw(img)
    m, c = size // 6, COLORS[color]
    box = (m, m, size - m, size - m)
    if shape == "circle":
        d.ellipse(box, fill=c)
    elif shape == "square":
        d.rectangle(box, fill=c)
    elif shape == "triangle":
        d.polygon([(size // 2, m), (size - m, size - m), (m, size - m)], fill=c)
    else:
        d.rectangle((size // 2 - m // 2, m, size // 2 + m // 2, size - m), fill=c)
        d.rectangle((m, size // 2 - m // 2, size - m, size // 2 + m // 2), fill=c)
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path, format="PNG")
    return path


def svg(title: str, keywords=(), creator: str = "Jane Doe", licence: str = "http://web.resource.org/cc/PublicDomain",
        body: str = '<rect width="10" height="10" fill="red"/>') -> str:
    lis = "".join(f"<rdf:li>{k}</rdf:li>" for k in keywords)
    return f"""<?xml version="1.0"?>
<svg xmlns="http://www.w3.org/2000/svg" width="20" height="10"><metadata>
<rdf:RDF xmlns:cc="http://web.resource.org/cc/" xmlns:dc="http://purl.org/dc/elements/1.1/"
 xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#"><cc:Work rdf:about="">
<dc:title>{title}</dc:title><dc:subject><rdf:Bag>{lis}</rdf:Bag></dc:subject>
<dc:creator><cc:Agent><dc:title>{creator}</dc:title></cc:Agent></dc:creator>
<cc:license rdf:resource="{licence}"/></cc:Work></rdf:RDF></metadata>{body}</svg>"""


def add_member(tar: tarfile.TarFile, name: str, data: bytes, kind: bytes = tarfile.REGTYPE) -> None:
    info = tarfile.TarInfo(name)
    info.type = kind
    if kind == tarfile.REGTYPE:
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    else:
        info.linkname = "0001.png"
        tar.addfile(info)


def make_shard(rng: random.Random, path: Path, images: dict[str, bytes]) -> tuple[int, set[str]]:
    """A random shard; returns its number of samples (distinct keys of regular-file members) and the keys
    that repeat a (key, extension) member (ambiguous samples that must not be kept)."""
    keys = ["0001", "0002", "sub/0003", "a.b/0004", "./0005", "0006"]
    exts = ["png", "jpg", "jpeg", "webp", "txt", "json", "cls", "", "tar.gz", "PNG", "TXT"]
    captions = [b"a red circle", b"", b"  ", b"\xff\xfe", "caf\u00e9".encode(), b"x" * 600_000, b"\x00"]
    regular_keys, members, repeated = set(), set(), set()
    with tarfile.open(path, "w") as tar:
        for _ in range(rng.randint(0, 14)):
            key, ext = rng.choice(keys), rng.choice(exts)
            name = f"{key}.{ext}" if ext else key
            r = rng.random()
            if r < 0.06:
                add_member(tar, name, b"", tarfile.SYMTYPE)
                continue
            if r < 0.1:
                add_member(tar, name + "_dir", b"", tarfile.DIRTYPE)
                continue
            data = rng.choice(captions) if ext.lower() in ("txt", "json", "cls") else images[rng.choice(list(images))]
            add_member(tar, name, data)
            folder, _, base = name.rpartition("/")
            stem, _, member_ext = base.partition(".")
            key = f"{folder}/{stem}" if folder else stem
            if (key, member_ext.lower()) in members:
                repeated.add(key)
            members.add((key, member_ext.lower()))
            regular_keys.add(key)
    return len(regular_keys), repeated
