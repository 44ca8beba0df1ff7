"""Parsing the extraction model's answer with the guards of seed 5.6 step 4 and 10.1."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import StrEnum

from service.core.model import (
    MAX_EXTRACTED_CONTENT_CHARS,
    MAX_EXTRACTED_ITEMS,
    Action,
    Candidate,
    Scope,
)
from service.core.normalize import clean_content, identity

_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


class AnswerError(StrEnum):
    """Why a whole answer was dropped; the values are metric labels."""

    INVALID_JSON = "invalid_json"
    TOO_MANY_ITEMS = "too_many_items"


@dataclass(frozen=True, slots=True)
class ParsedAnswer:
    candidates: list[Candidate]
    dropped_items: int


def strip_fence(text: str) -> str:
    """Models often wrap JSON in a Markdown code fence; the fence is not part of the answer."""
    text = text.strip()
    match = _FENCE.match(text)
    return match.group(1) if match else text


def answer_list(text: str, wrapper: str) -> list[object] | None:
    """The answer's list: the seed's bare array, or the array under `wrapper` in an object (what
    structured output asks for), inside a code fence or prose or not. None when there is none."""
    text = strip_fence(text)
    data = _first_json(text)
    if isinstance(data, dict) and set(data) == {wrapper}:
        data = data[wrapper]
    return data if isinstance(data, list) else None


def _first_json(text: str) -> object:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        pass
    decoder = json.JSONDecoder()
    for start in sorted(i for i in (text.find("["), text.find("{")) if i >= 0):
        try:
            return decoder.raw_decode(text, start)[0]
        except (ValueError, RecursionError):
            continue
    return None


def parse_extraction_answer(text: str) -> ParsedAnswer | AnswerError:
    """Whole-answer guards first (bad JSON, not a list, over 3 items), then per-item guards."""
    data = answer_list(text, "memories")
    if data is None:
        return AnswerError.INVALID_JSON
    if len(data) > MAX_EXTRACTED_ITEMS:
        return AnswerError.TOO_MANY_ITEMS
    candidates = [c for c in (_parse_item(item) for item in data) if c is not None]
    return ParsedAnswer(candidates=candidates, dropped_items=len(data) - len(candidates))


def _parse_item(item: object) -> Candidate | None:
    if not isinstance(item, dict):
        return None
    kind = item.get("type")
    if not isinstance(kind, str) or kind.lower() not in {"user", "project"}:
        return None
    raw_action = item.get("action")
    # 10.1: a missing or unknown action is an insert (the pre-D13 protocol had no action).
    action = Action(raw_action) if raw_action in {a.value for a in Action} else Action.INSERT
    content = _clean(item.get("content"))
    if action is not Action.TOUCH and content is None:
        return None
    return Candidate(
        type=Scope.PROJECT if kind.lower() == "project" else Scope.USER,
        action=action,
        content=content,
        existing_alias=item.get("existingId"),
    )


def _clean(value: object) -> str | None:
    """Blank by the identity rule (which drops fillers and variation selectors `clean_content`
    keeps: all blanks share one hash) or over 120 characters after cleaning drops the item, never
    truncates it."""
    if not isinstance(value, str):
        return None
    content = clean_content(value)
    if not identity(content) or len(content) > MAX_EXTRACTED_CONTENT_CHARS:
        return None
    return content
