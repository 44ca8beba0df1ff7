"""Pools written the way revision 0001 wrote them, on a database of either dialect at any revision."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy import create_engine

from service.adapters.db.engine import sync_url, upgrade_schema
from tests.support.processes import MariaDbDatabase

DAY0 = datetime(2026, 10, 1, 9, 0)
Event = tuple[str, str, int]  # history action, actor, day


def at(day: int) -> datetime:
    return DAY0 + timedelta(days=day)


@dataclass(frozen=True)
class OldRow:
    """A revision-0001 row with its trail; `created_day` when an earlier trail shares its reused id."""

    id: int
    user_id: int
    content: str
    source: str
    status: str
    events: list[Event] = field(default_factory=list)
    scope: str = "USER"
    project_key: str = ""
    created_day: int | None = None

    @property
    def created(self) -> datetime:
        return at(self.events[0][2] if self.created_day is None else self.created_day)

    @property
    def updated(self) -> datetime:
        return at(self.events[-1][2])


def old_hash(row: OldRow) -> str:
    """Revision 0001's hash: scope, key and the text as written (it only folded whitespace)."""
    return hashlib.sha1(f"{row.scope}|{row.project_key}|{row.content}".encode()).hexdigest()


def seed_0001(conn: sa.Connection, rows: list[OldRow]) -> None:
    items = [
        dict(
            id=row.id, user_id=row.user_id, scope=row.scope, project_key=row.project_key,
            content=row.content, source=row.source, status=row.status, dedup_hash=old_hash(row),
            origin_session_id=None, created_at=row.created, updated_at=row.updated,
        )
        for row in rows
    ]  # fmt: skip
    trail = [
        dict(memory_id=row.id, user_id=row.user_id, action=action, actor=actor, created_at=at(day))
        for row in rows
        for action, actor, day in row.events
    ]
    if items:
        conn.execute(_table("memory_item", items[0]).insert(), items)
    if trail:
        conn.execute(_table("memory_history", trail[0]).insert(), trail)


def _table(name: str, row: dict[str, object]) -> sa.TableClause:
    """Dates typed, so SQLite stores them as the service did (with microseconds): a bare string
    compares apart from SQLAlchemy's rendering of the same time."""
    return sa.table(name, *(sa.column(k, sa.DateTime() if k.endswith("_at") else None) for k in row))


@contextmanager
def database_at(dialect: str, revision: str, folder: Path) -> Iterator[str]:
    """A new database of `dialect` migrated to `revision`; its URL, dropped afterwards."""
    if dialect == "sqlite":
        url = f"sqlite+aiosqlite:///{folder / f'{revision}.db'}"
        upgrade_schema(url, revision)
        yield url
        return
    database = MariaDbDatabase().create(revision)
    try:
        yield database.url
    finally:
        database.drop()


def read_table(url: str, table: str) -> list[sa.RowMapping]:
    engine = create_engine(sync_url(url))
    try:
        with engine.connect() as conn:
            reflected = sa.Table(table, sa.MetaData(), autoload_with=conn)  # typed: SQLite's dates parsed
            return list(conn.execute(sa.select(reflected).order_by(reflected.c.id)).mappings().all())
    finally:
        engine.dispose()


def write(url: str, rows: list[OldRow]) -> None:
    engine = create_engine(sync_url(url))
    try:
        with engine.begin() as conn:
            seed_0001(conn, rows)
    finally:
        engine.dispose()
