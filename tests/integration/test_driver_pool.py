"""The prepared-only units of work on the MySQL driver's own pool keep every promise of the
SQLAlchemy path: the same session settings, commits and rollbacks, errors classed the same way, and
no connection whose state is in doubt ever handed out again. Each test runs on both MySQL drivers
against MariaDB."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from service.adapters.db import account_repository, memory_repository
from service.adapters.db.database import Database
from service.adapters.db.driver_pool import DriverPool
from service.adapters.db.engine import build_engine, pool_size_of
from service.adapters.db.errors import MYSQL_TRANSIENT, error_code, is_transient
from service.adapters.db.prepared import DriverLink, Statements
from service.core.model import USER_GROUP, Source
from tests.support.cancelling import SLOW, cancel_mid_statement
from tests.support.processes import MariaDbDatabase

USER = 4_300_001
NOW = datetime(2026, 12, 5, 8, 30, 15, 123456)


@pytest.fixture(params=["aiomysql", "asyncmy"])
def url(mariadb: MariaDbDatabase, request: pytest.FixtureRequest) -> str:
    return mariadb.url.replace("mysql+asyncmy", f"mysql+{request.param}")


@pytest.fixture
async def db(url: str) -> AsyncIterator[Database]:
    db = Database(build_engine(url, 2), build_engine(url, 2, autocommit=True))
    yield db
    async with db.engine.begin() as conn:
        for table in ("memory_item", "memory_history", "memory_event_ledger", "memory_user_state"):
            await conn.execute(
                sa.text(f"DELETE FROM {table} WHERE user_id BETWEEN :a AND :b"), {"a": USER, "b": USER + 99}
            )
    await db.dispose()


@pytest.fixture
async def writes(url: str) -> AsyncIterator[DriverPool]:
    engine = build_engine(url, 1)
    pool = DriverPool(engine, autocommit=False, timeout_s=0.5)
    yield pool
    await pool.close()
    await engine.dispose()


async def cursor_of(link: DriverLink) -> Any:
    """For statements the repositories never run (a session variable, the connection's id)."""
    cursor = link.driver.cursor()
    return await cursor if inspect.isawaitable(cursor) else cursor


async def ask(link: DriverLink, sql: str) -> Any:
    cursor = await cursor_of(link)
    await cursor.execute(sql)
    return (await cursor.fetchall())[0][0]


async def test_sessions_are_opened_as_sqlalchemys_are(db: Database, writes: DriverPool) -> None:
    """READ COMMITTED for the locked writes (the lock's re-checks rely on it), autocommit for the
    lookups, utf8mb4, and FOUND_ROWS: an UPDATE that changes nothing still counts its row."""
    async with writes.connection() as link:
        assert await ask(link, "SELECT @@session.tx_isolation") in (
            "READ-COMMITTED",
            b"READ-COMMITTED",
        )
        assert await ask(link, "SELECT @@session.autocommit") == 0
        assert await ask(link, "SELECT @@character_set_client") in ("utf8mb4", b"utf8mb4")
    async with db.prepared_locked_user(USER) as uow:
        row = await uow.memories.insert(USER, USER_GROUP, "喜欢深色主题 🌙", "a" * 40, Source.AUTO, 1, NOW)
        await uow.memories.touch(USER, row, NOW)
        written = await Statements(uow._link).write(  # type: ignore[arg-type]
            memory_repository._TOUCH, {"owner": USER, "row_id": row, "now": NOW}
        )
        assert written.rowcount == 1
        await uow.commit()
    async with db.prepared_read() as uow:
        inputs = await uow.memories.extraction_inputs("e-0", USER, None, 10, NOW)
    assert [shown[3] for shown in inputs.shown] == ["喜欢深色主题 🌙"]


async def test_a_locked_write_commits_with_commit_and_rolls_back_without(db: Database) -> None:
    async with db.prepared_locked_user(USER) as uow:
        assert await uow.accounts.mark_processed("kept", USER, 1, "extracted", NOW)
        await uow.commit()
    with pytest.raises(RuntimeError, match="the block failed"):
        async with db.prepared_locked_user(USER) as uow:
            assert await uow.accounts.mark_processed("dropped", USER, 1, "extracted", NOW)
            raise RuntimeError("the block failed")
    async with db.prepared_locked_user(USER) as uow:
        assert await uow.accounts.mark_processed("left open", USER, 1, "extracted", NOW)
    for _ in range(3):  # whichever pooled connection answers, none holds an open transaction
        async with db.read() as uow:
            events = await uow.conn.execute(
                sa.text("SELECT event_id FROM memory_event_ledger WHERE user_id = :u"), {"u": USER}
            )
            assert [bytes(r.event_id) for r in events] == [b"kept"]


async def test_the_lock_row_is_made_on_first_use_and_holds_a_second_writer(db: Database) -> None:
    user = USER + 1
    async with db.prepared_locked_user(user) as first:
        second = asyncio.create_task(_lock_and_commit(db, user))
        await asyncio.sleep(0.3)
        assert not second.done()  # waiting on the lock row the first writer made
        await first.commit()
    await asyncio.wait_for(second, 5)


async def _lock_and_commit(db: Database, user: int) -> None:
    async with db.prepared_locked_user(user) as uow:
        await uow.commit()


async def test_a_duplicate_key_is_an_integrity_error_and_the_connection_is_kept(db: Database) -> None:
    async with db.prepared_locked_user(USER) as uow:
        assert await uow.accounts.mark_processed("dup", USER, 1, "extracted", NOW)
        with pytest.raises(IntegrityError) as caught:
            await Statements(uow._link).write(  # type: ignore[arg-type]
                account_repository._INSERT_LEDGER,
                {"event_id": "dup", "user_id": USER, "session_id": 1, "outcome": "x", "processed_at": NOW},
            )
        assert error_code(caught.value) == ("mysql", 1062) and not is_transient(caught.value)
        assert not uow._link.retired  # type: ignore[union-attr]
        await uow.commit()


async def test_a_killed_connection_is_transient_and_never_handed_out_again(
    writes: DriverPool, url: str
) -> None:
    engine = build_engine(url, 1)
    try:
        async with writes.connection() as victim:
            dead = await ask(victim, "SELECT CONNECTION_ID()")
            async with engine.connect() as killer:
                await killer.execute(sa.text(f"KILL {dead}"))
            with pytest.raises(DBAPIError) as caught:
                await Statements(victim).rows(account_repository._LOCK_USER, {"user_id": USER})
            code = error_code(caught.value)
            assert caught.value.connection_invalidated and is_transient(caught.value)
            assert code is None or code[1] in MYSQL_TRANSIENT
            assert victim.retired
            await victim.rollback()  # nothing to undo on a retired connection, and no error
        async with writes.connection() as fresh:
            assert await ask(fresh, "SELECT CONNECTION_ID()") != dead
    finally:
        await engine.dispose()


async def test_a_statement_cancelled_mid_flight_retires_its_connection(writes: DriverPool) -> None:
    async with writes.connection() as link:
        busy = await ask(link, "SELECT CONNECTION_ID()")
        await cancel_mid_statement(Statements(link))
        assert link.retired
        with pytest.raises(DBAPIError):  # a retired link refuses, rather than reads a stale reply
            await Statements(link).rows(SLOW, {"seconds": 0})
    async with writes.connection() as link:
        assert await ask(link, "SELECT CONNECTION_ID()") != busy
        assert await Statements(link).rows(SLOW, {"seconds": 0}) == [(0,)]


async def with_lock_row(db: Database, user: int) -> int:
    async with db.prepared_locked_user(user) as uow:
        await uow.commit()
    return user


async def test_a_lock_wait_timeout_is_transient_and_keeps_the_connection(
    db: Database, writes: DriverPool
) -> None:
    user = await with_lock_row(db, USER + 2)
    async with db.prepared_locked_user(user), writes.connection() as waiter:
        await (await cursor_of(waiter)).execute("SET SESSION innodb_lock_wait_timeout = 1")
        with pytest.raises(DBAPIError) as caught:
            await Statements(waiter).rows(account_repository._LOCK_USER, {"user_id": user})
        assert error_code(caught.value) == ("mysql", 1205) and is_transient(caught.value)
        assert not waiter.retired and not caught.value.connection_invalidated
        await waiter.rollback()
    async with writes.connection() as waiter:  # the same kept connection, its lock now free
        assert await Statements(waiter).rows(account_repository._LOCK_USER, {"user_id": user})
        await waiter.rollback()


async def test_a_transaction_a_select_began_is_rolled_back_before_the_connection_goes_back(
    db: Database, writes: DriverPool
) -> None:
    """aiomysql's own flag misses it: the row lock would travel back into the pool with it."""
    user = await with_lock_row(db, USER + 3)
    async with writes.connection() as link:
        thread = await ask(link, "SELECT CONNECTION_ID()")
        assert await Statements(link).rows(account_repository._LOCK_USER, {"user_id": user})
        assert link.in_transaction
    async with db.read() as uow:
        open_transactions = await uow.conn.scalar(
            sa.text("SELECT COUNT(*) FROM information_schema.innodb_trx WHERE trx_mysql_thread_id = :t"),
            {"t": thread},
        )
    assert open_transactions == 0
    async with db.prepared_locked_user(user) as other:  # another writer takes the lock at once
        await other.commit()


async def test_a_waiter_gets_the_place_a_retired_connection_frees(url: str) -> None:
    engine = build_engine(url, 1)
    pool = DriverPool(engine, autocommit=False, timeout_s=3)
    try:
        async with pool.connection() as held:
            waiter = asyncio.create_task(_checked_out(pool))
            await cancel_mid_statement(Statements(held))
            assert held.retired and not waiter.done()
        assert await asyncio.wait_for(waiter, 2) == [(0,)]
    finally:
        await pool.close()
        await engine.dispose()


async def _checked_out(pool: DriverPool) -> Any:
    async with pool.connection() as link:
        return await Statements(link).rows(SLOW, {"seconds": 0})


async def test_an_exhausted_pool_times_out_as_sqlalchemys_does(url: str) -> None:
    engine = build_engine(url, 2)  # a pool of two: the extraction's bound at this `pool_size`
    pool = DriverPool(engine, autocommit=False, timeout_s=0.3)
    try:
        async with pool.connection(), pool.connection():
            with pytest.raises(PoolTimeout) as caught:
                async with pool.connection():
                    pass
            assert is_transient(caught.value)
        async with pool.connection() as link:  # free again once they are returned
            assert await Statements(link).rows(SLOW, {"seconds": 0}) == [(0,)]
    finally:
        await pool.close()
        await engine.dispose()


async def test_a_login_the_server_refuses_is_a_transient_database_error(
    mariadb: MariaDbDatabase, url: str
) -> None:
    """A connection the pool must open while the account is locked (a credential rotation)."""
    admin = build_engine(url, 1)
    account = f"mm_pool_{url.split('+')[1][:7]}"
    async with admin.begin() as conn:
        await conn.execute(sa.text(f"CREATE USER '{account}'@'%' IDENTIFIED BY 'pw'"))
        await conn.execute(sa.text(f"GRANT ALL ON `{mariadb.name}`.* TO '{account}'@'%'"))
    login = make_url(url).set(username=account, password="pw")
    engine = build_engine(login.render_as_string(hide_password=False), 2)
    pool = DriverPool(engine, autocommit=True)
    try:
        async with pool.connection():
            pass  # the pool is open and keeps this connection
        async with admin.begin() as conn:
            await conn.execute(sa.text(f"ALTER USER '{account}'@'%' ACCOUNT LOCK"))
        async with pool.connection():
            with pytest.raises(DBAPIError) as caught:
                async with pool.connection():
                    pass
        assert error_code(caught.value) == ("mysql", 4151) and is_transient(caught.value)
    finally:
        await pool.close()
        await engine.dispose()
        async with admin.begin() as conn:
            await conn.execute(sa.text(f"DROP USER '{account}'@'%'"))
        await admin.dispose()


async def test_a_statement_that_is_not_prepared_is_refused_plainly(db: Database) -> None:
    async with db.prepared_read() as uow:
        with pytest.raises(TypeError, match="prepared statements only"):
            await uow.accounts.capture_enabled(USER)


async def test_reads_on_the_driver_pool_give_what_the_engine_gives(db: Database) -> None:
    async with db.prepared_locked_user(USER) as uow:
        for n, content in enumerate(("以后的报告都用中文写 📝", "喜欢深色主题", "仓库使用 pnpm")):
            await uow.memories.insert(USER, USER_GROUP, content, f"{n:040d}", Source.AUTO, 1, NOW)
        await uow.commit()
    answers = []
    for unit in (db.prepared_read, db.read):
        async with unit() as uow:
            inputs = await uow.memories.extraction_inputs("e-1", USER, None, 10, NOW)
            window = await uow.memories.injection_window(USER, None, 12, 8)
        answers.append((sorted(inputs.shown), inputs.recent_extractions, window))
    assert answers[0] == answers[1]
    assert len(answers[0][0]) == 3 and answers[0][2]


class HalfRead:
    """A driver connection whose reply broke off in a way the driver does not report as its own."""

    closed = False

    def cursor(self) -> HalfRead:
        return self

    async def execute(self, *_: object) -> None:
        raise asyncio.IncompleteReadError(b"\x07", 4)

    def close(self) -> None:
        self.closed = True


async def test_an_error_that_is_not_the_drivers_own_retires_the_connection(db: Database) -> None:
    """Where the reply stands is unknown: the connection must not serve a rollback or a statement."""
    driver = HalfRead()
    link = DriverLink(driver, db.engine.dialect)
    with pytest.raises(asyncio.IncompleteReadError):
        await Statements(link).rows(account_repository._LOCK_USER, {"user_id": USER})
    assert link.retired and driver.closed


async def test_a_database_whose_pool_keeps_no_count_is_built_all_the_same() -> None:
    """SQLite in memory runs on a StaticPool, which has no size: the driver pools, unused there,
    must not stop the database from being built."""
    engine = build_engine("sqlite+aiosqlite:///:memory:", 1)
    assert pool_size_of(engine) == 1
    await Database(engine).dispose()
