"""The records the repositories return and take: a memory as the API shows it, a list's filter, and
one line of a memory's history."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

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


class HistoryAction(StrEnum):
    """`memory_history.action`: what a change did. The values are stored and shown by the history
    API (and named in the console's labels), so they never change."""

    # by the machine: an extraction (D13, D14) or a consolidation run (D15)
    INSERT = "insert"
    TOUCH = "touch"
    UPDATE = "update"
    DEMOTE = "demote"  # a capacity demotion (D14), undone by a restore
    MERGE = "merge"
    DROP = "drop"
    # by the user (and `delete` by a migration); `restore` by either
    CREATE = "create"
    EDIT = "edit"
    DISMISS = "dismiss"
    RESTORE = "restore"
    DELETE = "delete"


class HistoryActor(StrEnum):
    """`memory_history.actor`: who made a change. Stored and shown like the actions."""

    AUTO = "auto"  # an extraction
    USER = "user"
    CONSOLIDATOR = "consolidator"
    MIGRATION = "migration"  # written by a schema migration's own SQL


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """Who changed what, and which conversation caused it, so a polluted memory can be traced."""

    action: HistoryAction
    actor: HistoryActor
    old_content: str | None = None
    new_content: str | None = None
    event_id: str | None = None
    session_id: int | None = None
    model: str | None = None
