"""Request and response bodies of the HTTP API (camelCase on the wire), with the seed's input rules."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    GetPydanticSchema,
    StrictBool,
    WithJsonSchema,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import core_schema

from service.app.model_setting import ModelSettingView
from service.core.events import BIGINT_MAX, ID_PATTERN
from service.core.injection_prompt import MemoryHint
from service.core.model import MAX_MANUAL_CONTENT_CHARS, MAX_MODEL_NAME_CHARS, MAX_PROJECT_KEY_CHARS
from service.core.model_rejections import Rejections
from service.core.normalize import (
    char_class,
    hides_in_identifier,
    is_hostile,
    is_visible,
    key_problem,
    text_problem,
    trim,
)
from service.core.records import ItemRecord

_SURROGATE = re.compile(r"[\ud800-\udfff]")


def _has_lone_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        return _SURROGATE.search(value) is not None
    if isinstance(value, dict):
        return any(_has_lone_surrogate(k) or _has_lone_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_lone_surrogate(v) for v in value)
    return False


class CamelModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        """JSON's `\\ud800` escape (and, through the decoder's surrogatepass, its UTF-8 bytes) yields a
        lone surrogate that no database column can store: rejected here, as the 400 it is."""
        if _has_lone_surrogate(data):
            raise ValueError("invalid Unicode: a lone surrogate is not a character")
        return data


# The stored-text rule (service/core/normalize.py) as a pattern: no control or direction character
# anywhere, and a visible one somewhere. ECMA's \s lacks U+001C-U+001F and U+0085, which Python's
# has; they are controls, refused anywhere under either dialect.
# A project key is an identifier: nothing invisible in it but spaces.
_HOSTILE = char_class(is_hostile)
_VISIBLE = f"[^\\s{char_class(lambda ch: not is_visible(ch))}]"
_HIDDEN = char_class(hides_in_identifier)
TEXT_PATTERN = f"^[^{_HOSTILE}]*{_VISIBLE}[^{_HOSTILE}]*$"
KEY_PATTERN = f"^[^{_HIDDEN}]*{_VISIBLE}[^{_HIDDEN}]*$"


def _trimmed(limit: int, problem: Callable[[str, int], str | None], pattern: str) -> Any:
    """5.3: trimmed of whitespace (`trim`: Python's notion, without its controls), then `problem`'s
    rule: 1–`limit` characters
    (a Chinese character counts as one), not blank, no control or direction character (refused,
    not removed: the user sees what was typed). The schema states the same rule for generators and
    clients, blank as "only whitespace"."""

    def check(value: str) -> str:
        value = trim(value)
        if (found := problem(value, limit)) is not None:
            raise ValueError(found)
        return value

    schema = {"type": "string", "minLength": 1, "maxLength": limit, "pattern": pattern}
    return (AfterValidator(check), WithJsonSchema(schema))


Content = Annotated[str, *_trimmed(MAX_MANUAL_CONTENT_CHARS, text_problem, TEXT_PATTERN)]
ProjectKey = Annotated[str, *_trimmed(MAX_PROJECT_KEY_CHARS, key_problem, KEY_PATTERN)]


class CreateUserMemory(CamelModel):
    scope: Literal["USER"]
    content: Content
    project_key: str | None = Field(default=None, description="ignored for USER memories")


class CreateProjectMemory(CamelModel):
    scope: Literal["PROJECT"]
    content: Content
    project_key: ProjectKey


CreateMemory = Annotated[CreateUserMemory | CreateProjectMemory, Field(discriminator="scope")]


def _patch_schema(schema: dict[str, Any]) -> None:
    """Document what the validator enforces: send content, status or both, never null."""
    for name in ("content", "status"):
        prop = schema["properties"][name]
        prop["anyOf"] = [option for option in prop["anyOf"] if option.get("type") != "null"]
        prop.pop("default", None)
    schema["anyOf"] = [{"required": ["content"]}, {"required": ["status"]}]


class PatchMemory(CamelModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", json_schema_extra=_patch_schema
    )

    content: Content | None = None
    status: Literal["ACTIVE", "DISMISSED"] | None = None

    @model_validator(mode="after")
    def _something(self) -> PatchMemory:
        if self.content is None and self.status is None:
            raise ValueError("content or status is required")
        return self


ModelName = Annotated[
    str, Field(max_length=MAX_MODEL_NAME_CHARS, pattern=r"^$|^[A-Za-z0-9][A-Za-z0-9._:/@+-]*$")
]


class ExtractionModelSetting(CamelModel):
    """D10: empty means MEMORY_DEFAULT_MODEL; otherwise a litellm model name. `probe`: make one tiny
    call to the model first, and keep the old setting if it fails."""

    extraction_model_id: ModelName
    probe: StrictBool = False


class ModelRejections(CamelModel):
    """Events dead-lettered as `model_rejected` since the model was last set, and the last one's
    error: `lastErrorKind` is "HTTP <status>" as the provider answered, or "rejected" (refused by
    litellm before sending)."""

    count: int
    last_error_kind: str
    last_error: str
    last_at: str

    @classmethod
    def of(cls, tally: Rejections | None) -> dict[str, Any] | None:
        if tally is None:
            return None
        return {
            "count": tally.count,
            "lastErrorKind": tally.kind,
            "lastError": tally.error,
            "lastAt": _iso(tally.at),
        }


class ExtractionModelView(CamelModel):
    extraction_model_id: ModelName
    effective_model: str
    rejections: ModelRejections | None = None

    @classmethod
    def of(cls, view: ModelSettingView) -> dict[str, Any]:
        """The answer of both settings routes and of `mao-memory settings`."""
        return {
            "extractionModelId": view.configured,
            "effectiveModel": view.effective,
            "rejections": ModelRejections.of(view.rejections),
        }


class CaptureSetting(CamelModel):
    auto_capture_enabled: StrictBool


# Every int64 id in an answer is a JSON string of decimal digits: a JavaScript number is exact only
# to 2^53, and `JSON.parse` reads 9007199254740995 as …996. Requests take the event's rule instead
# (`service.core.events.BigintId`: a JSON integer or its canonical decimal string). pydantic-core's
# own to-string serializer: a `PlainSerializer(str)` calls back into Python per id, which doubled the
# time to encode a page of 100 memories.
_ID_OUT_CORE_SCHEMA = core_schema.int_schema(serialization=core_schema.to_string_ser_schema(when_used="json"))
Id = Annotated[
    int,
    GetPydanticSchema(lambda _source, _handler: _ID_OUT_CORE_SCHEMA),
    WithJsonSchema(
        {
            "type": "string",
            "pattern": ID_PATTERN,
            "description": f"an id in decimal: ASCII digits, no sign or leading zero, at most {BIGINT_MAX}",
            "examples": ["9007199254740993"],
        },
        mode="serialization",
    ),
]


def _iso(value: datetime) -> str:
    return value.replace(tzinfo=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class MemoryItem(CamelModel):
    id: Id
    scope: Literal["USER", "PROJECT"]
    project_key: str | None
    content: str
    source: Literal["AUTO", "MANUAL", "CONSOLIDATED"]
    status: Literal["ACTIVE", "DISMISSED"]
    dismissed_by: Literal["USER", "CAPACITY"] | None = Field(
        description="why a DISMISSED memory is dismissed: the user, or room for newer facts (restored "
        "when the fact comes back); null while ACTIVE"
    )
    origin_session_id: Id | None
    created_at: str
    updated_at: str

    @classmethod
    def of(cls, item: ItemRecord) -> dict[str, Any]:
        return {
            "id": item.id,
            "scope": item.scope.value,
            "projectKey": item.project_key or None,
            "content": item.content,
            "source": item.source.value,
            "status": item.status.value,
            "dismissedBy": item.dismissed_by.value if item.dismissed_by else None,
            "originSessionId": item.origin_session_id,
            "createdAt": _iso(item.created_at),
            "updatedAt": _iso(item.updated_at),
        }


class MemoryPage(CamelModel):
    items: list[MemoryItem]
    total: int
    page: int
    page_size: int


class HistoryItem(CamelModel):
    action: str
    actor: str
    old_content: str | None
    new_content: str | None
    event_id: str | None
    origin_session_id: Id | None
    model: str | None
    created_at: str
    count: int = Field(description="how many consecutive touches this row stands for (1 for other actions)")
    last_at: str = Field(description="time of the last of them; createdAt is the first's")
    content_erased: bool = Field(
        description="true once the user deleted the memory: oldContent and newContent are null for good"
    )
    content_erased_at: str | None = Field(description="when the user's delete erased the texts")

    @classmethod
    def of(cls, row: Any) -> dict[str, Any]:
        return {
            "action": row.action,
            "actor": row.actor,
            "oldContent": row.old_content,
            "newContent": row.new_content,
            "eventId": row.event_id,
            "originSessionId": row.session_id,
            "model": row.model,
            "createdAt": _iso(row.created_at),
            "count": row.repeat_count,
            "lastAt": _iso(row.last_at or row.created_at),
            "contentErased": row.content_erased_at is not None,
            "contentErasedAt": _iso(row.content_erased_at) if row.content_erased_at else None,
        }


class ExtractionUsage(CamelModel):
    user_id: Id
    extractions_last_24h: int = Field(
        alias="extractionsLast24h",
        description="the user's events the model answered in the last 24 hours: what the budget counts",
    )


class Deleted(CamelModel):
    id: Id


class UserErased(CamelModel):
    user_id: Id
    removed: dict[str, int] = Field(
        description="rows removed per table: history, memories, capturePreference, projects, ledger, "
        "userState; all 0 when nothing of the user was left"
    )


class InjectedMemory(CamelModel):
    scope: Literal["USER", "PROJECT"]
    project_key: str | None
    content: str

    @classmethod
    def of(cls, hint: MemoryHint) -> dict[str, Any]:
        return {"scope": hint.scope.value, "projectKey": hint.project_key, "content": hint.content}


class Injection(CamelModel):
    memories: list[InjectedMemory]
    prompt: str
