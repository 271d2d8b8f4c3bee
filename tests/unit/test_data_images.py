"""Rendering: alpha onto white, aspect-preserving square fit, bad files -> drop reasons (never raises)."""
from __future__ import annotations

import hashlib
from pathlib import Path

from PIL import Image

from protoclip.data.images import Candidate, fit_square, render_all, render_candidate, to_rgb_on_white
from testkit.data import make_png


def cand(src: Path, kind: str = "raster", cid: str = "t/x") -> Candidate:
    return Candidate(id=cid, source="t", kind=kind, src=str(src), caption="c", label="", licence="")


def test_alpha_composited_on_white():
    img = Image.new("RGBA", (4, 4), (255, 0, 0, 0))
    img.putpixel((0, 0), (0, 0, 255, 128))
    rgb = to_rgb_on_white(img)
    assert rgb.mode == "RGB" and rgb.getpixel((1, 1)) == (255, 255, 255)
    r, g, b = rgb.getpixel((0, 0))  # 50% blue over white = (127, 127, 255)
    assert abs(r - 127) <= 1 and abs(g - 127) <= 1 and b == 255
    la = Image.new("LA", (2, 2), (0, 0))
    assert to_rgb_on_white(la).getpixel((0, 0)) == (255, 255, 255)


def test_fit_square_keeps_aspect_and_pads_white():
    img = Image.new("RGB", (40, 10), (0, 0, 0))
    sq = fit_square(img, 16)
    assert sq.size == (16, 16)
    assert sq.getpixel((8, 0)) == (255, 255, 255) and sq.getpixel((8, 8)) == (0, 0, 0)
    col = [sq.getpixel((8, y)) for y in range(16)]
    assert sum(p == (0, 0, 0) for p in col) == 4  # 10 px tall at scale 16/40 -> 4 rows


def test_render_candidate_reasons(tmp_path):
    good = make_png(tmp_path / "g.png", "red", "square", 20)
    (tmp_path / "empty.png").write_bytes(b"")
    data = good.read_bytes()
    (tmp_path / "trunc.png").write_bytes(data[: len(data) // 2])
    (tmp_path / "bad.svg").write_text("<svg")
    (tmp_path / "ok.svg").write_text('<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10">'
                                     '<rect width="10" height="10" fill="#00ff00"/></svg>')
    (tmp_path / "nosize.svg").write_text('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 10 10">'
                                         '<rect width="10" height="10" fill="#00ff00"/></svg>')
    out = tmp_path / "out"
    cases = {"g": (good, "raster", ""), "m": (tmp_path / "missing.png", "raster", "missing_file"),
             "e": (tmp_path / "empty.png", "raster", "empty_file"),
             "t": (tmp_path / "trunc.png", "raster", "undecodable_image"),
             "b": (tmp_path / "bad.svg", "svg", "undecodable_image"), "s": (tmp_path / "ok.svg", "svg", ""),
             "n": (tmp_path / "nosize.svg", "svg", "")}
    results = render_all([cand(p, k, f"t/{n}") for n, (p, k, _) in cases.items()], out, 12, num_workers=1)
    assert {r.id: r.reason for r in results} == {f"t/{n}": reason for n, (_, _, reason) in cases.items()}
    for r in results:
        if not r.reason:
            png = Path(r.path).read_bytes()
            assert hashlib.sha256(png).hexdigest() == r.sha256
            assert Image.open(r.path).size == (12, 12)
    assert Image.open(out / "t/s.png").getpixel((6, 6)) == (0, 255, 0)
    assert render_candidate(cand(good), str(out), 8).reason == ""
