from typing import Any

import pytest

from service.core.events import TaskFinishedEvent
from service.core.filters import Skip, input_skip, trigger_skip
from tests.conftest import event_payload


def event(**overrides: Any) -> TaskFinishedEvent:
    return TaskFinishedEvent.model_validate(
        event_payload(1, 1, occurredAt="2026-12-02T10:00:00+00:00", **overrides), strict=False
    )


def test_completed_main_session_with_a_real_message_passes() -> None:
    assert trigger_skip(event()) is None and input_skip(event()) is None


@pytest.mark.parametrize("phase", ["FAILED", "CANCELLED", "RUNNING", "completed"])
def test_only_completed_triggers_extraction(phase: str) -> None:
    assert trigger_skip(event(phase=phase)) is Skip.PHASE


@pytest.mark.parametrize("session_type", ["SUBAGENT", "SIDE_TASK"])
def test_subagent_and_side_task_never_trigger(session_type: str) -> None:
    assert trigger_skip(event(sessionType=session_type)) is Skip.SESSION_TYPE


@pytest.mark.parametrize("session_type", ["MAIN", "SCHEDULED", "CHAT"])
def test_any_other_session_type_is_a_main_session(session_type: str) -> None:
    assert trigger_skip(event(sessionType=session_type)) is None


def test_user_message_under_20_characters_after_normalization_short_circuits() -> None:
    nineteen = "一二三四五 六七八九十 一二三四五六七"
    assert len(nineteen.replace(" ", "")) + 2 == 19
    assert input_skip(event(lastUserMessage=f"  {nineteen}   ")) is Skip.SHORT
    assert input_skip(event(lastUserMessage=nineteen + "八")) is None


@pytest.mark.parametrize("field", ["lastUserMessage", "lastAssistantMessage"])
def test_a_missing_message_short_circuits(field: str) -> None:
    assert input_skip(event(**{field: None})) is Skip.SHORT
    assert input_skip(event(**{field: "   "})) is Skip.SHORT
