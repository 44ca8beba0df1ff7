"""The extraction path's two reads of the pool, one statement each, built once.

The read round, before the model call: is the event in the ledger, which model is configured (D10),
how many extractions the user had since a time (the daily budget), the comparison set and the
negative list (D13). The pool read, under the user's lock once the model answered: what `decide`
needs and nothing more (`PoolQuery`), so a full pool costs the locked transaction a few rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from service.adapters.db.prepared import Prepared
from service.adapters.db.tables import (
    EXTRACTION_MODEL_SETTING,
    memory_event_ledger,
    memory_item,
    memory_system_setting,
    memory_user_state,
)
from service.core.comparison_set import Shown
from service.core.model import (
    MACHINE_SOURCES,
    MAX_EXTRACTED_ITEMS,
    USER_GROUP,
    DismissedBy,
    Group,
    Scope,
    Status,
)
from service.core.pool_read import PoolQuery

t = memory_item
USER_ID: sa.BindParameter[int] = sa.bindparam("user_id")
# What D13 may show the model, D14 may demote and D15 may merge: machine-made (AUTO or CONSOLIDATED)
# and ACTIVE. The sources are literals in the SQL, not an expanding list, so the statement compiles once.
MACHINE_ACTIVE = sa.and_(
    t.c.status == Status.ACTIVE.value,
    t.c.source.in_([sa.literal(source) for source in sorted(s.value for s in MACHINE_SOURCES)]),
)
_USER = sa.and_(t.c.scope == Scope.USER.value, t.c.project_key == "")
# A project key arrives as the `project_key` parameter.
_PROJECT = sa.and_(t.c.scope == Scope.PROJECT.value, t.c.project_key == sa.bindparam("project_key"))


def _session_groups(with_project: bool) -> sa.ColumnElement[bool]:
    return sa.or_(_USER, _PROJECT) if with_project else _USER


# The read round's columns, by position: the head's five, then the row's. A row shown to the model
# carries no time (its order is by id, and a time costs the driver a conversion on every row), so a
# row with one is a dismissal, sorted by it.
_ROW_COLUMNS = (t.c.id, t.c.scope, t.c.project_key, t.c.content)
_ID, _SCOPE, _PROJECT_KEY, _CONTENT, _UPDATED_AT = 5, 6, 7, 8, 9


def _read_round(with_project: bool) -> sa.Select[Any]:
    """The one-row head LEFT JOINed to the rows, so an empty pool still answers the head. The
    negative list is the session's: the user's dismissals in its groups, the newest first, bounded."""
    ledger = memory_event_ledger
    # EXISTS typed as an integer: as a boolean, the driver's value would be converted on every row.
    processed = sa.type_coerce(sa.exists().where(ledger.c.event_id == sa.bindparam("event_id")), sa.Integer)
    head = sa.select(
        processed.label("processed"),
        sa.select(memory_system_setting.c.value)
        .where(memory_system_setting.c.setting_key == EXTRACTION_MODEL_SETTING)
        .scalar_subquery()
        .label("configured_model"),
        sa.select(sa.func.count())
        .select_from(ledger)
        .where(ledger.c.user_id == USER_ID, ledger.c.processed_at >= sa.bindparam("since"))
        .scalar_subquery()
        .label("recent_extractions"),
        sa.select(sa.func.min(ledger.c.processed_at))
        .where(ledger.c.user_id == USER_ID, ledger.c.processed_at >= sa.bindparam("since"))
        .scalar_subquery()
        .label("oldest_extraction"),
        sa.select(memory_user_state.c.removal_mark)
        .where(memory_user_state.c.user_id == USER_ID)
        .scalar_subquery()
        .label("removal_mark"),
    ).subquery("head")
    groups = _session_groups(with_project)
    dismissed = (
        sa.select(*_ROW_COLUMNS, t.c.updated_at)
        .where(
            t.c.user_id == USER_ID,
            groups,
            t.c.status == Status.DISMISSED.value,
            t.c.dismissed_by == DismissedBy.USER.value,
        )
        .order_by(t.c.updated_at.desc(), t.c.id.desc())
        .limit(sa.bindparam("dismissed_limit", type_=sa.Integer))
        .subquery("d")
    )
    shown = sa.select(*_ROW_COLUMNS, sa.null()).where(t.c.user_id == USER_ID, groups, MACHINE_ACTIVE)
    # The dismissals first: a UNION's columns take their types from its first member.
    rows = sa.union_all(dismissed.select(), shown).subquery("m")
    return sa.select(head, rows).select_from(head.outerjoin(rows, sa.true()))


READ_ROUND = {with_project: Prepared(_read_round(with_project)) for with_project in (False, True)}


@dataclass(frozen=True, slots=True)
class ExtractionInputs:
    processed: bool
    configured_model: str
    recent_extractions: int  # ledger rows of the user since the time asked for
    shown: list[Shown]
    user_dismissed: list[str]  # newest first, at most the limit asked for
    oldest_extraction: datetime | None = None  # of the ledger rows counted in `recent_extractions`
    removal_mark: int | None = None  # the user's lock row's (`memory_user_state`), None without one


def read_round_inputs(rows: Sequence[Sequence[Any]]) -> ExtractionInputs:
    """The read round's result, read by position (a full pool returns some 250 rows per event)."""
    shown: list[Shown] = []
    dismissed: list[Sequence[Any]] = []
    for r in rows:
        if r[_ID] is None:
            continue  # the head alone: no rows in the pool
        if r[_UPDATED_AT] is None:
            shown.append((r[_ID], r[_SCOPE], r[_PROJECT_KEY], r[_CONTENT]))
        else:
            dismissed.append(r)
    # A UNION keeps no order: the negative list is sorted again here.
    dismissed.sort(key=lambda r: (r[_UPDATED_AT], r[_ID]), reverse=True)
    head = rows[0]
    return ExtractionInputs(
        bool(head[0]),
        (head[1] or "").strip(),
        int(head[2] or 0),
        shown,
        [r[_CONTENT] for r in dismissed],
        _datetime(head[3]),
        None if head[4] is None else int(head[4]),
    )


