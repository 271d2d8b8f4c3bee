"""Caption checks shared by every source: decoding, whitespace, and an English-likeness test.

The English test (``is_english``) is a documented heuristic, as no language-ID package is a project dependency.
"""
from __future__ import annotations

import functools
import gzip
import importlib.util
import re
from pathlib import Path

# frequent function words of the languages that occur in openclipart titles; all are rare in English
FOREIGN_FUNCTION_WORDS = frozenset(
    "di della delle dello degli il lo gli dei sul nel con per "  # Italian
    "de des du et avec pour une sur dans les "  # French
    "el los las del y por para una "  # Spanish
    "und der das ein eine mit für von zum zur "  # German
    "het een voor op met "  # Dutch
    .split()
)
_WORD = re.compile(r"[^\W\d_]+", re.UNICODE)


class CaptionError(ValueError):
    """A caption that cannot be used; ``reason`` is the report key."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def normalise(text: str) -> str:
    """Collapse whitespace (newlines, tabs, runs of spaces) and strip."""
    return " ".join(text.split())


def decode_caption(data: bytes) -> str:
    """UTF-8 (BOM tolerated) -> normalised text; ``CaptionError('non_utf8_caption' | 'empty_caption')``."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise CaptionError("non_utf8_caption", str(err)) from None
    return check_caption(text)


def check_caption(text: str | None) -> str:
    """Normalised caption or ``CaptionError('empty_caption')``."""
    text = normalise(text or "")
    if not text:
        raise CaptionError("empty_caption")
    return text


@functools.lru_cache(maxsize=1)
def clip_vocabulary() -> frozenset[str]:
    """Whole words of CLIP's BPE vocabulary (merged tokens ending in ``</w>``, the marker stripped).

    Read from open_clip's shipped ``bpe_simple_vocab_16e6.txt.gz`` with the same merge range as
    ``open_clip.tokenizer.SimpleTokenizer`` (``merges[1:49152-256-2+1]``). Done by hand, not through
    ``SimpleTokenizer``, because importing ``open_clip`` pulls in torch and transformers, which the
    prepare stage does not otherwise need (tens of seconds on a busy 2-core machine).
    """
    spec = importlib.util.find_spec("open_clip")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("open_clip is not installed: its BPE vocabulary is needed for the English test")
    bpe = Path(list(spec.submodule_search_locations)[0]) / "bpe_simple_vocab_16e6.txt.gz"
    merges = gzip.decompress(bpe.read_bytes()).decode("utf-8").split("\n")[1:49152 - 256 - 2 + 1]
    out = set()
    for m in merges:
        tok = m.replace(" ", "")
        if tok.endswith("</w>") and len(tok) > 5:
            out.add(tok[:-4])
    return frozenset(out)


def words(text: str) -> list[str]:
    """Lower-cased alphabetic words (digits and punctuation split words and are dropped)."""
    return [w.lower() for w in _WORD.findall(text)]


def english_lexicon(word_list: str | Path | None = None) -> frozenset[str]:
    """Lower-cased English words: CLIP's vocabulary plus, if given, a word-list file (one word a line)."""
    lex = set(clip_vocabulary())
    if word_list is not None:
        for line in Path(word_list).read_text(encoding="utf-8", errors="replace").splitlines():
            w = line.strip().lower()
            if w.endswith("'s"):
                w = w[:-2]
            if w:
                lex.add(w)
    return frozenset(lex)


def english_share(text: str, lexicon: frozenset[str]) -> float:
    """Share of the alphabetic words of ``text`` (2+ letters) found in ``lexicon``."""
    ws = [w for w in words(text) if len(w) >= 2]
    if not ws:
        return 0.0
    return sum(w in lexicon for w in ws) / len(ws)


def is_english(text: str, lexicon: frozenset[str], min_share: float = 0.6) -> bool:
    """Heuristic English test: no frequent foreign function word, and enough words of CLIP's own vocabulary.

    A title counts as English when it contains none of ``FOREIGN_FUNCTION_WORDS`` (frequent Italian / French /
    Spanish / German / Dutch function words), and at least ``min_share`` of its alphabetic words are whole words of
    ``lexicon`` (CLIP's BPE vocabulary, ``open_clip``'s ``SimpleTokenizer``: 49k merges learned mostly on English web
    text; ``min_share`` 0.6 means a two-word title needs both). Italian titles such as "Cigno", "Ragnetto
    incazzato" fail the second test; "Chalet di montagna" fails the first. Rare English proper nouns
    ("Extremadura") are dropped too, which costs a few usable pairs but never admits a foreign caption.
    """
    if any(w in FOREIGN_FUNCTION_WORDS for w in words(text)):
        return False
    return english_share(text, lexicon) >= min_share


__all__ = ["CaptionError", "FOREIGN_FUNCTION_WORDS", "normalise", "decode_caption", "check_caption",
           "clip_vocabulary", "english_lexicon", "words", "english_share", "is_english"]
