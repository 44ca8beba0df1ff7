"""The retention job's queries: expired ledger rows, a user's history in pages, folds and purges.

Only the purge runs under the per-user lock (its caller's): history is append-only, a fold is
guarded by the keeper's count as read (a concurrent fold of the same run then matches no row and is
skipped), and the ledger rows it deletes are older than any redelivery the topic can still make.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from service.adapters.db.tables import memory_event_ledger, memory_history, memory_item
from service.core.records import HistoryAction
from service.core.retention import Fold, HistoryRow, expired_memories

h, ledger = memory_history, memory_event_ledger


class RetentionRepository:
    def __init__(self, conn: AsyncConnection) -> None:
        self.conn = conn

    async def expired_ledger_keys(self, cutoff: datetime, limit: int) -> list[str]:
        rows = await self.conn.execute(
            sa.select(ledger.c.event_id)
            .where(ledger.c.processed_at < cutoff)
            .order_by(ledger.c.processed_at)
            .limit(limit)
        )
        return [r.event_id for r in rows]

    async def delete_ledger(self, keys: Sequence[str]) -> int:
        result = await self.conn.execute(sa.delete(ledger).where(ledger.c.event_id.in_(keys)))
        return int(result.rowcount)

    async def users_after(self, user_id: int, limit: int) -> list[int]:
        """The next users that have history, in id order (a loose scan of `idx_history_item`)."""
        rows = await self.conn.execute(
            sa.select(h.c.user_id)
            .where(h.c.user_id > user_id)
            .group_by(h.c.user_id)
            .order_by(h.c.user_id)
            .limit(limit)
        )
        return [r.user_id for r in rows]

    async def history_page(self, user_id: int, after: tuple[int, int], limit: int) -> list[HistoryRow]:
        """The user's rows ordered by (memory_id, id), after the (memory_id, id) pair given."""
        memory_id, row_id = after
        rows = await self.conn.execute(
            sa.select(
                h.c.id,
                h.c.memory_id,
                h.c.action,
                h.c.created_at,
                h.c.repeat_count,
                h.c.last_at,
                h.c.actor,
                h.c.session_id,
                h.c.model,
            )
            .where(
                h.c.user_id == user_id,
                sa.or_(h.c.memory_id > memory_id, sa.and_(h.c.memory_id == memory_id, h.c.id > row_id)),
            )
            .order_by(h.c.memory_id, h.c.id)
            .limit(limit)
        )
        return [
            HistoryRow(
                r.id,
                r.memory_id,
                r.action,
                r.created_at,
                r.repeat_count,
                r.last_at,
                r.actor,
                r.session_id,
                r.model,
            )
            for r in rows
        ]

    async def memory_ids(self, user_id: int) -> list[int]:
        rows = await self.conn.execute(sa.select(memory_item.c.id).where(memory_item.c.user_id == user_id))
        return [r.id for r in rows]

    async def apply_fold(self, fold: Fold) -> int:
        """The number of touch rows folded away; 0 when the keeper changed since it was read."""
        guarded = await self.conn.execute(
            sa.update(h)
            .where(h.c.id == fold.keeper, h.c.repeat_count == fold.keeper_count)
            .values(repeat_count=fold.count, last_at=fold.last_at)
        )
        if guarded.rowcount != 1:
            return 0
        deleted = await self.conn.execute(
            sa.delete(h).where(h.c.id.in_(fold.absorbed), h.c.action == HistoryAction.TOUCH.value)
        )
        return int(deleted.rowcount)

    async def purge_expired(self, user_id: int, memory_ids: Sequence[int], cutoff: datetime) -> int:
        """Purges the trails among `memory_ids` still of gone memories last changed before `cutoff`,
        as read now; under the user's lock no delete can come between the read and the purge."""
        alive = await self.conn.execute(
            sa.select(memory_item.c.id).where(
                memory_item.c.user_id == user_id, memory_item.c.id.in_(memory_ids)
            )
        )
        latest = await self.conn.execute(
            sa.select(h.c.memory_id, sa.func.max(sa.func.coalesce(h.c.last_at, h.c.created_at)).label("at"))
            .where(h.c.user_id == user_id, h.c.memory_id.in_(memory_ids))
            .group_by(h.c.memory_id)
        )
        gone = expired_memories({r.memory_id: r.at for r in latest}, [r.id for r in alive], cutoff)
        if not gone:
            return 0
        result = await self.conn.execute(sa.delete(h).where(h.c.user_id == user_id, h.c.memory_id.in_(gone)))
        return int(result.rowcount)

    async def row_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for table in (ledger, h, memory_item):
            counts[table.name] = int(
                await self.conn.scalar(sa.select(sa.func.count()).select_from(table)) or 0
            )
        return counts
