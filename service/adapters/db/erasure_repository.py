"""A user erased whole: every row the service keeps for one user id, table by table."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from service.adapters.db.tables import (
    memory_event_ledger,
    memory_history,
    memory_item,
    memory_user_project,
    memory_user_state,
    user_memory_preference,
)

# Every table with a `user_id` column, under the name the erasure's answer gives it. The lock row
# (`memory_user_state`) comes last: the erasing transaction holds it to the end.
ERASED_TABLES: tuple[tuple[str, sa.Table], ...] = (
    ("history", memory_history),
    ("memories", memory_item),
    ("capturePreference", user_memory_preference),
    ("projects", memory_user_project),
    ("ledger", memory_event_ledger),
    ("userState", memory_user_state),
)


class ErasureRepository:
    def __init__(self, conn: AsyncConnection) -> None:
        self.conn = conn

    async def erase(self, user_id: int) -> dict[str, int]:
        """Rows deleted per table; every one goes in the caller's transaction."""
        removed: dict[str, int] = {}
        for name, table in ERASED_TABLES:
            result = await self.conn.execute(sa.delete(table).where(table.c.user_id == user_id))
            removed[name] = int(result.rowcount)
        return removed
