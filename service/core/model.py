"""The memory domain's plain data: enums, limits and the rows the decision functions reason over."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum


class Scope(StrEnum):
    USER = "USER"
    PROJECT = "PROJECT"


class Source(StrEnum):
    AUTO = "AUTO"
    MANUAL = "MANUAL"
    CONSOLIDATED = "CONSOLIDATED"


# Machine-made rows: the model may touch, update, demote (D14) and merge (D15) them. MANUAL rows
# belong to the user and are never changed by the machine.
MACHINE_SOURCES = frozenset({Source.AUTO, Source.CONSOLIDATED})


class Status(StrEnum):
    ACTIVE = "ACTIVE"
    DISMISSED = "DISMISSED"


class DismissedBy(StrEnum):
    """Why a row is DISMISSED. Only the user's rejection is final (D3) and forms the negative list;
    a capacity demotion (D14) is undone when the fact comes back."""

    USER = "USER"
    CAPACITY = "CAPACITY"


class Action(StrEnum):
    INSERT = "insert"
    TOUCH = "touch"
    UPDATE = "update"


# D7 / D11 / seed 5.6: fixed product limits, not configuration.
MAX_ACTIVE_PER_USER = 200
MAX_MANUAL_CONTENT_CHARS = 500
MAX_EXTRACTED_CONTENT_CHARS = 120
MAX_EXTRACTED_ITEMS = 3
MIN_USER_MESSAGE_CHARS = 20
MAX_PROJECT_KEY_CHARS = 128
# memory_history.model and the D10 setting hold a litellm model name of at most this many characters.
MAX_MODEL_NAME_CHARS = 128
INJECT_PROJECT_LIMIT = 12
INJECT_USER_LIMIT = 8


@dataclass(frozen=True, slots=True)
class Group:
    """A dedup group: (scope, projectKey); USER rows have projectKey ''."""

    scope: Scope
    project_key: str = ""


USER_GROUP = Group(Scope.USER, "")


def session_groups(project_key: str | None) -> tuple[Group, ...]:
    """The groups an extraction works on (and consolidation tidies after it, in this order): the
    USER group, and the session's project if it has one."""
    return (USER_GROUP, Group(Scope.PROJECT, project_key)) if project_key else (USER_GROUP,)


@dataclass(frozen=True, slots=True)
class MemoryRow:
    id: int
    scope: Scope
    project_key: str
    content: str
    source: Source
    status: Status
    dedup_hash: str
    updated_at: datetime
    dismissed_by: DismissedBy | None = None

    @property
    def group(self) -> Group:
        return Group(self.scope, self.project_key)

    @property
    def machine_active(self) -> bool:
        return self.status is Status.ACTIVE and self.source in MACHINE_SOURCES


@dataclass(frozen=True, slots=True)
class Candidate:
    """One fact as the model proposed it, after the answer's guards; `existing_alias` is the model's id."""

    type: Scope
    action: Action
    content: str | None
    existing_alias: object = None
