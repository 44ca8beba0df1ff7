"""Reading and seeding a user's memory pool directly, for assertions against the real database."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from service.adapters.db.database import Database
from service.adapters.db.tables import memory_event_ledger, memory_history, memory_item
from service.core.model import USER_GROUP, DismissedBy, Group, Source, Status
from service.core.normalize import dedup_hash


@dataclass(frozen=True)
class Item:
    id: int
    scope: str
    project_key: str
    content: str
    source: str
    status: str
    origin_session_id: int | None
    updated_at: datetime


async def items(db: Database, user_id: int) -> list[Item]:
    async with db.read() as uow:
        result = await uow.conn.execute(
            sa.select(memory_item).where(memory_item.c.user_id == user_id).order_by(memory_item.c.id)
        )
        return [
            Item(
                r.id, r.scope, r.project_key, r.content, r.source, r.status, r.origin_session_id, r.updated_at
            )
            for r in result
        ]


async def history(db: Database, user_id: int) -> list[dict[str, Any]]:
    async with db.read() as uow:
        result = await uow.conn.execute(
            sa.select(memory_history).where(memory_history.c.user_id == user_id).order_by(memory_history.c.id)
        )
        return [dict(r._mapping) for r in result]


async def ledger(db: Database, event_id: str) -> list[dict[str, Any]]:
    async with db.read() as uow:
        result = await uow.conn.execute(
            sa.select(memory_event_ledger).where(memory_event_ledger.c.event_id == event_id)
        )
        return [dict(r._mapping) for r in result]


async def ledger_of_user(db: Database, user_id: int) -> list[dict[str, Any]]:
    async with db.read() as uow:
        result = await uow.conn.execute(
            sa.select(memory_event_ledger).where(memory_event_ledger.c.user_id == user_id)
        )
        return [dict(r._mapping) for r in result]


async def set_capture(db: Database, user_id: int, enabled: bool = True) -> None:
    async with db.transaction() as uow:
        await uow.accounts.set_capture(user_id, enabled, db.now())
        await uow.commit()


async def remember_projects(db: Database, user_id: int, *keys: str) -> None:
    async with db.transaction() as uow:
        for key in keys:
            await uow.accounts.remember_project(user_id, key, db.now())
        await uow.commit()


async def seed(
    db: Database,
    user_id: int,
    content: str,
    group: Group = USER_GROUP,
    source: Source = Source.AUTO,
    status: Status = Status.ACTIVE,
    age_minutes: float = 0,
    dismissed_by: DismissedBy = DismissedBy.USER,
) -> int:
    when = db.now() - timedelta(minutes=age_minutes)
    async with db.transaction() as uow:
        row_id = await uow.memories.insert(
            user_id, group, content, dedup_hash(group.scope, group.project_key, content), source, None, when
        )
        if status is not Status.ACTIVE:
            await uow.memories.set_status(user_id, row_id, status, when, dismissed_by)
        await uow.commit()
    return row_id


async def seed_many(
    db: Database, user_id: int, contents: list[str], group: Group = USER_GROUP, source: Source = Source.AUTO
) -> list[int]:
    """Bulk seed, oldest first (the first content gets the oldest updated_at)."""
    now = db.now()
    rows = [
        {
            "user_id": user_id,
            "scope": group.scope.value,
            "project_key": group.project_key,
            "content": c,
            "source": source.value,
            "status": Status.ACTIVE.value,
            "dedup_hash": dedup_hash(group.scope, group.project_key, c),
            "origin_session_id": None,
            "created_at": now - timedelta(minutes=len(contents) - i),
            "updated_at": now - timedelta(minutes=len(contents) - i),
        }
        for i, c in enumerate(contents)
    ]
    async with db.transaction() as uow:
        await uow.conn.execute(memory_item.insert(), rows)
        await uow.commit()
    found = await items(db, user_id)
    wanted = {r["content"] for r in rows}
    return [i.id for i in found if i.content in wanted]
