"""The `task.finished` event contract; `schemas/task.finished.schema.json` is generated from it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    GetPydanticSchema,
    ValidationError,
    WithJsonSchema,
)
from pydantic_core import core_schema

from service.core.normalize import char_class, hides_in_identifier, identifier_problem

BIGINT_MAX = 2**63 - 1


def decimal_pattern(limit: int) -> str:
    """An ECMA-262 (and Rust regex) pattern for the canonical decimal strings of 1 to `limit`.

    JSON Schema cannot bound a string's value, but a pattern can: the schema then refuses
    "9223372036854775808" exactly as the model does. Canonical: ASCII digits only, no sign, no
    leading zero, no space.
    """
    digits = str(limit)
    if len(digits) == 1:
        return f"^[1-{digits}]$"
    alternatives = [f"[1-9][0-9]{{0,{len(digits) - 2}}}"]  # every shorter number
    # A number of the limit's length is below it when it first differs from it by a smaller digit.
    for i, digit in enumerate(digits):
        low, high = (1 if i == 0 else 0), int(digit) - 1
        if high < low:
            continue
        smaller = str(low) if high == low else f"[{low}-{high}]"
        rest = len(digits) - i - 1
        alternatives.append(digits[:i] + smaller + (f"[0-9]{{{rest}}}" if rest else ""))
    alternatives.append(digits)
    return "^(?:" + "|".join(alternatives) + ")$"


ID_PATTERN = decimal_pattern(BIGINT_MAX)

# sessionId / userId: a BIGINT id as a JSON integer, or as the decimal string that JavaScript
# producers (a JS number stops being exact at 2^53) and protobuf's JSON mapping of int64 send.
# Both branches stay in pydantic-core, and `int()` only ever sees ASCII digits the pattern passed.
_ID_CORE_SCHEMA = core_schema.union_schema(
    [
        core_schema.int_schema(ge=1, le=BIGINT_MAX, strict=True),
        core_schema.no_info_after_validator_function(
            int, core_schema.str_schema(pattern=ID_PATTERN, strict=True)
        ),
    ],
    mode="left_to_right",
    custom_error_type="id_type",
    custom_error_message=f"Input should be an integer from 1 to {BIGINT_MAX} or its canonical decimal string",
)
_ID_JSON_SCHEMA: dict[str, object] = {
    "oneOf": [
        {"type": "integer", "minimum": 1, "maximum": BIGINT_MAX},
        {
            "type": "string",
            "pattern": ID_PATTERN,
            "description": f"the id in decimal: ASCII digits, no sign or leading zero, at most {BIGINT_MAX}",
        },
    ]
}
BigintId = Annotated[
    int,
    GetPydanticSchema(lambda _source, _handler: _ID_CORE_SCHEMA),
    WithJsonSchema(_ID_JSON_SCHEMA),
]


def _identifier(value: str) -> str:
    if (problem := identifier_problem(value)) is not None:
        raise ValueError(problem)
    return value


def _identifier_schema(schema: dict[str, Any]) -> None:
    """The pattern is built when the schema is, never on the consumer's path."""
    schema["pattern"] = f"^[^{char_class(hides_in_identifier)}]+$"
    schema["description"] = "no control (line breaks included), format or invisible character"


# eventId comes back from the history endpoints: an identifier, no control (line breaks included),
# format, direction or invisible character (service/core/normalize.py).
EventId = Annotated[
    str,
    Field(min_length=1, max_length=128, json_schema_extra=_identifier_schema),
    AfterValidator(_identifier),
]


class TaskFinishedEvent(BaseModel):
    """Published by the task service when a session's task reaches a terminal phase.

    Strict: a value of the wrong JSON type is a broken producer and goes to the dead-letter topic
    rather than being guessed at. The one exception is the two ids, which may also arrive as
    canonical decimal strings, the only exact form of an int64 that JavaScript can send.
    """

    model_config = ConfigDict(
        strict=True, extra="ignore", frozen=True, populate_by_name=True, title="TaskFinishedEvent"
    )

    event_id: EventId = Field(alias="eventId")
    occurred_at: AwareDatetime = Field(alias="occurredAt")
    session_id: BigintId = Field(alias="sessionId")
    user_id: BigintId = Field(alias="userId")
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


# The largest event value the consumer takes; a larger one is dead-lettered unread.
MAX_EVENT_BYTES = 1024 * 1024


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
        # The bytes as they came: the parser refuses every ill-formed UTF-8 sequence as Python's
        # strict codec does (tests/unit/test_event_schema.py), so no text copy is made per event.
        event: TaskFinishedEvent = _validate_json(value)
        return event
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        if errors and errors[0]["type"] == "json_invalid":
            try:
                value.decode("utf-8")
            except UnicodeDecodeError as not_text:
                return Undecodable("invalid_utf8", str(not_text))
            return Undecodable("invalid_json", str(errors[0]["msg"]))
        summary = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in errors[:5]
        )
        return Undecodable("schema", summary[:500])
