"""The data a service prompt carries, read back from its blocks (`service/core/prompt_blocks.py`).

Scripted models and assertions read prompts as plain data: an extraction prompt as
`{"project", "existing": [{"id", "type", "content"}], "dismissed": [...], "conversation": {"user",
"assistant"}}`, a consolidation prompt as `{"group": "user" | "project KEY", "memories": [{"id",
"content"}]}`. An extraction prompt's changes (`service/core/prompt_layout.py`) are applied: its
`existing` are the rows the blocks list as the log last says them, in id order, without the ones it
says are gone, and its `dismissed` are the blocks' followed by the log's.
"""

from __future__ import annotations

import json
from typing import Any

from service.core import consolidation as c
from service.core import extraction_prompt as e
from service.core.prompt_blocks import BLOCK_BREAK

_ROW_TYPES = {e.USER_ROWS: "user", e.PROJECT_ROWS: "project"}


def prompt_data(text: str) -> dict[str, Any]:
    """The data of the user message of an extraction or a consolidation prompt."""
    blocks = dict(_split(b) for b in text.split(BLOCK_BREAK))
    if c.MEMORIES in blocks:
        return {"group": _group(text), "memories": _rows(blocks[c.MEMORIES])}
    turn = json.loads(blocks[e.CONVERSATION][0])
    existing = {
        row["id"]: {**row, "type": kind}
        for heading, kind in _ROW_TYPES.items()
        for row in _rows(blocks.get(heading, []))
    }
    dismissed = [_dismissed(line) for line in blocks.get(e.DISMISSED, [])]
    for line in blocks.get(e.CHANGES, []):
        alias, tab, rest = line.partition("\t")
        if alias == e.DISMISSED_MARK:
            dismissed.append(rest)
        elif not tab:
            assert existing.pop(int(alias), None) is not None, f"an unknown id gone: {line!r}"
        else:
            kind, tab, content = rest.partition("\t")
            assert tab and kind in _ROW_TYPES.values(), f"a change without its type: {line!r}"
            existing[int(alias)] = {"id": int(alias), "content": content, "type": kind}
    return {
        "project": turn["project"],
        "existing": [existing[alias] for alias in sorted(existing)],
        "dismissed": dismissed,
        "conversation": {"user": turn["user"], "assistant": turn["assistant"]},
    }


def _split(block: str) -> tuple[str, list[str]]:
    heading, _, body = block.partition("\n")
    return heading, body.split("\n") if body else []


def _rows(lines: list[str]) -> list[dict[str, Any]]:
    rows = []
    for line in lines:
        alias, tab, content = line.partition("\t")
        assert tab, f"a row without an id: {line!r}"
        rows.append({"id": int(alias), "content": content})
    return rows


def _dismissed(line: str) -> str:
    mark, tab, content = line.partition("\t")
    assert mark == e.DISMISSED_MARK and tab, f"a dismissed fact without its mark: {line!r}"
    return content


def _group(text: str) -> str:
    """ "user", or "project KEY" from the first line `Group: project "KEY"`."""
    name = text.partition("\n")[0].removeprefix(c.GROUP).strip()
    if name == "user":
        return name
    return "project " + str(json.loads(name.removeprefix("project ")))
