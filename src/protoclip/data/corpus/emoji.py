"""Colour emoji (Debian ``fonts-noto-color-emoji`` + ``unicode-data`` + ``unicode-cldr-core``) as captioned pairs.

Each emoji is captioned with its CLDR name and English keywords and labelled by its emoji-test group; the rules
(which sequences, which captions) are in :func:`scan_emoji`.
"""
from __future__ import annotations

import collections
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from protoclip.data.corpus.images import Candidate

SOURCE = "emoji"
LICENCE = "OFL-1.1"
FONT = Path("usr/share/fonts/truetype/noto/NotoColorEmoji.ttf")
EMOJI_TEST = Path("usr/share/unicode/emoji/emoji-test.txt")
CLDR_FILES = (Path("usr/share/unicode/cldr/common/annotations/en.xml"),
              Path("usr/share/unicode/cldr/common/annotationsDerived/en.xml"))
SKIN_TONES = frozenset(range(0x1F3FB, 0x1F400))
_LINE = re.compile(r"^(?P<cps>[0-9A-F ]+?)\s*;\s*(?P<status>[\w-]+)\s*#\s*\S+\s+E\d+\.\d+\s+(?P<name>.+)$")


@dataclass(frozen=True)
class EmojiEntry:
    codepoints: tuple[int, ...]
    status: str
    group: str
    subgroup: str
    name: str

    @property
    def text(self) -> str:
        return "".join(map(chr, self.codepoints))


def parse_emoji_test(text: str) -> list[EmojiEntry]:
    """Every sequence line of ``emoji-test.txt`` with the group/subgroup headers above it."""
    group = subgroup = ""
    out: list[EmojiEntry] = []
    for line in text.splitlines():
        if line.startswith("# group:"):
            group = line.split(":", 1)[1].strip()
        elif line.startswith("# subgroup:"):
            subgroup = line.split(":", 1)[1].strip()
        elif line and not line.startswith("#"):
            m = _LINE.match(line.strip())
            if m:
                cps = tuple(int(c, 16) for c in m["cps"].split())
                out.append(EmojiEntry(cps, m["status"], group, subgroup, m["name"].strip()))
    return out


def parse_cldr_keywords(xml_texts: list[str]) -> dict[str, list[str]]:
    """{emoji without U+FE0F: English keywords} from CLDR annotation files (first file wins per key)."""
    out: dict[str, list[str]] = {}
    for text in xml_texts:
        root = ET.fromstring(text.encode("utf-8"))
        for a in root.iter("annotation"):
            if a.get("type") == "tts" or not a.text:
                continue
            key = a.get("cp", "").replace("\ufe0f", "")
            out.setdefault(key, [k.strip() for k in a.text.split("|") if k.strip()])
    return out


def make_caption(name: str, keywords: list[str]) -> str:
    return f"{name}: {', '.join(keywords)}" if keywords else name


def emoji_id(codepoints: tuple[int, ...]) -> str:
    return f"{SOURCE}/" + "-".join(f"{c:x}" for c in codepoints)


def scan_emoji(font_root: str | Path, unicode_root: str | Path,
               cldr_root: str | Path) -> tuple[list[Candidate], collections.Counter]:
    """Candidates (emoji-test order) and drop counts from the three unpacked packages.

    * ``emoji-test.txt`` (unicode-data) lists every emoji sequence with its qualification status, group,
      subgroup and CLDR short name. Only ``fully-qualified`` sequences are used (the others are the same
      emoji without the presentation selector) [not_fully_qualified], and sequences with a skin-tone
      modifier U+1F3FB..U+1F3FF are dropped (five recolourings of one picture per person emoji) [skin_tone].
    * Keywords come from CLDR's English annotations (``annotations/en.xml`` and
      ``annotationsDerived/en.xml``; CLDR keys omit U+FE0F). Caption = ``"<name>: <kw>, <kw>, ..."``
      in CLDR's order ("taxi: taxi, vehicle"); the name alone when CLDR has no keywords.
    * The image is the NotoColorEmoji CBDT bitmap rendered with Pillow (``images.render_emoji``);
      sequences the font cannot draw as one glyph are dropped at render time [no_glyph].
    * Coarse label = ``"<group>/<subgroup>"`` ("Travel & Places/transport-ground").
    """
    font = Path(font_root) / FONT
    test = Path(unicode_root) / EMOJI_TEST
    cldr = [Path(cldr_root) / p for p in CLDR_FILES]
    for p in (font, test, *cldr):
        if not p.is_file():
            raise FileNotFoundError(f"emoji input not found: {p}")
    keywords = parse_cldr_keywords([p.read_text(encoding="utf-8") for p in cldr])
    drops: collections.Counter = collections.Counter()
    cands: list[Candidate] = []
    for e in parse_emoji_test(test.read_text(encoding="utf-8")):
        if e.status != "fully-qualified":
            drops["not_fully_qualified"] += 1
        elif SKIN_TONES & set(e.codepoints):
            drops["skin_tone"] += 1
        else:
            kws = keywords.get(e.text.replace("\ufe0f", ""), [])
            cands.append(Candidate(id=emoji_id(e.codepoints), source=SOURCE, kind="emoji", src=e.text,
                                   caption=make_caption(e.name, kws), label=f"{e.group}/{e.subgroup}",
                                   licence=LICENCE, font=str(font)))
    return cands, drops


__all__ = ["SOURCE", "EmojiEntry", "parse_emoji_test", "parse_cldr_keywords", "make_caption", "emoji_id",
           "scan_emoji"]
