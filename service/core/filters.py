"""Which events reach the model (D2, D6, D8, D9, D11): pure checks in the order that costs least."""

from __future__ import annotations

from enum import StrEnum

from service.core.events import TaskFinishedEvent
from service.core.model import MIN_USER_MESSAGE_CHARS
from service.core.normalize import has_visible_text, identity

EXCLUDED_SESSION_TYPES = frozenset({"SUBAGENT", "SIDE_TASK"})


class Skip(StrEnum):
    """Why an event made no LLM call; the values are metric labels."""

    PHASE = "skipped_phase"
    SESSION_TYPE = "skipped_session_type"
    CAPTURE_OFF = "skipped_capture_off"
    SHORT = "skipped_short"


def trigger_skip(event: TaskFinishedEvent) -> Skip | None:
    """The trigger conditions the event alone decides: D2 (COMPLETED only), D6 (main sessions).

    The capture switch (D9) comes next, then `input_skip`: seed 5.6's order, which also puts the
    cached switch ahead of scanning the messages.
    """
    if event.phase != "COMPLETED":
        return Skip.PHASE
    if event.session_type in EXCLUDED_SESSION_TYPES:
        return Skip.SESSION_TYPE
    return None


def input_skip(event: TaskFinishedEvent) -> Skip | None:
    """D8 (both messages present) and D11 (a user message under 20 visible characters: its identity)."""
    if len(identity(event.last_user_message or "")) < MIN_USER_MESSAGE_CHARS:
        return Skip.SHORT
    if not has_visible_text(event.last_assistant_message or ""):
        return Skip.SHORT
    return None
