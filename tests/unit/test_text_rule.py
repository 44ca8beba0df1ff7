"""One text rule at every entrance: what a user types is refused (400) when blank (nothing visible,
invisible characters included) or holding a control or direction character, what a machine made is
stripped of them, and a projectKey, an identifier, holding any control (tabs and line breaks
included), format or invisible character is no project (the fact goes to USER scope)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from service.core.extraction_answer import ParsedAnswer, parse_extraction_answer
from service.core.model import MAX_MANUAL_CONTENT_CHARS, MAX_PROJECT_KEY_CHARS
from service.core.normalize import hostile_character, key_problem, text_problem, trim
from service.core.project_keys import RobotKeys
from service.entrypoints.http.api_models import CreateProjectMemory, CreateUserMemory, PatchMemory


def refusal(
    model: type[CreateUserMemory | CreateProjectMemory | PatchMemory], body: dict[str, str]
) -> str | None:
    try:
        model.model_validate(body)
    except ValidationError as exc:
        return str(exc.errors()[0]["msg"])
    return None


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("报告\x00用中文", "must not contain control or direction characters (U+0000)"),
        ("报告\u202e用中文", "must not contain control or direction characters (U+202E)"),
        ("\x9b报告", "must not contain control or direction characters (U+009B)"),
        ("\u200b\u200b", "must not be blank"),
        (" \u2066\u2069 ", "must not contain control or direction characters (U+2066)"),
        ("a\x1cb", "must not contain control or direction characters (U+001C)"),
        ("a\x85b", "must not contain control or direction characters (U+0085)"),
        ("\x1c报告\x85", "must not contain control or direction characters (U+001C)"),  # never trimmed
        *((invisible, "must not be blank") for invisible in ["\u034f", "\ufe0f" * 3, "\u3164", "\u115f"]),
        *((invisible, "must not be blank") for invisible in ["\U000e0100", "\u180b", "\u17b4", "\u2800"]),
    ],
)
def test_typed_content_with_a_control_or_direction_character_or_nothing_visible_is_refused(
    content: str, message: str
) -> None:
    assert refusal(CreateUserMemory, {"scope": "USER", "content": content}) == f"Value error, {message}"
    assert refusal(PatchMemory, {"content": content}) == f"Value error, {message}"


def test_typed_whitespace_and_marks_stay_as_typed() -> None:
    body = CreateUserMemory.model_validate({"scope": "USER", "content": " 报告\n用\t中文\u200e "})
    assert body.content == "报告\n用\t中文\u200e"


@pytest.mark.parametrize(
    "key",
    [
        *["mao\x00", "\u2067mao", "\u200b", "mao\x1b[31m"],
        *["ma\no", "ma\to", "ma\x1co", "ma\x85o", "ma\u2028o", "ma\u200bo", "mao\ufe0f", "ma\u3164o"],
    ],
)
def test_a_project_key_with_a_control_format_or_invisible_character_is_no_project(key: str) -> None:
    assert RobotKeys().project(key) is None  # an event's fact then goes to USER scope
    body = {"scope": "PROJECT", "content": "事实", "projectKey": key}
    assert refusal(CreateProjectMemory, body) is not None


@given(st.text())
def test_every_entrance_refuses_or_strips_control_and_direction_characters(text: str) -> None:
    typed = refusal(CreateUserMemory, {"scope": "USER", "content": text})
    assert (typed is None) == (text_problem(trim(text), MAX_MANUAL_CONTENT_CHARS) is None)
    if typed is None:
        assert (
            hostile_character(CreateUserMemory.model_validate({"scope": "USER", "content": text}).content)
            is None
        )
    key = refusal(CreateProjectMemory, {"scope": "PROJECT", "content": "事实", "projectKey": text})
    assert (key is None) == (key_problem(trim(text), MAX_PROJECT_KEY_CHARS) is None)
    assert (RobotKeys().project(text) is None) == (key is not None)
    answer = parse_extraction_answer(json.dumps([{"type": "project", "content": text}]))
    assert isinstance(answer, ParsedAnswer)
    assert all(hostile_character(c.content or "") is None for c in answer.candidates)
