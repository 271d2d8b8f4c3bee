"""Rendering: alpha onto white, aspect-preserving square fit, bad files -> drop reasons (never raises), SVGs with text
dropped, the same bytes from a process pool as in one process."""
from __future__ import annotations

import hashlib
from pathlib import Path

from PIL import Image

from protoclip.data.corpus.images import Candidate, fit_square, render_all, render_candidate, to_rgb_on_white
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


SVG = '<svg xmlns="http://www.w3.org/2000/svg" xmlns:svg="http://www.w3.org/2000/svg" width="10" height="10">{}</svg>'


def test_svg_text_dropped_before_rendering(tmp_path):
    """Text elements (any namespace prefix, flowed text too) make an SVG's pixels depend on the machine's fonts and
    on what the process drew before: such SVGs are dropped; a shape whose id or attribute says "text" is not."""
    bodies = {"plain": ('<text x="1" y="9">A</text>', "svg_text"),
              "prefixed": ('<svg:text x="1" y="9">A</svg:text>', "svg_text"),
              "empty": ("<text/>", "svg_text"),
              "flowed": ("<flowRoot><flowPara>A</flowPara></flowRoot>", "svg_text"),
              "shape": ('<rect id="text" class="textual" width="10" height="10" fill="#00f"/>', ""),
              "attribute": ('<path d="M0 0h10" data-text="x" stroke="#000"/>', "")}
    cands = []
    for name, (body, _) in bodies.items():
        (tmp_path / f"{name}.svg").write_text(SVG.format(body))
        cands.append(cand(tmp_path / f"{name}.svg", "svg", f"t/{name}"))
    results = render_all(cands, tmp_path / "out", 8, num_workers=1)
    assert {r.id: r.reason for r in results} == {f"t/{n}": reason for n, (_, reason) in bodies.items()}
    assert not (tmp_path / "out/t/plain.png").exists()


def test_pool_renders_the_same_bytes_as_one_process(tmp_path):
    """prepare renders in a process pool that hands out chunks in a different order each run: the bytes must not
    depend on it (40 SVG drawings, 2 workers, twice, against one process)."""
    shapes = ['<circle cx="{a}" cy="{b}" r="{c}" fill="#{d:02x}80{a:02x}" stroke="#000" stroke-width="0.{b}"/>',
              '<path d="M{a} {b} L{c} 9 Q 5 {d} 1 1 Z" fill="#{d:02x}{d:02x}40"/>']
    cands = []
    for i in range(40):
        body = shapes[i % 2].format(a=i % 7 + 1, b=i % 5 + 2, c=i % 3 + 1, d=(37 * i) % 256)
        (tmp_path / f"{i}.svg").write_text(SVG.format(body))
        cands.append(cand(tmp_path / f"{i}.svg", "svg", f"t/{i}"))
    one = {r.id: r.sha256 for r in render_all(cands, tmp_path / "one", 16, num_workers=1)}
    for run in range(2):
        pooled = {r.id: r.sha256 for r in render_all(cands[::-1] if run else cands, tmp_path / f"pool{run}", 16,
                                                     num_workers=2)}
        assert pooled == one
    assert len(set(one.values())) > 30 and "" not in one.values()
