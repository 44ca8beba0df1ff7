"""Request and response bodies of the HTTP API (camelCase on the wire), with the seed's input rules."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator, model_validator
from pydantic.alias_generators import to_camel

from service.adapters.db.memory_repository import ItemRecord
from service.core.injection_prompt import MemoryHint
from service.core.model import MAX_MANUAL_CONTENT_CHARS, MAX_PROJECT_KEY_CHARS


class CamelModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


def _content(value: str) -> str:
    """5.3: trimmed, then 1–500 characters (a Chinese character counts as one)."""
    value = value.strip()
    if not value:
        raise ValueError("content must not be empty")
    if len(value) > MAX_MANUAL_CONTENT_CHARS:
        raise ValueError(f"content must be at most {MAX_MANUAL_CONTENT_CHARS} characters")
    return value


class CreateMemory(CamelModel):
    scope: Literal["USER", "PROJECT"]
    content: str = Field(max_length=4 * MAX_MANUAL_CONTENT_CHARS)
    project_key: str | None = Field(default=None, max_length=4 * MAX_PROJECT_KEY_CHARS)

    _check_content = field_validator("content")(_content)

    @model_validator(mode="after")
    def _project_key(self) -> CreateMemory:
        if self.scope == "USER":
            self.project_key = None  # a USER memory ignores any projectKey sent with it
            return self
        key = (self.project_key or "").strip()
        if not key:
            raise ValueError("projectKey is required for PROJECT memories")
        if len(key) > MAX_PROJECT_KEY_CHARS:
            raise ValueError(f"projectKey must be at most {MAX_PROJECT_KEY_CHARS} characters")
        self.project_key = key
        return self


class PatchMemory(CamelModel):
    content: str | None = Field(default=None, max_length=4 * MAX_MANUAL_CONTENT_CHARS)
    status: Literal["ACTIVE", "DISMISSED"] | None = None

    @field_validator("content")
    @classmethod
    def _check_content(cls, value: str | None) -> str | None:
        return None if value is None else _content(value)

    @model_validator(mode="after")
    def _something(self) -> PatchMemory:
        if self.content is None and self.status is None:
            raise ValueError("content or status is required")
        return self


class CaptureSetting(CamelModel):
    auto_capture_enabled: StrictBool


def _iso(value: datetime) -> str:
    return value.replace(tzinfo=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class MemoryItem(CamelModel):
    id: int
    scope: Literal["USER", "PROJECT"]
    project_key: str | None
    content: str
    source: Literal["AUTO", "MANUAL", "CONSOLIDATED"]
    status: Literal["ACTIVE", "DISMISSED"]
    origin_session_id: int | None
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
    origin_session_id: int | None
    model: str | None
    created_at: str

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
        }


class Deleted(CamelModel):
    id: int


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
