"""One identity rule for text (seed 5.1, sharpened): the hash, D11's length check and rendering.

Two texts that render the same must be one memory. `clean_content` is what is stored and rendered:
line breaks and control characters become spaces, invisible format characters go (zero-width
spaces, BOM, word joiners, direction overrides, tag characters), except a ZWJ/ZWNJ that joins two
letters, marks, digits or symbols (emoji sequences, Persian and Indic words), whitespace folded.
`identity` is `clean_content` of the NFKC form, so full-width and composed variants compare equal
without the stored text losing its own punctuation.

No stored text holds a control character (C0 or C1, NUL included) other than the whitespace the
identity rule folds, nor a bidi embedding, override or isolate (U+202A–U+202E, U+2066–U+2069):
`hostile_character` finds one, so an entrance can refuse what a user typed, and `strip_hostile`
removes them from what a machine made (`clean_content` never keeps them either).
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

from service.core.model import Scope

_WHITESPACE = re.compile(r"\s+")
_BREAKS = frozenset({"Cc", "Zl", "Zp"})
_INVISIBLE = _BREAKS | {"Cf"}
_JOINERS = frozenset({"\u200c", "\u200d"})
# What a ZWJ/ZWNJ may sit between and still change how the text renders.
_JOINABLE = ("L", "M", "N", "So", "Sk")


_BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def is_hostile(ch: str) -> bool:
    """A control character other than whitespace, or a bidi embedding, override or isolate."""
    return ch in _BIDI_CONTROLS or (unicodedata.category(ch) == "Cc" and not ch.isspace())


def is_visible(ch: str) -> bool:
    """Neither whitespace nor a control, format or separator character: what `identity` keeps."""
    return not ch.isspace() and unicodedata.category(ch) not in _INVISIBLE


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
    """What two texts must share to be one memory: NFKC, then `clean_content`."""
    if not unicodedata.is_normalized("NFKC", text):
        text = unicodedata.normalize("NFKC", text)
    return clean_content(text)


def dedup_hash(scope: Scope, project_key: str, content: str) -> str:
    """sha1("{scope}|{projectKey or ''}|{identity(content)}"), so USER and PROJECT dedup apart."""
    payload = f"{scope.value}|{project_key}|{identity(content)}"
    return hashlib.sha1(payload.encode("utf-8"), usedforsecurity=False).hexdigest()
