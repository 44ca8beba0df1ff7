"""Content normalization and the dedup hash (seed 5.1): one definition for every write path."""

from __future__ import annotations

import hashlib
import re
import unicodedata

from service.core.model import Scope

_WHITESPACE = re.compile(r"\s+")
_UNSAFE = frozenset({"Cc", "Cf", "Zl", "Zp"})


def normalize(text: str) -> str:
    """Trim, then fold every run of whitespace to one space."""
    return _WHITESPACE.sub(" ", text).strip()


def dedup_hash(scope: Scope, project_key: str, content: str) -> str:
    """sha1("{scope}|{projectKey or ''}|{normalized content}"), so USER and PROJECT dedup apart."""
    payload = f"{scope.value}|{project_key}|{normalize(content)}"
    return hashlib.sha1(payload.encode("utf-8"), usedforsecurity=False).hexdigest()


def clean_content(text: str) -> str:
    """Model output made safe for storage: control and format characters become spaces, then normalize.

    A fact is one line of plain text; newlines and invisible characters are how injected content
    would try to open a new prompt section.
    """
    if not text.isprintable():  # printable text has none of those: skip the per-character scan
        text = "".join(" " if unicodedata.category(ch) in _UNSAFE else ch for ch in text)
    return normalize(text)
