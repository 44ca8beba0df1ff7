"""The migrations and `tables.py` describe one schema, on both dialects, and re-running is a no-op."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from service.adapters.db.engine import sync_url, upgrade_schema
from service.adapters.db.tables import metadata
from service.core.model import Scope
from service.core.normalize import dedup_hash
from tests.support.processes import MariaDbDatabase


def drift(url: str) -> list[object]:
    engine = create_engine(sync_url(url))
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            return list(compare_metadata(context, metadata))
    finally:
        engine.dispose()


def test_mariadb_schema_matches_the_tables_and_migrate_is_rerunnable(mariadb: MariaDbDatabase) -> None:
    upgrade_schema(mariadb.url)  # a second run over the session's migrated database
    assert drift(mariadb.url) == []


def test_sqlite_schema_matches_the_tables(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'm.db'}"
    upgrade_schema(url)
    upgrade_schema(url)
    assert drift(url) == []
    engine = create_engine(sync_url(url))
    try:
        tables = set(inspect(engine).get_table_names())
    finally:
        engine.dispose()
    assert set(metadata.tables) <= tables


@pytest.fixture(params=["mysql", "sqlite"])
def at_0001(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database migrated to the first revision only."""
    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path / 'old.db'}"
        upgrade_schema(url, "0001")
        yield url
        return
    database = MariaDbDatabase().create("0001")
    try:
        yield database.url
    finally:
        database.drop()


def test_0002_carries_existing_rows_over(at_0001: str) -> None:
    engine = create_engine(sync_url(at_0001))
    now = datetime(2026, 11, 1, 12, 0)
    item, hist = sa.table("memory_item", *_columns(ITEM)), sa.table("memory_history", *_columns(HISTORY))

    def row(id: int, content: str, status: str = "ACTIVE", age: int = 0, digest: str | None = None) -> dict:
        when = now - timedelta(days=age)
        old_hash = digest or hashlib.sha1(f"USER||{content.strip()}".encode()).hexdigest()
        return dict(
            id=id, user_id=7, scope="USER", project_key="", content=content, source="AUTO", status=status,
            dedup_hash=old_hash, origin_session_id=None, created_at=when, updated_at=when,
        )  # fmt: skip

    try:
        with engine.begin() as conn:
            conn.execute(
                item.insert(),
                [
                    row(1, "报告用中文", age=9),
                    row(2, "报告\u200b用中文", age=1),  # renders the same: merged into row 1
                    row(3, "被容量收起", "DISMISSED", age=5),
                    row(4, "被用户忽略", "DISMISSED", age=5),
                    row(5, "最后一条", age=0),
                ],
            )
            conn.execute(
                hist.insert(),
                [
                    _history(3, "demote", "auto", now),
                    _history(4, "dismiss", "user", now),
                    _history(9, "delete", "user", now),  # a deleted memory with a higher id
                ],
            )
            conn.execute(sa.text("INSERT INTO memory_user_state VALUES (7, :at)"), {"at": now})

        upgrade_schema(at_0001)

        with engine.begin() as conn:
            rows = {r.id: r for r in conn.execute(sa.text("SELECT * FROM memory_item")).mappings()}
            trail = conn.execute(sa.text("SELECT * FROM memory_history WHERE memory_id = 1")).mappings().all()
            due = conn.scalar(sa.text("SELECT consolidation_due_at FROM memory_user_state"))
            conn.execute(item.insert(), [{**row(0, "迁移后的新记忆"), "id": None}])
            new_id = conn.scalar(sa.text("SELECT max(id) FROM memory_item"))
    finally:
        engine.dispose()
    assert sorted(rows) == [1, 3, 4, 5]
    assert all(r["dedup_hash"] == dedup_hash(Scope.USER, "", r["content"]) for r in rows.values())
    assert [(h["action"], h["actor"], h["old_content"], h["new_content"]) for h in trail] == [
        ("merge", "migration", "报告\u200b用中文", "报告用中文")
    ]  # the folded twin's trail lives under the row it was folded into
    assert (rows[3]["dismissed_by"], rows[4]["dismissed_by"], rows[1]["dismissed_by"]) == (
        "CAPACITY",
        "USER",
        None,
    )
    assert datetime.fromisoformat(str(due)) == now + timedelta(hours=24)  # SQLite answers text
    assert new_id > 9  # past every id a history row names


ITEM = "id user_id scope project_key content source status dedup_hash origin_session_id created_at updated_at"
HISTORY = "memory_id user_id action actor created_at"


def _columns(names: str) -> list[sa.ColumnClause[object]]:
    return [sa.column(name) for name in names.split()]


def _history(memory_id: int, action: str, actor: str, at: datetime) -> dict[str, object]:
    return {"memory_id": memory_id, "user_id": 7, "action": action, "actor": actor, "created_at": at}


@pytest.mark.parametrize("dialect", ["mysql", "sqlite"])
def test_0010_gives_existing_lock_rows_the_removal_mark_no_new_row_gets(dialect: str, tmp_path: Path) -> None:
    """0, so that the row an erasure removes and a later write makes again never share a mark."""
    database = MariaDbDatabase().create("0009") if dialect == "mysql" else None
    url = database.url if database else f"sqlite+aiosqlite:///{tmp_path / 'old.db'}"
    if database is None:
        upgrade_schema(url, "0009")
    engine = create_engine(sync_url(url))
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO memory_user_state (user_id) VALUES (7)"))
        upgrade_schema(url)
        with engine.begin() as conn:
            marks = conn.execute(sa.text("SELECT user_id, removal_mark FROM memory_user_state")).all()
    finally:
        engine.dispose()
        if database:
            database.drop()
    assert [tuple(m) for m in marks] == [(7, 0)]
