"""An evaluation case's pool in the embedded database, and what one turn wrote to it, read back
from the history the write path keeps (so the eval sees exactly what production would store)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import sqlalchemy as sa

from service.adapters.db.database import Database
from service.adapters.db.tables import memory_history, memory_item
from service.core.eval_cases import PoolEntry
from service.core.eval_scoring import WRITE_ACTIONS, Written
from service.core.model import Group, Scope, Status
from service.core.normalize import dedup_hash


async def seed_pool(db: Database, user_id: int, pool: Sequence[PoolEntry]) -> dict[int, str]:
    """Capture on, the entries stored oldest first in their listed order; the row ids' case ids."""
    now = db.now()
    ids: dict[int, str] = {}
    async with db.transaction() as uow:
        await uow.accounts.set_capture(user_id, True, now)
        for age, entry in enumerate(reversed(pool), start=1):
            group = Group(entry.scope, entry.project_key or "")
            when = now - timedelta(minutes=age)
            digest = dedup_hash(group.scope, group.project_key, entry.content)
            row_id = await uow.memories.insert(
                user_id, group, entry.content, digest, entry.source, None, when
            )
            if entry.status is Status.DISMISSED:
                await uow.memories.set_status(user_id, row_id, entry.status, when, entry.dismissed_by)
            ids[row_id] = entry.id
        await uow.commit()
    return ids


async def turn_writes(db: Database, user_id: int, event_id: str, ids: dict[int, str]) -> tuple[Written, ...]:
    """The rows the event inserted, touched, updated or restored, with their content afterwards."""
    h, m = memory_history, memory_item
    query = (
        sa.select(h.c.action, h.c.memory_id, m.c.scope, m.c.content)
        .join(m, m.c.id == h.c.memory_id)
        .where(h.c.user_id == user_id, h.c.event_id == event_id, h.c.action.in_(WRITE_ACTIONS))
        .order_by(h.c.id)
    )
    async with db.read() as uow:
        rows = (await uow.conn.execute(query)).all()
    return tuple(Written(r.action, ids.get(r.memory_id), r.content, Scope(r.scope)) for r in rows)
