"""The layout of the extraction and consolidation prompts: blocks of one-line rows.

A block is a heading line followed by its lines; blocks are apart by one blank line. Memories are
shown one per line, `id<TAB>content` where the model may reference them, `-<TAB>content` where it
may not (the negative list). A row costs its content and two or three tokens, where a JSON object
per row cost about as much again as the content (keys, quotes, braces, indentation); models read
such line lists as reliably as JSON, and every content is one line of visible text, so no content
can start a row, a block or a heading of its own: a block's lines all start with a prefix, so even
a content equal to a heading or a JSON object reads as a row. The conversation, the one part no one vetted,
stays a JSON object: its text is inside JSON strings and cannot pass for a heading or a row.
"""

from __future__ import annotations

from collections.abc import Iterable

import orjson

from service.core.normalize import clean_content

BLOCK_BREAK = "\n\n"


def one_line(text: str) -> str:
    """A stored content as one line: what is printable already is (no line break, tab or control)."""
    return text if text.isprintable() else clean_content(text)


def block(heading: str, lines: Iterable[str]) -> str:
    return heading + "\n" + "\n".join(lines)


def rows_block(heading: str, rows: Iterable[tuple[int | str, str]]) -> str:
    return block(heading, (f"{alias}\t{one_line(content)}" for alias, content in rows))


# Line breaks JSON leaves raw (orjson escapes only what RFC 8259 requires), which `str.splitlines`
# and many readers break lines at.
_RAW_BREAKS = str.maketrans({"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"})


def json_line(value: object) -> str:
    """Data that no text inside it can turn into prompt structure: every line break is escaped,
    U+2028, U+2029 and U+0085 included."""
    return orjson.dumps(value).decode().translate(_RAW_BREAKS)
