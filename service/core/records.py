"""The records the repositories return and take: a memory as the API shows it, a list's filter, and
one line of a memory's history."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from service.core.model import MemoryRow, Scope, Status


@dataclass(frozen=True, slots=True, kw_only=True)
class ItemRecord(MemoryRow):
    """A memory as the API shows it: the decision fields and where it came from."""

    origin_session_id: int | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class ListFilter:
    scope: Scope | None = None
    project_key: str | None = None
    status: Status | None = None


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """Who changed what, and which conversation caused it, so a polluted memory can be traced."""

    action: str
    actor: str
    old_content: str | None = None
    new_content: str | None = None
    event_id: str | None = None
    session_id: int | None = None
    model: str | None = None