def _datetime(value: Any) -> datetime | None:
    """A MIN() over a DATETIME column: SQLite's aggregate answers the stored text."""
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value))


def _oldest_machine_made(group: sa.ColumnElement[bool], limit: str) -> sa.Select[Any]:
    """A group's D14 victims in the order D14 takes them; the indexes on (user, scope or project,
    status, updated_at) serve it."""
    return (
        sa.select(t)
        .where(t.c.user_id == USER_ID, MACHINE_ACTIVE, group)
        .order_by(t.c.updated_at, t.c.id)
        .limit(sa.bindparam(limit, type_=sa.Integer))
        .subquery()
        .select()
    )


def _pool_read(with_project: bool) -> sa.Select[Any]:
    """The ACTIVE count, the referenced rows and the rows holding the candidates' hashes, and each
    group's oldest machine-made rows. Every list has a slot per possible candidate; a NULL fills a
    slot not needed, so one compiled statement serves every answer."""
    slots = range(MAX_EXTRACTED_ITEMS)
    references = [sa.bindparam(f"ref{i}", type_=sa.BigInteger) for i in slots]
    hashes = [sa.bindparam(f"hash{i}", type_=sa.String) for i in slots]
    count = (
        sa.select(sa.func.count())
        .select_from(t)
        .where(t.c.user_id == USER_ID, t.c.status == Status.ACTIVE.value)
        .scalar_subquery()
        .label("active_count")
    )
    head = sa.select(count).subquery("head")
    wanted = sa.select(t).where(
        t.c.user_id == USER_ID, sa.or_(t.c.id.in_(references), t.c.dedup_hash.in_(hashes))
    )
    parts = [wanted, _oldest_machine_made(_USER, "user_victims")]
    if with_project:
        parts.append(_oldest_machine_made(_PROJECT, "project_victims"))
    rows = sa.union_all(*parts).subquery("m")
    return sa.select(head, rows).select_from(head.outerjoin(rows, sa.true()))


POOL_READ = {with_project: Prepared(_pool_read(with_project)) for with_project in (False, True)}


def pool_read_params(user_id: int, project_key: str | None, query: PoolQuery) -> dict[str, Any]:
    assert len(query.references) <= MAX_EXTRACTED_ITEMS and len(query.hashes) <= MAX_EXTRACTED_ITEMS
    references, hashes = sorted(query.references), sorted(query.hashes)
    params: dict[str, Any] = {
        "user_id": user_id,
        "project_key": project_key,
        "user_victims": query.victims.get(USER_GROUP, 0),
        "project_victims": query.victims.get(Group(Scope.PROJECT, project_key or ""), 0),
    }
    for i in range(MAX_EXTRACTED_ITEMS):
        params[f"ref{i}"] = references[i] if i < len(references) else None
        params[f"hash{i}"] = hashes[i] if i < len(hashes) else None
    return params
