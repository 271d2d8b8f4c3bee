"""Openclipart (Debian ``openclipart-svg``): SVG clip art with RDF metadata -> cleaned caption pairs.

Each SVG's ``<cc:Work>`` metadata gives a title, keywords, creator and licence. Titles are noisy, so the cleaning
rules (in :func:`scan_openclipart`, each counted in the prepare report) drop authors, collections and non-English
titles. Coarse label = the top-level folder (animals, food, people, ...).
"""
from __future__ import annotations

import collections
import html
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from protoclip.data.corpus.captions import is_english, normalise, words
from protoclip.data.corpus.images import Candidate

SOURCE = "openclipart"
SVG_DIR = Path("usr/share/openclipart/svg")
EXCLUDED_FOLDERS = frozenset({"shapes", "special", "computer", "logos", "unsorted"})
NS = {"dc": "http://purl.org/dc/elements/1.1/", "cc": "http://web.resource.org/cc/",
      "rdf": "http://www.w3.org/1999/02/22-rdf-syntax-ns#"}
# tags that describe the packaging or file type, not the drawing
GENERIC_TAGS = frozenset({
    "hash", "icon", "icons", "theme", "clip art", "clipart", "svg", "image", "media", "drawing", "openclipart",
    "public domain", "signs and symbols", "animals", "buildings", "buttons", "containers", "decorations",
    "education", "electronics", "food", "geography", "office", "people", "plants", "recreation", "science",
    "tools", "transportation", "computer", "shapes", "special", "logos", "unsorted", "shape", "sign", "signs",
    "symbol", "symbols", "work", "simple",
})
_CLIPART_BY = re.compile(r"^\s*clip\s*art\s+by\s+[^-]+-\s*", re.IGNORECASE)
_BY_SUFFIX = re.compile(r"\s+(?:by|par|di|von)\s+\S.*$", re.IGNORECASE)
_PARENS_EMAIL = re.compile(r"\([^)]*@[^)]*\)")
_JUNK_TAG = re.compile(r"^(?:[\d\W_]+|hash\b.*|.*\b0x[0-9a-f]+.*)$", re.IGNORECASE)  # numbers, hash(0x8a0b6a8)


@dataclass(frozen=True)
class SvgMeta:
    title: str
    keywords: tuple[str, ...]
    creator: str
    licence_url: str


def parse_metadata(data: bytes) -> SvgMeta:
    """Read the ``cc:Work`` RDF block of one SVG (raises ``ET.ParseError`` / ``ValueError`` if unusable)."""
    root = ET.fromstring(data)
    work = root.find(".//cc:Work", NS)
    if work is None:
        raise ValueError("no cc:Work metadata")
    title = html.unescape(work.findtext("dc:title", default="", namespaces=NS) or "")
    kws = tuple(html.unescape(li.text or "") for li in work.findall("dc:subject//rdf:li", NS))
    creator = work.findtext("dc:creator/cc:Agent/dc:title", default="", namespaces=NS) or ""
    lic = work.find("cc:license", NS)
    url = lic.get(f"{{{NS['rdf']}}}resource", "") if lic is not None else ""
    return SvgMeta(normalise(title), kws, normalise(html.unescape(creator)), url)


def licence_name(url: str) -> str:
    u = url.lower()
    if "gpl" in u:
        return "GPL-2.0"
    return "CC0-1.0"  # PublicDomain / publicdomain / unset: the Debian package is CC0 as a whole


def _creator_words(creator: str) -> set[str]:
    return {w for w in words(re.sub(r"<[^>]*>", " ", creator)) if len(w) >= 3}


def clean_title(title: str, creator: str) -> str:
    """Remove author prefixes/suffixes and e-mails; underscores become spaces. May return ''."""
    t = _CLIPART_BY.sub("", title)
    t = _PARENS_EMAIL.sub(" ", t)
    t = _BY_SUFFIX.sub("", t)
    t = normalise(t.replace("_", " "))
    author = _creator_words(creator)
    toks = t.split(" ") if t else []
    while toks and toks[-1].lower().strip(".,") in author:  # trailing author name words
        toks.pop()
    t = " ".join(toks)
    if not t or "@" in t or (author and set(words(t)) <= author):
        return ""
    return t


