"""Queries on `memory_item` and its append-only `memory_history`; every one is scoped by user_id (D4)."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from service.adapters.db.extraction_reads import (
    MACHINE_ACTIVE,
    POOL_READ,
    READ_ROUND,
    USER_ID,
    ExtractionInputs,
    pool_read_params,
    read_round_inputs,
)
from service.adapters.db.prepared import Prepared, Statements
from service.adapters.db.tables import memory_history, memory_item
from service.core.model import DismissedBy, Group, MemoryRow, Scope, Source, Status
from service.core.pool_read import PoolQuery
from service.core.records import HistoryAction, HistoryEntry, ItemRecord, ListFilter

t = memory_item
_MACHINE_ACTIVE_IN_GROUP = sa.select(t).where(
    t.c.user_id == USER_ID,
    MACHINE_ACTIVE,
    t.c.scope == sa.bindparam("scope"),
    t.c.project_key == sa.bindparam("project_key"),
)
_BY_HASHES = sa.select(t).where(
    t.c.user_id == USER_ID, t.c.dedup_hash.in_(sa.bindparam("hashes", expanding=True))
)
_ACTIVE_COUNT = (
    sa.select(sa.func.count()).select_from(t).where(t.c.user_id == USER_ID, t.c.status == Status.ACTIVE.value)
)
_ITEM_COLUMNS = (
    "user_id",
    "scope",
    "project_key",
    "content",
    "source",
    "status",
    "dedup_hash",
    "origin_session_id",
    "created_at",
    "updated_at",
)
_INSERT_ITEM = Prepared(t.insert(), _ITEM_COLUMNS)
_HISTORY_COLUMNS = (
    "memory_id",
    "user_id",
    "action",
    "actor",
    "old_content",
    "new_content",
    "event_id",
    "session_id",
    "model",
    "created_at",
)
_INSERT_HISTORY = Prepared(memory_history.insert(), _HISTORY_COLUMNS)
# An UPDATE's parameters are named apart from its columns: Core reserves a column's name for its SET.
_ROW = sa.and_(t.c.user_id == sa.bindparam("owner"), t.c.id == sa.bindparam("row_id"))
_NOW: sa.BindParameter[datetime] = sa.bindparam("now")
_TOUCH = Prepared(t.update().where(_ROW).values(updated_at=_NOW))
_SET_STATUS = Prepared(
    t.update()
    .where(_ROW)
    .values(status=sa.bindparam("new_status"), dismissed_by=sa.bindparam("why"), updated_at=_NOW)
)
_NEW_CONTENT = {"content": sa.bindparam("text"), "dedup_hash": sa.bindparam("digest"), "updated_at": _NOW}
_UPDATE_CONTENT = Prepared(t.update().where(_ROW).values(**_NEW_CONTENT))
_UPDATE_CONTENT_AND_SOURCE = Prepared(
    t.update().where(_ROW).values(**_NEW_CONTENT, source=sa.bindparam("new_source"))
)


def _window(scope: Scope, key_param: str, limit_param: str) -> sa.Select[Any]:
    return (
        sa.select(t.c.id, t.c.scope, t.c.project_key, t.c.content, t.c.updated_at)
        .where(
            t.c.user_id == sa.bindparam("user_id"),
            t.c.scope == scope.value,
            t.c.project_key == sa.bindparam(key_param),
            t.c.status == Status.ACTIVE.value,
        )
        .order_by(t.c.updated_at.desc(), t.c.id.desc())
        .limit(sa.bindparam(limit_param, type_=sa.Integer))
    )


_PROJECT_WINDOW = _window(Scope.PROJECT, "project_key", "project_limit")
_USER_WINDOW = _window(Scope.USER, "user_key", "user_limit")
# MySQL runs each parenthesised window straight into the result: half the server's work of wrapping
# them in derived tables, which SQLite needs (it takes no parentheses around a UNION's members).
_INJECTION = Prepared(
    sa.union_all(_PROJECT_WINDOW.subquery("p").select(), _USER_WINDOW.subquery("u").select()),
    variants={"mysql": sa.union_all(_PROJECT_WINDOW, _USER_WINDOW)},
)


# Enum members by value: a dict lookup per column, not an Enum call, for the hundreds of rows a full
# pool reads on every extraction.
_SCOPES = {m.value: m for m in Scope}
_SOURCES = {m.value: m for m in Source}
_STATUSES = {m.value: m for m in Status}
_DISMISSED_BY: dict[str | None, DismissedBy | None] = {None: None, **{m.value: m for m in DismissedBy}}


def to_record(r: Any) -> ItemRecord:
    return ItemRecord(
        id=r.id,
        scope=_SCOPES[r.scope],
        project_key=r.project_key,
        content=r.content,
        source=_SOURCES[r.source],
        status=_STATUSES[r.status],
        dedup_hash=r.dedup_hash,
        dismissed_by=_DISMISSED_BY[r.dismissed_by],
        origin_session_id=r.origin_session_id,
        created_at=r.created_at,
        updated_at=r.updated_at,
    )


@dataclass(frozen=True, slots=True)
class PoolRead:
    """What the pool read under the lock found: the user's ACTIVE count and the rows asked for."""

    active_count: int
    rows: list[MemoryRow]


