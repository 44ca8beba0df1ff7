"""The only dialect-specific SQL: idempotent inserts and upserts for MySQL/MariaDB and SQLite."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.mysql import insert as mysql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncConnection


def _is_mysql(conn: AsyncConnection) -> bool:
    return conn.dialect.name == "mysql"


async def insert_ignore(conn: AsyncConnection, table: sa.Table, values: Mapping[str, Any]) -> None:
    """Insert unless the key exists (rowcount cannot tell which: SQLAlchemy's MySQL uses FOUND_ROWS)."""
    if _is_mysql(conn):
        # A no-op ON DUPLICATE KEY UPDATE, not INSERT IGNORE, which would also swallow data errors.
        first_key = next(iter(table.primary_key.columns)).name
        mysql_stmt = mysql_insert(table).values(dict(values))
        await conn.execute(mysql_stmt.on_duplicate_key_update({first_key: mysql_stmt.inserted[first_key]}))
        return
    await conn.execute(sqlite_insert(table).values(dict(values)).on_conflict_do_nothing())


def upsert_statement(
    dialect: str, table: sa.Table, values: Mapping[str, Any], update_columns: Sequence[str]
) -> sa.Insert:
    """Insert, or update `update_columns` of the row that already has this primary key."""
    if dialect == "mysql":
        mysql_stmt = mysql_insert(table).values(dict(values))
        return mysql_stmt.on_duplicate_key_update({c: mysql_stmt.inserted[c] for c in update_columns})
    sqlite_stmt = sqlite_insert(table).values(dict(values))
    keys = [c.name for c in table.primary_key.columns]
    return sqlite_stmt.on_conflict_do_update(
        index_elements=keys, set_={c: sqlite_stmt.excluded[c] for c in update_columns}
    )


async def upsert(
    conn: AsyncConnection, table: sa.Table, values: Mapping[str, Any], update_columns: Sequence[str]
) -> None:
    await conn.execute(upsert_statement(conn.dialect.name, table, values, update_columns))
