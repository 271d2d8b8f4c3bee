"""Caption cleaning rules of each offline source (tuxpaint, openclipart, emoji), one test per rule."""
from __future__ import annotations

from pathlib import Path

import pytest

from protoclip.data.corpus import emoji, openclipart, tuxpaint
from protoclip.data.corpus.captions import CaptionError, decode_caption, english_share, is_english
from testkit.data import svg

LEX = frozenset({"bored", "dog", "mammal", "animal", "soft", "blue", "couch", "furniture", "red", "car", "bee",
                 "house", "cat", "vehicle", "flag", "green", "tree", "chalet", "plant"})


# ----------------------------------------------------------------------------- generic
def test_decode_caption_rules():
    assert decode_caption(b"  A little\n rabbit. ") == "A little rabbit."
    assert decode_caption("\ufeffCaf\u00e9".encode("utf-8")) == "Caf\u00e9"
    with pytest.raises(CaptionError) as e:
        decode_caption(b"caf\xe9")  # latin-1
    assert e.value.reason == "non_utf8_caption"
    with pytest.raises(CaptionError) as e:
        decode_caption(b" \n\t")
    assert e.value.reason == "empty_caption"


def test_is_english_function_words_and_share():
    assert english_share("Bored dog", LEX) == 1.0
    assert english_share("Ragnetto dog", LEX) == 0.5
    assert is_english("Bored dog", LEX)
    assert not is_english("Cigno", LEX)  # unknown word
    assert not is_english("Ragnetto dog", LEX)  # 1/2 < 0.6
    assert not is_english("Chalet di dog", LEX)  # Italian function word, despite known words
    assert not is_english("123", LEX)  # no words at all


# ----------------------------------------------------------------------------- openclipart
@pytest.mark.parametrize("title,creator,expected", [
    ("Clipart by Nicu Buculei - bee", "Nicu Buculei", "bee"),  # author prefix
    ("Coccinella Rollandin", "Architetto Francesco Rollandin", "Coccinella"),  # trailing author words
    ("Red car by Jane Doe", "Jane Doe", "Red car"),  # " by <author>" suffix
    ("Telefono (email: frollandin@email.it)", "Architetto Francesco Rollandin", "Telefono"),  # e-mail
    ("Architetto Francesco Rollandin", "Architetto Francesco Rollandin", ""),  # only the author
    ("ralf@ark.in-berlin.de", "ralf@ark.in-berlin.de", ""),
    ("svg_globe_green", "", "svg globe green"),  # underscores
])
def test_openclipart_clean_title(title, creator, expected):
    assert openclipart.clean_title(title, creator) == expected


def test_openclipart_keywords():
    kws = ["hash", "", "dog", "mammal", "0x8b754fc", "hash(0x8a0b6a8)", "signs_and_symbols", "jane", "icon",
           "Animal", "animal", "cane", "furniture", "house"]
    # dog is in the title, jane names the author, cane is not English, animal de-duplicated, max 3
    assert openclipart.clean_keywords(kws, "Bored dog", "Jane Doe", LEX, max_keywords=3) == [
        "mammal", "animal", "furniture"]
    assert openclipart.make_caption("Bored dog", ["mammal"]) == "Bored dog, mammal"
    assert openclipart.make_caption("Bored dog", []) == "Bored dog"


def test_openclipart_parse_metadata_and_licence():
    m = openclipart.parse_metadata(svg("Soft &amp;#39;blue&amp;#39; couch", ["furniture"], "A B").encode())
    assert m.title == "Soft 'blue' couch" and m.keywords == ("furniture",) and m.creator == "A B"
    assert openclipart.licence_name(m.licence_url) == "CC0-1.0"
    assert openclipart.licence_name("http://creativecommons.org/licenses/GPL/2.0/") == "GPL-2.0"


def write_openclipart(root: Path, files: dict[str, str]) -> Path:
    base = root / openclipart.SVG_DIR
    for rel, text in files.items():
        p = base / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def test_openclipart_scan_counts_each_rule(tmp_path):
    files = {
        "animals/dog.svg": svg("Bored dog", ["mammal", "animal", "dog"]),
        "furniture_/couch.svg": svg("Soft blue couch", ["furniture"]),
        "shapes/star.svg": svg("Red house"),  # excluded folder
        "computer/icon.svg": svg("Green tree"),  # excluded folder
        "animals/cigno.svg": svg("Cigno", ["animal"]),  # non-English
        "animals/author.svg": svg("Jane Doe"),  # only the author
        "animals/untitled.svg": svg(""),  # empty title
        "animals/broken.svg": "<svg><metadata>",  # unparsable
    }
    for i in range(6):  # a title used 6 times (> 5) is a collection
        files[f"plants/set_{i}.svg"] = svg("Green tree", ["plant"], body=f'<circle r="{i + 1}"/>')
    for i in range(5):  # used 5 times: kept
        files[f"food/car_{i}.svg"] = svg("Red car", body=f'<circle r="{i + 1}"/>')
    root = write_openclipart(tmp_path, files)
    (root / openclipart.SVG_DIR / "animals" / "dog_link.svg").symlink_to("dog.svg")
    cands, drops = openclipart.scan_openclipart(root, LEX)
    captions = {c.id: c.caption for c in cands}
    assert captions["openclipart/animals/dog"] == "Bored dog, mammal, animal"
    assert captions["openclipart/furniture_/couch"] == "Soft blue couch, furniture"
    assert sum(c.startswith("openclipart/food/car_") for c in captions) == 5
    assert dict(drops) == {"excluded_folder": 2, "non_english": 1, "author_title": 1, "empty_caption": 1,
                           "bad_metadata": 1, "collection_title": 6, "symlink": 1}
    dog = next(c for c in cands if c.id == "openclipart/animals/dog")
    assert dog.label == "animals" and dog.kind == "svg" and dog.licence == "CC0-1.0"


