"""Which events reach the model (D2, D6, D8, D9, D11): pure checks in the order that costs least."""

from __future__ import annotations

from enum import StrEnum

from service.core.events import TaskFinishedEvent
from service.core.model import MIN_USER_MESSAGE_CHARS
from service.core.normalize import normalize

EXCLUDED_SESSION_TYPES = frozenset({"SUBAGENT", "SIDE_TASK"})


class Skip(StrEnum):
    """Why an event made no LLM call; the values are metric labels."""

    PHASE = "skipped_phase"
    SESSION_TYPE = "skipped_session_type"
    CAPTURE_OFF = "skipped_capture_off"
    SHORT = "skipped_short"


def static_skip(event: TaskFinishedEvent) -> Skip | None:
    """Checks that need nothing but the event: D2 (COMPLETED only), D6 (main sessions), D8/D11."""
    if event.phase != "COMPLETED":
        return Skip.PHASE
    if event.session_type in EXCLUDED_SESSION_TYPES:
        return Skip.SESSION_TYPE
    user = normalize(event.last_user_message or "")
    assistant = normalize(event.last_assistant_message or "")
    if not assistant or len(user) < MIN_USER_MESSAGE_CHARS:
        return Skip.SHORT
    return None
