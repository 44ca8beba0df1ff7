"""One identity rule for text (seed 5.1, sharpened): the hash, D11's length check and rendering.

Two texts that render the same must be one memory. `clean_content` is what is stored and rendered:
line breaks and control characters become spaces, invisible format characters go (zero-width
spaces, BOM, word joiners, direction overrides, tag characters), except a ZWJ/ZWNJ that joins two
letters, marks, digits or symbols (emoji sequences, Persian and Indic words), whitespace folded.
`identity` is `clean_content` of the NFKC form without the characters that render as nothing
(Unicode's Default_Ignorable_Code_Point: variation selectors, the combining grapheme joiner, Hangul
fillers; and the blank Braille pattern), so full-width and composed variants, and a text with an
invisible character slipped in, compare equal without the stored text losing its own punctuation.
A text whose identity is empty is blank.

No stored text holds a control character (C0 or C1, NUL included) other than the whitespace the
identity rule folds (tab, line feed, vertical tab, form feed, carriage return), nor a bidi
embedding, override or isolate (U+202A–U+202E, U+2066–U+2069): `hostile_character` finds one, so an
entrance can refuse what a user typed, and `strip_hostile` removes them from what a machine made
(`clean_content` never keeps them either). An identifier (a project key, an event id) holds no
control, format, line-break or invisible character at all: `identifier_problem`.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Callable

from service.core.model import Scope

_WHITESPACE = re.compile(r"\s+")
_BREAKS = frozenset({"Cc", "Zl", "Zp"})
_INVISIBLE = _BREAKS | {"Cf"}
_JOINERS = frozenset({"\u200c", "\u200d"})
# What a ZWJ/ZWNJ may sit between and still change how the text renders.
_JOINABLE = ("L", "M", "N", "So", "Sk")
# Default_Ignorable_Code_Point (DerivedCoreProperties.txt; tests/unit/test_normalize.py holds it to
# the `regex` module's table) and U+2800 BRAILLE PATTERN BLANK, which draws nothing either.
_IGNORABLE_RANGES = (
    (0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160), (0x17B4, 0x17B5),
    (0x180B, 0x180F), (0x200B, 0x200F), (0x202A, 0x202E), (0x2060, 0x206F), (0x2800, 0x2800),
    (0x3164, 0x3164), (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8),
    (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A), (0xE0000, 0xE0FFF),
)  # fmt: skip
_IGNORABLE = frozenset(chr(c) for low, high in _IGNORABLE_RANGES for c in range(low, high + 1))
# What `identity` drops before `clean_content` decides where a joiner joins: the ignorables but them.
_DROPPED = re.compile(
    "(?![\u200c\u200d])[" + "".join(f"\\U{a:08x}-\\U{b:08x}" for a, b in _IGNORABLE_RANGES) + "]"
)
# The whitespace controls the identity rule folds; every other control is hostile. (str.isspace
# also counts U+001C–U+001F and U+0085, which no one types as whitespace.)
_FOLDED_CONTROLS = frozenset("\t\n\v\f\r")
_BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
# What `trim` removes: every whitespace character but the controls among them.
_TRIMMED = "".join(
    ch
    for ch in map(chr, range(0x3001))
    if ch.isspace() and (ch in _FOLDED_CONTROLS or unicodedata.category(ch) != "Cc")
)


def is_hostile(ch: str) -> bool:
    """A control character other than the folded whitespace, or a bidi embedding, override or
    isolate."""
    return ch in _BIDI_CONTROLS or (unicodedata.category(ch) == "Cc" and ch not in _FOLDED_CONTROLS)


def is_visible(ch: str) -> bool:
    """Neither whitespace nor a control, format, separator or ignorable character: what `identity`
    keeps."""
    return not ch.isspace() and unicodedata.category(ch) not in _INVISIBLE and ch not in _IGNORABLE


def hides_in_identifier(ch: str) -> bool:
    """What an identifier must not hold: anything invisible but a space (Unicode category Zs), so
    controls, tabs and line breaks, format and ignorable characters."""
    return not is_visible(ch) and unicodedata.category(ch) != "Zs"


def identifier_problem(text: str) -> str | None:
    """Why `text` cannot be an identifier (`hides_in_identifier`), or None."""
    if text.isascii() and text.isprintable():  # U+0020–U+007E: nothing hides there, skip the scan
        return None
    found = next((ch for ch in text if hides_in_identifier(ch)), None)
    return (
        None
        if found is None
        else f"must not contain control, format or invisible characters (U+{ord(found):04X})"
    )


def strip_identifier(text: str) -> str:
    """`text` without the characters an identifier must not hold."""
    if text.isascii() and text.isprintable():
        return text
    return "".join(ch for ch in text if not hides_in_identifier(ch))


def hostile_character(text: str) -> str | None:
    """The first control or direction character no stored text may hold, or None."""
    if text.isprintable():  # neither kind is printable: skip the per-character scan
        return None
    return next((ch for ch in text if is_hostile(ch)), None)


def strip_hostile(text: str) -> str:
    """`text` without its control and direction characters (`hostile_character`)."""
    if hostile_character(text) is None:
        return text
    return "".join(ch for ch in text if not is_hostile(ch))


def char_class(wanted: Callable[[str], bool]) -> str:
    """The characters of the Basic Multilingual Plane for which `wanted` holds, as regex ranges
    that Python's, Rust's and ECMA's regexes read alike (`\\uXXXX`): a JSON Schema pattern."""
    ranges: list[list[int]] = []
    for code in range(0x10000):
        if 0xD800 <= code <= 0xDFFF or not wanted(chr(code)):
            continue
        if ranges and ranges[-1][1] == code - 1:
            ranges[-1][1] = code
        else:
            ranges.append([code, code])
    return "".join(f"\\u{a:04x}" if a == b else f"\\u{a:04x}-\\u{b:04x}" for a, b in ranges)


