"""Image rendering for the prepared corpus: raster / SVG / emoji -> square RGB PNG on white.

Every source builder (tuxpaint, openclipart, emoji) produces :class:`Candidate` records; :func:`render_all` turns
them into ``layout.prepared/images/<source>/...png`` files. A candidate that cannot be read or rendered is not
fatal: its result carries a drop reason that the prepare report counts.
"""
from __future__ import annotations

import hashlib
import io
import logging
import re
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Literal

from PIL import Image, ImageDraw, ImageFont
from tqdm import tqdm

from protoclip.files.atomic import atomic_path

log = logging.getLogger(__name__)

Kind = Literal["raster", "svg", "emoji"]
EMOJI_FONT_SIZE = 109  # the only bitmap strike of NotoColorEmoji's CBDT table (136x128 px glyphs)
# SVG text elements, dropped [svg_text]: cairo draws their glyphs with whatever font fontconfig substitutes for the
# one asked (clip art asks for fonts such as "Arial Black" that no package here ships), and the pixels then depend on
# the machine's fonts and on which texts the same process drew before (cairo's font caches; a process pool hands out
# the files in a different order each run), so the prepared corpus would differ from one run to the next. Detected
# by tag name in the bytes (``text``, ``flowRoot``, any namespace prefix); a tag inside a comment also counts, which
# errs towards dropping.
SVG_TEXT = re.compile(rb"<(?:[A-Za-z_][\w.-]*:)?(?:text|flowRoot)[\s/>]")


@dataclass(frozen=True)
class Candidate:
    """One image-caption pair before rendering."""
    id: str  # unique sample id, "<source>/<stable key>"
    source: str
    kind: Kind
    src: str  # file to render (raster/SVG), or the emoji sequence itself for kind == "emoji"
    caption: str
    label: str  # coarse label ("" if none)
    licence: str
    font: str = ""  # emoji font path (kind == "emoji")


@dataclass(frozen=True)
class Rendered:
    id: str
    path: str  # written PNG (absolute) or "" when dropped
    sha256: str  # of the PNG bytes
    reason: str  # "" when kept, else the drop reason


def to_rgb_on_white(img: Image.Image) -> Image.Image:
    """Composite any mode (P with transparency, LA, RGBA, ...) onto white; return RGB."""
    if img.mode in ("RGB",):
        return img
    if img.mode == "P" and "transparency" in img.info or img.mode in ("LA", "PA"):
        img = img.convert("RGBA")
    if img.mode == "RGBA":
        bg = Image.new("RGBA", img.size, (255, 255, 255, 255))
        return Image.alpha_composite(bg, img).convert("RGB")
    return img.convert("RGB")