def clean_keywords(keywords: tuple[str, ...] | list[str], title: str, creator: str, lexicon: frozenset[str],
                   max_keywords: int = 3) -> list[str]:
    """Informative, English, de-duplicated tags not already in the title (rule 6 of :func:`scan_openclipart`)."""
    author = _creator_words(creator)
    title_words = set(words(title))
    out: list[str] = []
    for k in keywords:
        k = normalise(k.replace("_", " ").lower())
        if not k or k in GENERIC_TAGS or _JUNK_TAG.match(k) or k in out:
            continue
        kw = set(words(k))
        if not kw or kw & author or kw <= title_words or not is_english(k, lexicon):
            continue
        out.append(k)
        if len(out) == max_keywords:
            break
    return out


def make_caption(title: str, keywords: list[str]) -> str:
    return ", ".join([title, *keywords])


def scan_openclipart(unpacked: str | Path, lexicon: frozenset[str], max_title_uses: int = 5,
                     max_keywords: int = 3) -> tuple[list[Candidate], collections.Counter]:
    """Candidates (sorted by id) and drop counts from an unpacked ``openclipart-svg``.

    ``lexicon``: English words for the non-English rule (``captions.english_lexicon``). Each SVG carries
    ``<cc:Work>`` metadata with ``dc:title``, ``dc:subject`` keywords, ``dc:creator`` and ``cc:license``. The
    cleaning rules (each one counted in the prepare report under the reason in brackets):

    1. symbolic links (the package links one drawing into several folders) are skipped [symlink];
    2. top-level folders of non-depictive art are dropped: shapes, special (gradients, patterns),
       computer (icon themes), logos, unsorted [excluded_folder];
    3. the author is removed from titles: a "Clipart by <name> - " prefix, a " by <name>" suffix,
       trailing words of the creator's name ("Coccinella Rollandin" -> "Coccinella"), parenthesised
       e-mail addresses; a title that is then empty or just the author is dropped [author_title];
    4. collection names are dropped: a cleaned title used by more than ``max_title_uses`` (5) files of
       the package ("Lemon SVG theme", "card", "gramastar") names a set, not the drawing [collection_title];
    5. non-English titles are dropped (heuristic, see ``protoclip.data.corpus.captions.is_english``) [non_english];
    6. caption = title + up to ``max_keywords`` (3) keywords, in metadata order, after removing empty,
       numeric/hex and generic tags (packaging category names, "icon", "hash", ...), tags naming the
       author, tags already in the title and non-English tags: "Bored dog, mammal, animal".
    """
    root = Path(unpacked) / SVG_DIR
    if not root.is_dir():
        raise FileNotFoundError(f"openclipart SVG folder not found: {root}")
    drops: collections.Counter = collections.Counter()
    parsed: list[tuple[Path, SvgMeta, str]] = []
    for svg in sorted(root.rglob("*.svg")):
        if svg.is_symlink():
            drops["symlink"] += 1
            continue
        try:
            meta = parse_metadata(svg.read_bytes())
        except (ET.ParseError, ValueError, OSError):
            drops["bad_metadata"] += 1
            continue
        parsed.append((svg, meta, clean_title(meta.title, meta.creator)))
    # collections are counted over the whole package, before folder exclusion (icon sets span folders)
    uses = collections.Counter(t.lower() for _, _, t in parsed if t)
    cands: list[Candidate] = []
    for svg, meta, title in parsed:
        rel = svg.relative_to(root)
        top = rel.parts[0] if len(rel.parts) > 1 else ""
        if top in EXCLUDED_FOLDERS:
            drops["excluded_folder"] += 1
        elif not title:
            drops["author_title" if meta.title else "empty_caption"] += 1
        elif uses[title.lower()] > max_title_uses:
            drops["collection_title"] += 1
        elif not is_english(title, lexicon):
            drops["non_english"] += 1
        else:
            caption = make_caption(title, clean_keywords(meta.keywords, title, meta.creator, lexicon, max_keywords))
            cands.append(Candidate(id=f"{SOURCE}/{rel.with_suffix('').as_posix()}", source=SOURCE, kind="svg",
                                   src=str(svg), caption=caption, label=top, licence=licence_name(meta.licence_url)))
    return cands, drops


__all__ = ["SOURCE", "EXCLUDED_FOLDERS", "GENERIC_TAGS", "SvgMeta", "parse_metadata", "licence_name", "clean_title",
           "clean_keywords", "make_caption", "scan_openclipart"]