def key_problem(key: str, limit: int) -> str | None:
    """Why a trimmed project key cannot name a project, or None: an identifier (`identifier_problem`)
    that passes the text rule (`text_problem`)."""
    return identifier_problem(key) or text_problem(key, limit)


def text_problem(text: str, limit: int) -> str | None:
    """Why a trimmed text a user typed (a memory's content, a projectKey) cannot be stored, or None:
    holding a control or direction character, blank (its identity is empty), or over `limit`
    characters."""
    if (found := hostile_character(text)) is not None:
        return f"must not contain control or direction characters (U+{ord(found):04X})"
    if not has_visible_text(text):
        return "must not be blank"
    if len(text) > limit:
        return f"must be at most {limit} characters"
    return None


def trim(text: str) -> str:
    """`text` without leading and trailing whitespace, a control never counting as such: a text
    that starts or ends with U+001C–U+001F or U+0085 (str.strip's whitespace too) keeps it, to be
    refused."""
    return text.strip(_TRIMMED)


def normalize(text: str) -> str:
    """Trim, then fold every run of whitespace to one space."""
    return _WHITESPACE.sub(" ", text).strip()


def _joins(before: list[str], after: str) -> bool:
    """A ZWJ/ZWNJ between two joinable characters changes the rendering, so it stays."""
    return bool(before) and all(unicodedata.category(ch).startswith(_JOINABLE) for ch in (before[-1], after))


def clean_content(text: str) -> str:
    """A fact as stored and rendered: one line of visible text.

    Newlines and invisible characters are how injected content would try to open a new prompt
    section, and how two identical-looking texts would dodge the dedup hash.
    """
    if text.isprintable():  # no control, format or separator character: skip the per-character scan
        return normalize(text)
    kept: list[str] = []
    last = len(text) - 1
    for i, ch in enumerate(text):
        category = unicodedata.category(ch)
        if category in _BREAKS:
            kept.append(" ")
        elif category != "Cf" or (ch in _JOINERS and 0 < i < last and _joins(kept, text[i + 1])):
            kept.append(ch)
    return normalize("".join(kept))


def has_visible_text(text: str) -> bool:
    """Whether `identity(text)` is non-empty, found at the first visible character instead of
    cleaning the whole text (a long assistant reply on every extraction)."""
    return any(is_visible(ch) for ch in text)


def identity(text: str) -> str:
    """What two texts must share to be one memory: NFKC, without ignorable characters (but the
    joiners, which `clean_content` keeps only where they join), then `clean_content`."""
    if not unicodedata.is_normalized("NFKC", text):
        text = unicodedata.normalize("NFKC", text)
    return clean_content(_DROPPED.sub("", text))


# The version of the rule above that stored hashes and texts follow. A migration that changes the
# rule raises it and records it in the database before it re-cleans and re-hashes (docs/operations.md,
# rolling updates); code whose version differs from the database's writes no memory.
TEXT_RULE_VERSION = "3"


def dedup_hash(scope: Scope, project_key: str, content: str) -> str:
    """sha1("{scope}|{projectKey or ''}|{identity(content)}"), so USER and PROJECT dedup apart."""
    payload = f"{scope.value}|{project_key}|{identity(content)}"
    return hashlib.sha1(payload.encode("utf-8"), usedforsecurity=False).hexdigest()