def fit_square(img: Image.Image, size: int) -> Image.Image:
    """Resize (keeping aspect) to fit ``size`` x ``size`` and centre on a white square.

    Padded, not cropped: clip art has no natural crop, and cropping would cut the drawn object.
    """
    img = to_rgb_on_white(img)
    w, h = img.size
    if w <= 0 or h <= 0:
        raise ValueError("empty image")
    scale = size / max(w, h)
    nw, nh = max(1, round(w * scale)), max(1, round(h * scale))
    img = img.resize((nw, nh), Image.Resampling.LANCZOS)
    out = Image.new("RGB", (size, size), (255, 255, 255))
    out.paste(img, ((size - nw) // 2, (size - nh) // 2))
    return out


def open_image_bytes(data: bytes) -> Image.Image:
    """Decode fully (``load``) so truncated files fail here, not later in a DataLoader."""
    img = Image.open(io.BytesIO(data))
    img.load()
    return img


def render_svg(data: bytes, size: int) -> Image.Image:
    """Rasterise SVG bytes with cairosvg, ``size`` px wide (height keeps the aspect ratio; alpha kept).

    Rendering at the target width (not at the SVG's own size, then shrinking) keeps thin strokes crisp
    and costs far less for large drawings; :func:`fit_square` then fits tall drawings into the square.
    """
    import cairosvg  # heavy: cairosvg, only when SVGs are rendered

    try:
        return open_image_bytes(cairosvg.svg2png(bytestring=data, output_width=size))
    except ValueError:
        # SVGs without a size ("The SVG size is undefined") or with percentage sizes ("100%") need a
        # viewport to resolve against; give them a square one. Entity-using SVGs stay refused (no
        # ``unsafe=True``: that would also let an SVG read local files).
        return open_image_bytes(cairosvg.svg2png(bytestring=data, output_width=size, parent_width=4 * size,
                                                 parent_height=4 * size))


_FONTS: dict[str, ImageFont.FreeTypeFont] = {}
_NOTDEF: dict[str, bytes] = {}


def render_emoji(seq: str, font_path: str) -> Image.Image:
    """Render one emoji sequence with Pillow (raqm shaping joins ZWJ sequences into one glyph).

    Raises ``LookupError`` when the font has no glyph for it: either the rendering equals that of a
    codepoint the font lacks (tofu), or the sequence did not ligate (wider than one glyph).
    """
    if font_path not in _FONTS:
        _FONTS[font_path] = ImageFont.truetype(font_path, EMOJI_FONT_SIZE)
    font = _FONTS[font_path]

    def draw(s: str) -> Image.Image:
        left, top, right, bottom = font.getbbox(s)
        im = Image.new("RGBA", (max(1, right), max(1, bottom)), (0, 0, 0, 0))
        ImageDraw.Draw(im).text((0, 0), s, font=font, embedded_color=True)
        return im

    if font_path not in _NOTDEF:
        _NOTDEF[font_path] = draw("\U0010fffd").tobytes()  # a private-use codepoint no font covers
    single = font.getlength("\U0001f600")
    if font.getlength(seq) > single * 1.05:
        raise LookupError("sequence does not ligate")
    im = draw(seq)
    if im.tobytes() == _NOTDEF[font_path] or im.getbbox() is None:
        raise LookupError("no glyph")
    return im


def render_candidate(c: Candidate, out_dir: str, size: int) -> Rendered:
    """Render ``c`` to ``out_dir/<id>.png``; never raises for bad input (returns a drop reason).

    Drop reasons: ``missing_file``, ``empty_file``, ``undecodable_image``, ``no_glyph`` (emoji), ``svg_text``
    (see :data:`SVG_TEXT`). Kept images are fitted into the square (:func:`fit_square`), alpha composited on white.
    """
    out = Path(out_dir) / f"{c.id}.png"
    try:
        if c.kind == "emoji":
            try:
                img = render_emoji(c.src, c.font)
            except LookupError:
                return Rendered(c.id, "", "", "no_glyph")
        else:
            p = Path(c.src)
            if not p.is_file():
                return Rendered(c.id, "", "", "missing_file")
            data = p.read_bytes()
            if not data:
                return Rendered(c.id, "", "", "empty_file")
            if c.kind == "svg" and SVG_TEXT.search(data):
                return Rendered(c.id, "", "", "svg_text")
            img = render_svg(data, size) if c.kind == "svg" else open_image_bytes(data)
        img = fit_square(img, size)
    except Exception as err:  # noqa: BLE001  PIL/cairo raise many types for bad files; all mean "cannot decode"
        log.debug("cannot render %s: %s", c.src, err)
        return Rendered(c.id, "", "", "undecodable_image")
    buf = io.BytesIO()
    img.save(buf, format="PNG", optimize=False)
    png = buf.getvalue()
    # not synced one by one (thousands of small files: ~9 ms each on a VM disk, bench/results/fsync_*): prepare
    # syncs them all at once before it writes the fingerprint that vouches for them
    with atomic_path(out, durable=False) as tmp:
        tmp.write_bytes(png)
    return Rendered(c.id, str(out), hashlib.sha256(png).hexdigest(), "")


def _render_star(args: tuple[Candidate, str, int]) -> Rendered:
    return render_candidate(*args)


def render_all(cands: Iterable[Candidate], out_dir: str | Path, size: int, num_workers: int = 1,
               desc: str = "render") -> list[Rendered]:
    """Render every candidate (in a process pool when ``num_workers > 1``; 1 = in-process), in input order, with a
    tqdm bar."""
    jobs = [(c, str(out_dir), size) for c in cands]
    if num_workers <= 1 or len(jobs) < 32:
        return [_render_star(j) for j in tqdm(jobs, desc=desc, unit="img", leave=False)]
    with ProcessPoolExecutor(max_workers=num_workers) as pool:
        return list(tqdm(pool.map(_render_star, jobs, chunksize=16), total=len(jobs), desc=desc, unit="img",
                         leave=False))


__all__ = ["Candidate", "Rendered", "EMOJI_FONT_SIZE", "SVG_TEXT", "to_rgb_on_white", "fit_square",
           "open_image_bytes", "render_svg", "render_emoji", "render_candidate", "render_all"]
