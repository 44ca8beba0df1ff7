"""The `task.finished` event contract; `schemas/task.finished.schema.json` is generated from it."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

BIGINT_MAX = 2**63 - 1


class TaskFinishedEvent(BaseModel):
    """Published by the task service when a session's task reaches a terminal phase.

    Strict: a number sent as a string, or a string sent as a number, is a broken producer and goes to
    the dead-letter topic rather than being guessed at.
    """

    model_config = ConfigDict(
        strict=True, extra="ignore", frozen=True, populate_by_name=True, title="TaskFinishedEvent"
    )

    event_id: str = Field(alias="eventId", min_length=1, max_length=128)
    occurred_at: AwareDatetime = Field(alias="occurredAt")
    session_id: int = Field(alias="sessionId", ge=1, le=BIGINT_MAX)
    user_id: int = Field(alias="userId", ge=1, le=BIGINT_MAX)
    phase: str = Field(min_length=1, max_length=32)
    session_type: str = Field(alias="sessionType", min_length=1, max_length=32)
    channel: str | None = Field(default=None, max_length=32)
    project_key: str | None = Field(default=None, alias="projectKey")
    last_user_message: str | None = Field(default=None, alias="lastUserMessage")
    last_assistant_message: str | None = Field(default=None, alias="lastAssistantMessage")


# The validator itself: `model_validate_json`'s wrapper costs the skip path a call per event.
_validate_json = TaskFinishedEvent.__pydantic_validator__.validate_json


def event_json_schema() -> dict[str, object]:
    """The JSON Schema consumers and producers share (camelCase field names)."""
    schema = TaskFinishedEvent.model_json_schema(by_alias=True, mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://mao.dev/schemas/task.finished.schema.json"
    return schema


@dataclass(frozen=True, slots=True)
class Undecodable:
    """Why a message cannot be an event: `reason` is a metric label, `detail` goes to the DLQ header."""

    reason: str
    detail: str


def decode_event(value: bytes | None, max_bytes: int) -> TaskFinishedEvent | Undecodable:
    """Bytes off the topic to an event, or the reason it belongs on the dead-letter topic."""
    if value is None:
        return Undecodable("empty", "message has no value")
    if len(value) > max_bytes:
        return Undecodable("too_large", f"{len(value)} bytes, limit {max_bytes}")
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Undecodable("invalid_utf8", str(exc))
    try:
        event: TaskFinishedEvent = _validate_json(text)
        return event
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        if errors and errors[0]["type"] == "json_invalid":
            return Undecodable("invalid_json", str(errors[0]["msg"]))
        summary = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in errors[:5]
        )
        return Undecodable("schema", summary[:500])
