"""The async engine for either dialect, and the schema migrations that prepare it.

Alembic is imported only by the functions that migrate: a serving process checks the schema's
revision with one query against `SCHEMA_HEAD`, and Alembic (with Mako) would add 9 MiB to it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, create_engine, event, inspect, text
from sqlalchemy.engine import ExceptionContext, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from service.adapters.db.errors import retires_connection

if TYPE_CHECKING:
    from alembic.config import Config

# The latest migration in migrations/versions; tests/unit/test_schema_head.py holds it to Alembic's.
SCHEMA_HEAD = "0010"

# How every MySQL connection is opened and kept, by SQLAlchemy's pools and the driver's (`driver_pool`).
MYSQL_CONNECT_ARGS: dict[str, Any] = {"connect_timeout": 5, "charset": "utf8mb4"}
WRITE_ISOLATION = "READ COMMITTED"
RECYCLE_S = 1800
POOL_TIMEOUT_S = 10
# SQLAlchemy's pools keep twice `pool_size`: the extraction's work at once is bounded by `pool_size`,
# and the HTTP side keeps the other half.
KEPT_PER_SLOT = 2


def _migrations_dir() -> Path:
    """Beside the package in a checkout; in the working directory of an installed image."""
    beside = Path(__file__).resolve().parents[3] / "migrations"
    return beside if beside.is_dir() else Path.cwd() / "migrations"


MIGRATIONS_DIR = _migrations_dir()


def migration(file_name: str) -> ModuleType:
    """A revision's module, loaded from its file, for a later revision that reuses its code."""
    path = MIGRATIONS_DIR / "versions" / file_name
    spec = importlib.util.spec_from_file_location(f"_migration_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_engine(url: str, pool_size: int, autocommit: bool = False) -> AsyncEngine:
    """MySQL runs READ COMMITTED so a read after taking the user lock sees the previous holder's rows.

    `autocommit` builds the read engine: no BEGIN/ROLLBACK around a lookup, which halves the round
    trips of the injection path. A dropped connection is invalidated by SQLAlchemy on the error that
    reveals it, so no pre-ping query is spent on every checkout.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        _ensure_parent(parsed.database)
        engine = create_async_engine(url, connect_args={"timeout": 30}, hide_parameters=True)
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
        return engine
    engine = create_async_engine(
        url,
        # Every connection the pool opens is kept: an overflow connection is closed when it comes back
        # and reopened at the next burst, and under steady load that churn (a TCP and auth handshake,
        # dozens a second) cost more CPU and tail latency than the queries it served.
        pool_size=KEPT_PER_SLOT * pool_size,
        max_overflow=0,
        pool_recycle=RECYCLE_S,
        pool_timeout=POOL_TIMEOUT_S,
        # No ROLLBACK when a connection goes back to the pool: every write transaction ends in an
        # explicit COMMIT or ROLLBACK (`Database.transaction`), and closing a connection rolls back
        # whatever is still open, so the pool's own ROLLBACK would be a second, empty round trip.
        pool_reset_on_return=None,
        # Nor when a lookup on the autocommit engine ends: there is no transaction to roll back.
        skip_autocommit_rollback=autocommit,
        isolation_level="AUTOCOMMIT" if autocommit else WRITE_ISOLATION,
        connect_args=MYSQL_CONNECT_ARGS,
        # A failed statement's error names its statement, never its values: they hold memory text.
        hide_parameters=True,
    )
    event.listen(engine.sync_engine, "handle_error", _retire_unusable_sessions)
    return engine


def pool_size_of(engine: AsyncEngine) -> int:
    """The `pool_size` a MySQL engine was built with (1 for a pool that keeps no count)."""
    size = getattr(engine.pool, "size", None)
    kept = int(size()) if callable(size) else KEPT_PER_SLOT
    return max(1, kept // KEPT_PER_SLOT)


def _retire_unusable_sessions(context: ExceptionContext) -> None:
    """A pooled session the server refuses for good is dropped like a dead connection, so the next
    checkout opens a fresh one (after a password reset, it works again)."""
    if not context.is_disconnect and context.original_exception is not None:
        context.is_disconnect = retires_connection(context.dialect, context.original_exception)


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def _ensure_parent(database: str | None) -> None:
    if database and database != ":memory:":
        Path(database).parent.mkdir(parents=True, exist_ok=True)


def sync_url(url: str) -> str:
    """Alembic runs synchronously: the same database through PyMySQL or the stdlib sqlite3."""
    parsed = make_url(url)
    driver = "mysql+pymysql" if parsed.get_backend_name() == "mysql" else "sqlite"
    return parsed.set(drivername=driver).render_as_string(hide_password=False)


def _alembic(url: str | None = None) -> Config:
    """Alembic's configuration for this code's migrations, and for the database at `url` if given
    (a SQLite file's directory is created first)."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url is not None:
        parsed = make_url(url)
        if parsed.get_backend_name() == "sqlite":
            _ensure_parent(parsed.database)
        config.set_main_option("sqlalchemy.url", sync_url(url).replace("%", "%%"))
    return config


def revision_of(conn: Connection) -> str | None:
    """The database's Alembic revision, None before the first migration: what Alembic's own
    `MigrationContext.get_current_revision` reads, without importing Alembic."""
    if not inspect(conn).has_table("alembic_version"):
        return None
    versions = conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    if len(versions) > 1:  # branches: this code's migrations have one head, so neither is ours
        raise RuntimeError(f"alembic_version holds {len(versions)} revisions: {', '.join(sorted(versions))}")
    return versions[0] if versions else None


def current_revision(url: str) -> str | None:
    """`revision_of`, synchronously from a URL (for the CLI)."""
    engine = create_engine(_alembic(url).get_main_option("sqlalchemy.url") or "")
    try:
        with engine.connect() as conn:
            return revision_of(conn)
    finally:
        engine.dispose()


def migrations_head() -> str | None:
    """The head of the migrations directory, as Alembic reads it."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_alembic()).get_current_head()


class SchemaNotCurrent(Exception):
    """The database's schema is not the one this code was written for; `mao-memory migrate` fixes it."""

    def __init__(self, found: str | None, wanted: str) -> None:
        where = "has no schema" if found is None else f"is at schema revision {found}"
        super().__init__(f"the database {where}; this code needs {wanted}: run `mao-memory migrate` first")
        self.found = found
        self.wanted = wanted


def upgrade_schema(url: str, revision: str = "head", applied: Callable[[str], None] | None = None) -> None:
    """Apply every pending migration (up to `revision`); a no-op when the schema is current, so safe
    to re-run. `applied` is called with each revision as it is applied (`migrate`'s progress)."""
    from alembic import command

    config = _alembic(url)
    if applied is not None:

        def on_version_apply(*, step: Any, **_: Any) -> None:
            applied(str(step.up_revision_id))

        config.attributes["on_version_apply"] = on_version_apply
    command.upgrade(config, revision)
