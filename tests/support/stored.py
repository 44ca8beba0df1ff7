"""Everything a database holds, found by reflection rather than by the code's own table list: what
the erasure tests search for a user's words and rows."""

from __future__ import annotations

import sqlalchemy as sa

from service.adapters.db.database import Database


async def every_stored_text(db: Database) -> list[str]:
    """Every value of every column of every table, as text."""

    def dump(sync_conn: sa.Connection) -> list[str]:
        reflected = sa.MetaData()
        reflected.reflect(sync_conn)
        return [
            value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
            for table in reflected.sorted_tables
            for row in sync_conn.execute(sa.select(table))
            for value in row
        ]

    async with db.read() as uow:
        return await uow.conn.run_sync(dump)


async def rows_of_user(db: Database, user_id: int) -> dict[str, int]:
    """Rows naming the user, in every table with a `user_id` column."""

    def count(sync_conn: sa.Connection) -> dict[str, int]:
        reflected = sa.MetaData()
        reflected.reflect(sync_conn)
        return {
            t.name: int(sync_conn.scalar(sa.select(sa.func.count()).where(t.c.user_id == user_id)) or 0)
            for t in reflected.sorted_tables
            if "user_id" in t.c
        }

    async with db.read() as uow:
        return await uow.conn.run_sync(count)
