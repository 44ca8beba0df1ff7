"""The migrations and `tables.py` describe one schema, on both dialects, and re-running is a no-op."""

from __future__ import annotations

from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from service.adapters.db.engine import sync_url, upgrade_schema
from service.adapters.db.tables import metadata
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
