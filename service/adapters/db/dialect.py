"""The only dialect-specific SQL for MySQL/MariaDB and SQLite: idempotent inserts, upserts, and the
days between two timestamps."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.mysql import insert as mysql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement


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


class days_between(FunctionElement[float]):
    """`days_between(earlier, later)`: fractional days from one timestamp to the other (to the
    millisecond on SQLite, whose `julianday` reads no finer)."""

    type = sa.Float()
    name = "days_between"
    inherit_cache = True


@compiles(days_between, "mysql")
def _days_between_mysql(element: days_between, compiler: SQLCompiler, **kw: Any) -> str:
    earlier, later = (compiler.process(c, **kw) for c in element.clauses)
    return f"(TIMESTAMPDIFF(MICROSECOND, {earlier}, {later}) / 86400000000.0)"


@compiles(days_between, "sqlite")
def _days_between_sqlite(element: days_between, compiler: SQLCompiler, **kw: Any) -> str:
    earlier, later = (compiler.process(c, **kw) for c in element.clauses)
    return f"(julianday({later}) - julianday({earlier}))"