def _list_clause(where: ListFilter, user_id: int) -> sa.ColumnElement[bool]:
    conditions = [t.c.user_id == user_id]
    if where.scope is not None:
        conditions.append(t.c.scope == where.scope.value)
    if where.project_key is not None:
        conditions.append(t.c.project_key == where.project_key)
    if where.status is not None:
        conditions.append(t.c.status == where.status.value)
    return sa.and_(*conditions)


class MemoryRepository:
    def __init__(self, statements: Statements) -> None:
        self._statements = statements

    @property
    def conn(self) -> AsyncConnection:
        return self._statements.conn

    async def extraction_inputs(
        self, event_id: str, user_id: int, project_key: str | None, dismissed_limit: int, since: datetime
    ) -> ExtractionInputs:
        """The read round: the ledger check, the D10 model, the user's extractions since `since`,
        the comparison set and the newest `dismissed_limit` dismissals of the session's groups."""
        params = {
            "event_id": event_id,
            "user_id": user_id,
            "project_key": project_key,
            "since": since,
            "dismissed_limit": dismissed_limit,
        }
        return read_round_inputs(await self._statements.tuples(READ_ROUND[bool(project_key)], params))

    async def pool(self, user_id: int, project_key: str | None, query: PoolQuery) -> PoolRead:
        """Under the lock: what `decide` needs of the pool (`PoolQuery`), in one round trip."""
        params = pool_read_params(user_id, project_key, query)
        result = await self._statements.rows(POOL_READ[bool(project_key)], params)
        rows = {r.id: to_record(r) for r in result if r.id is not None}
        return PoolRead(int(result[0].active_count), list(rows.values()))

    async def machine_active_in_group(self, user_id: int, group: Group) -> list[MemoryRow]:
        """One group's machine-made ACTIVE rows: what D15 consolidates."""
        rows = await self.conn.execute(
            _MACHINE_ACTIVE_IN_GROUP,
            {"user_id": user_id, "scope": group.scope.value, "project_key": group.project_key},
        )
        return [to_record(r) for r in rows]

    async def by_hashes(self, user_id: int, hashes: Iterable[str]) -> dict[str, MemoryRow]:
        wanted = sorted(set(hashes))
        if not wanted:
            return {}
        rows = await self.conn.execute(_BY_HASHES, {"user_id": user_id, "hashes": wanted})
        return {r.dedup_hash: to_record(r) for r in rows}

    async def active_count(self, user_id: int) -> int:
        count = await self.conn.scalar(_ACTIVE_COUNT, {"user_id": user_id})
        return int(count or 0)

    async def active_in_group(self, user_id: int, group: Group) -> int:
        count = await self.conn.scalar(
            sa.select(sa.func.count())
            .select_from(t)
            .where(
                t.c.user_id == user_id,
                t.c.scope == group.scope.value,
                t.c.project_key == group.project_key,
                t.c.status == Status.ACTIVE.value,
            )
        )
        return int(count or 0)

    async def insert(
        self,
        user_id: int,
        group: Group,
        content: str,
        digest: str,
        source: Source,
        origin_session_id: int | None,
        now: datetime,
    ) -> int:
        written = await self._statements.write(
            _INSERT_ITEM,
            {
                "user_id": user_id,
                "scope": group.scope.value,
                "project_key": group.project_key,
                "content": content,
                "source": source.value,
                "status": Status.ACTIVE.value,
                "dedup_hash": digest,
                "origin_session_id": origin_session_id,
                "created_at": now,
                "updated_at": now,
            },
        )
        assert written.lastrowid is not None
        return written.lastrowid

    async def touch(self, user_id: int, row_id: int, now: datetime) -> None:
        await self._statements.write(_TOUCH, {"owner": user_id, "row_id": row_id, "now": now})

    async def update_content(
        self,
        user_id: int,
        row_id: int,
        content: str,
        digest: str,
        now: datetime,
        source: Source | None = None,
    ) -> None:
        params = {"owner": user_id, "row_id": row_id, "text": content, "digest": digest, "now": now}
        if source is None:
            await self._statements.write(_UPDATE_CONTENT, params)
        else:
            await self._statements.write(_UPDATE_CONTENT_AND_SOURCE, {**params, "new_source": source.value})

    async def set_status(
        self,
        user_id: int,
        row_id: int,
        status: Status,
        now: datetime,
        dismissed_by: DismissedBy | None = None,
    ) -> None:
        """`dismissed_by` says why a row goes DISMISSED; it is cleared when the row is ACTIVE again."""
        await self._statements.write(
            _SET_STATUS,
            {
                "owner": user_id,
                "row_id": row_id,
                "new_status": status.value,
                "why": dismissed_by.value if status is Status.DISMISSED and dismissed_by else None,
                "now": now,
            },
        )

    async def get(self, user_id: int, row_id: int) -> ItemRecord | None:
        found = (
            await self.conn.execute(sa.select(t).where(t.c.user_id == user_id, t.c.id == row_id))
        ).first()
        return to_record(found) if found is not None else None

    async def page(self, user_id: int, where: ListFilter, offset: int, limit: int) -> list[ItemRecord]:
        rows = await self.conn.execute(
            sa.select(t)
            .where(_list_clause(where, user_id))
            .order_by(t.c.updated_at.desc(), t.c.id.desc())
            .offset(offset)
            .limit(limit)
        )
        return [to_record(r) for r in rows]

    async def count(self, user_id: int, where: ListFilter) -> int:
        value = await self.conn.scalar(
            sa.select(sa.func.count()).select_from(t).where(_list_clause(where, user_id))
        )
        return int(value or 0)

    async def injection_window(
        self, user_id: int, project_key: str | None, project_limit: int, user_limit: int
    ) -> list[tuple[Scope, str, str]]:
        """PROJECT top N then USER top M in one round trip: a UNION ALL of two index-ordered scans
        (idx_memory_project / idx_memory_user), newest first within each."""
        result = await self._statements.rows(
            _INJECTION,
            {
                "user_id": user_id,
                "project_key": project_key or "",
                "user_key": "",
                "project_limit": project_limit if project_key else 0,
                "user_limit": user_limit,
            },
        )
        # A UNION promises no order: 'PROJECT' sorts before 'USER', each part newest first.
        rows = sorted(result, key=lambda r: (r.updated_at, r.id), reverse=True)
        rows.sort(key=lambda r: r.scope)
        return [(Scope(r.scope), r.project_key, r.content) for r in rows]

    async def delete(self, user_id: int, row_id: int) -> None:
        await self.conn.execute(t.delete().where(t.c.user_id == user_id, t.c.id == row_id))

    async def project_keys(self, user_id: int) -> list[str]:
        rows = await self.conn.execute(
            sa.select(t.c.project_key)
            .where(t.c.user_id == user_id, t.c.scope == Scope.PROJECT.value)
            .distinct()
        )
        return [r.project_key for r in rows]

    async def history_of(self, user_id: int, memory_id: int) -> list[Any]:
        h = memory_history
        rows = await self.conn.execute(
            sa.select(h).where(h.c.user_id == user_id, h.c.memory_id == memory_id).order_by(h.c.id)
        )
        return list(rows)

    async def history_texts(self, user_id: int, memory_ids: Collection[int]) -> set[str]:
        """Every text the memories' history rows still hold."""
        h = memory_history
        rows = await self.conn.execute(
            sa.select(h.c.old_content, h.c.new_content).where(
                h.c.user_id == user_id, h.c.memory_id.in_(sorted(memory_ids))
            )
        )
        return {text for r in rows for text in (r.old_content, r.new_content) if text is not None}

    async def worded(self, user_id: int, memory_ids: Collection[int]) -> dict[int, str | None]:
        """Those of the memories whose history holds their words still (a trail, none of it erased),
        each with its stored text, or None for a row no longer stored (merged away). A delete erases
        the trail of the row and of the rows merged into it (`erase_history`), and retention drops
        a deleted row's trail later: either way the row is not among them."""
        h = memory_history
        rows = await self.conn.execute(
            sa.select(h.c.memory_id, sa.func.max(t.c.content).label("content"))
            .select_from(h.outerjoin(t, sa.and_(t.c.id == h.c.memory_id, t.c.user_id == user_id)))
            .where(h.c.user_id == user_id, h.c.memory_id.in_(sorted(memory_ids)))
            .group_by(h.c.memory_id)
            .having(sa.func.count(h.c.content_erased_at) == 0)
        )
        return {r.memory_id: r.content for r in rows}

    async def merge_links(self, user_id: int) -> list[tuple[int, str]]:
        """Each row a consolidation merged away, with the text it was merged into: its MERGE row holds
        its own text and the merged one (the only link a merge leaves), and the row itself is gone."""
        h = memory_history
        rows = await self.conn.execute(
            sa.select(h.c.memory_id, h.c.new_content).where(
                h.c.user_id == user_id,
                h.c.action == HistoryAction.MERGE.value,
                h.c.old_content.is_not(None),
                h.c.new_content.is_not(None),
                ~sa.exists().where(t.c.user_id == user_id, t.c.id == h.c.memory_id),
            )
        )
        return [(r.memory_id, r.new_content) for r in rows]

    async def erase_history(self, user_id: int, memory_ids: Collection[int], now: datetime) -> int:
        """The memories' history keeps what happened and drops the words; the first erasure's time stays."""
        h = memory_history
        erased = await self.conn.execute(
            h.update()
            .where(h.c.user_id == user_id, h.c.memory_id.in_(sorted(memory_ids)))
            .values(
                old_content=None,
                new_content=None,
                content_erased_at=sa.func.coalesce(h.c.content_erased_at, now),
            )
        )
        return int(erased.rowcount)

    async def record(self, user_id: int, memory_id: int, entry: HistoryEntry, now: datetime) -> None:
        await self._statements.write(
            _INSERT_HISTORY,
            {
                "memory_id": memory_id,
                "user_id": user_id,
                "action": entry.action.value,
                "actor": entry.actor,
                "old_content": entry.old_content,
                "new_content": entry.new_content,
                "event_id": entry.event_id,
                "session_id": entry.session_id,
                "model": entry.model,
                "created_at": now,
            },
        )