# ----------------------------------------------------------------------------- tuxpaint
def test_tuxpaint_rules(tmp_path):
    base = tmp_path / tuxpaint.STAMPS_DIR
    (base / "animals/mammals/cats").mkdir(parents=True)
    (base / "plants").mkdir(parents=True)
    (base / "animals/mammals/cats/cat.txt").write_bytes(b"A  cat.\nfr.utf8=Un chat.\n")
    (base / "animals/mammals/cats/cat.png").write_bytes(b"png")
    (base / "animals/mammals/cats/cat.svg").write_bytes(b"svg")  # PNG preferred when both exist
    (base / "plants/tree.txt").write_text("A tree.\n")
    (base / "plants/tree.svg").write_text("<svg/>")
    (base / "plants/ghost.txt").write_text("No picture.\n")  # no image
    (base / "plants/bad.txt").write_bytes(b"\xff\xfe bad\n")
    (base / "plants/bad.png").write_bytes(b"png")
    (base / "plants/empty.txt").write_bytes(b"\nsecond line only\n")
    (base / "plants/empty.png").write_bytes(b"png")
    cands, drops = tuxpaint.scan_tuxpaint(tmp_path)
    got = {c.id: (c.caption, c.label, c.kind, Path(c.src).suffix) for c in cands}
    assert got == {"tuxpaint/animals/mammals/cats/cat": ("A cat.", "animals/mammals", "raster", ".png"),
                   "tuxpaint/plants/tree": ("A tree.", "plants", "svg", ".svg")}
    assert dict(drops) == {"no_image": 1, "non_utf8_caption": 1, "empty_caption": 1}


# ----------------------------------------------------------------------------- emoji
EMOJI_TEST = """# group: Travel & Places
# subgroup: transport-ground
1F695                                                  ; fully-qualified     # \U0001F695 E0.6 taxi
# group: People & Body
# subgroup: hand-fingers-open
1F44B                                                  ; fully-qualified     # \U0001F44B E0.6 waving hand
1F44B 1F3FB                                            ; fully-qualified     # \U0001F44B\U0001F3FB E1.0 waving hand: light skin tone
# subgroup: face
263A FE0F                                              ; fully-qualified     # \u263a\ufe0f E0.6 smiling face
263A                                                   ; unqualified         # \u263a E0.6 smiling face
"""
CLDR = """<ldml><annotations>
<annotation cp="\U0001F695">taxi | vehicle</annotation>
<annotation cp="\U0001F695" type="tts">taxi</annotation>
<annotation cp="\u263a">face | smile</annotation>
</annotations></ldml>"""


def test_emoji_parse_and_rules(tmp_path):
    entries = emoji.parse_emoji_test(EMOJI_TEST)
    assert [(e.name, e.status, e.group, e.subgroup) for e in entries][:2] == [
        ("taxi", "fully-qualified", "Travel & Places", "transport-ground"),
        ("waving hand", "fully-qualified", "People & Body", "hand-fingers-open")]
    kw = emoji.parse_cldr_keywords([CLDR])
    assert kw == {"\U0001F695": ["taxi", "vehicle"], "\u263a": ["face", "smile"]}
    for rel, text in [(emoji.EMOJI_TEST, EMOJI_TEST), (emoji.CLDR_FILES[0], CLDR), (emoji.CLDR_FILES[1], "<ldml/>")]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text, encoding="utf-8")
    (tmp_path / emoji.FONT).parent.mkdir(parents=True)
    (tmp_path / emoji.FONT).write_bytes(b"font")
    cands, drops = emoji.scan_emoji(tmp_path, tmp_path, tmp_path)
    assert [(c.id, c.caption, c.label) for c in cands] == [
        ("emoji/1f695", "taxi: taxi, vehicle", "Travel & Places/transport-ground"),
        ("emoji/1f44b", "waving hand", "People & Body/hand-fingers-open"),  # no CLDR keywords: name only
        ("emoji/263a-fe0f", "smiling face: face, smile", "People & Body/face"),  # FE0F stripped for lookup
    ]
    assert dict(drops) == {"skin_tone": 1, "not_fully_qualified": 1}


def test_clip_vocabulary_matches_open_clip_tokenizer():
    from open_clip.tokenizer import SimpleTokenizer

    from protoclip.data.corpus.captions import clip_vocabulary

    oracle = {t[:-4] for t in SimpleTokenizer().encoder if t.endswith("</w>") and len(t) > 5}
    assert clip_vocabulary() == oracle
    assert {"dog", "couch", "photo"} <= oracle and "ragnetto" not in oracle
