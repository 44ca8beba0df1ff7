"""The hot path's statements on the MySQL driver's cursor behave as through SQLAlchemy: the same rows
and types for every prepared read, and errors raised, classified and invalidated the same way.
Each test runs on both MySQL drivers against MariaDB."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from service.adapters.db import account_repository, extraction_reads, memory_repository
from service.adapters.db.database import Database
from service.adapters.db.engine import build_engine
from service.adapters.db.errors import MYSQL_TRANSIENT, error_code, is_transient
from service.adapters.db.extraction_reads import pool_read_params
from service.adapters.db.prepared import Prepared, Statements
from service.adapters.db.tables import memory_event_ledger as ledger_table
from service.adapters.db.tables import memory_item as t
from service.core.model import USER_GROUP, DismissedBy, Group, Scope, Source, Status
from service.core.pool_read import PoolQuery
from tests.support.cancelling import SLOW, cancel_mid_statement
from tests.support.processes import MariaDbDatabase

USER = 4_200_001
PROJECT_A = Group(Scope.PROJECT, "proj-a")
NOW = datetime(2026, 12, 3, 8, 30, 15, 123456)


@pytest.fixture(params=["aiomysql", "asyncmy"])
async def engine(mariadb: MariaDbDatabase, request: pytest.FixtureRequest) -> AsyncIterator[AsyncEngine]:
    engine = build_engine(mariadb.url.replace("mysql+asyncmy", f"mysql+{request.param}"), pool_size=2)
    yield engine
    await engine.dispose()


@pytest.fixture
async def pool(engine: AsyncEngine) -> AsyncIterator[list[int]]:
    """Three rows of one user: a USER and a PROJECT memory (multi-byte text) and one the user
    dismissed; the ids, for the reads to find."""
    ids = []
    async with engine.connect() as conn:
        memories = memory_repository.MemoryRepository(Statements(conn))
        for scope, key, content in (
            (Scope.USER, "", "以后的报告都用中文写 📝"),
            (Scope.PROJECT, "proj-a", "仓库使用 pnpm,而非 npm"),
            (Scope.USER, "", "喜欢深色主题"),
        ):
            digest = f"{len(ids):040d}"
            ids.append(await memories.insert(USER, Group(scope, key), content, digest, Source.AUTO, 7, NOW))
        await memories.set_status(USER, ids[2], Status.DISMISSED, NOW, DismissedBy.USER)
        await conn.commit()
    yield ids
    async with engine.begin() as conn:
        await conn.execute(sa.text("DELETE FROM memory_item WHERE user_id = :u"), {"u": USER})
        await conn.execute(sa.text("DELETE FROM memory_event_ledger WHERE user_id = :u"), {"u": USER})


def reads(ids: list[int]) -> list[tuple[Prepared, dict[str, Any]]]:
    """Every prepared read of the hot path, with parameters that find rows."""
    read_round = {"event_id": "e-1", "user_id": USER, "since": NOW, "dismissed_limit": 200}
    query = PoolQuery(frozenset({ids[0]}), frozenset({f"{2:040d}"}), {USER_GROUP: 1, PROJECT_A: 1})
    return [
        (extraction_reads.READ_ROUND[False], {**read_round, "project_key": None}),
        (extraction_reads.READ_ROUND[True], {**read_round, "project_key": "proj-a"}),
        (extraction_reads.POOL_READ[False], pool_read_params(USER, None, query)),
        (extraction_reads.POOL_READ[True], pool_read_params(USER, "proj-a", query)),
        (
            memory_repository._INJECTION,
            {"user_id": USER, "project_key": "proj-a", "user_key": "", "project_limit": 12, "user_limit": 8},
        ),
        (account_repository._LOCK_USER, {"user_id": USER}),
    ]


async def test_every_prepared_read_gives_sqlalchemys_rows_with_sqlalchemys_types(
    engine: AsyncEngine, pool: list[int]
) -> None:
    async with engine.connect() as conn:
        await conn.execute(
            sa.text("INSERT IGNORE INTO memory_user_state (user_id, removal_mark) VALUES (:u, :m)"),
            {"u": USER, "m": 2**62},  # the read round's head reads the mark: a BIGINT
        )
        for prepared, params in reads(pool):
            statement = prepared.statement(conn.dialect.name)
            # A UNION keeps no order from one execution to the next: rows are compared as a set.
            through_sqlalchemy = sorted((tuple(r) for r in await conn.execute(statement, params)), key=repr)
            direct = sorted((tuple(r) for r in await Statements(conn).rows(prepared, params)), key=repr)
            assert direct == through_sqlalchemy, statement
            assert [[type(v) for v in r] for r in direct] == [
                [type(v) for v in r] for r in through_sqlalchemy
            ]
            by_position = await Statements(conn).tuples(prepared, params)
            assert sorted((tuple(r) for r in by_position), key=repr) == through_sqlalchemy, statement
            assert through_sqlalchemy, "each read is given rows to find"
        inputs = await Statements(conn).rows(extraction_reads.READ_ROUND[True], reads(pool)[1][1])
        # Only a dismissal carries its time: the negative list is sorted by it.
        assert {r.content: type(r.updated_at) for r in inputs} == {
            "以后的报告都用中文写 📝": type(None),
            "仓库使用 pnpm,而非 npm": type(None),
            "喜欢深色主题": datetime,
        }
        await conn.rollback()


async def test_a_duplicate_key_is_sqlalchemys_integrity_error_and_not_transient(
    engine: AsyncEngine, pool: list[int]
) -> None:
    async with engine.connect() as conn:
        accounts = account_repository.AccountRepository(Statements(conn))
        assert await accounts.mark_processed("dup-1", USER, 1, "extracted", NOW)
        assert not await accounts.mark_processed("dup-1", USER, 1, "extracted", NOW)
        with pytest.raises(IntegrityError) as caught:
            await Statements(conn).write(
                account_repository._INSERT_LEDGER,
                {"event_id": "dup-1", "user_id": USER, "session_id": 1, "outcome": "x", "processed_at": NOW},
            )
        assert error_code(caught.value) == ("mysql", 1062) and not is_transient(caught.value)
        assert not conn.invalidated
        await conn.commit()


async def connection_id(conn: AsyncConnection) -> int:
    return int((await conn.execute(sa.text("SELECT CONNECTION_ID()"))).scalar_one())


async def test_a_killed_connection_is_invalidated_transient_and_never_handed_out_again(
    engine: AsyncEngine, pool: list[int]
) -> None:
    async with engine.connect() as victim, engine.connect() as killer:
        dead = await connection_id(victim)
        statements = Statements(victim)
        await statements.rows(memory_repository._INJECTION, reads(pool)[4][1])
        await killer.execute(sa.text(f"KILL {dead}"))
        with pytest.raises(DBAPIError) as caught:
            await statements.rows(memory_repository._INJECTION, reads(pool)[4][1])
        code = error_code(caught.value)
        assert caught.value.connection_invalidated and is_transient(caught.value)
        assert code is None or code[1] in MYSQL_TRANSIENT
        assert victim.invalidated
    for _ in range(2):  # the pool's two connections: neither is the dead one
        async with engine.connect() as conn:
            assert await connection_id(conn) != dead
            read_round = await Statements(conn).rows(extraction_reads.READ_ROUND[False], reads(pool)[0][1])
            assert len(read_round) == 2


async def test_a_lock_wait_timeout_on_the_lock_row_is_transient_and_keeps_the_connection(
    engine: AsyncEngine, pool: list[int]
) -> None:
    lock = account_repository._LOCK_USER
    async with engine.connect() as holder, engine.connect() as waiter:
        await holder.execute(
            sa.text("INSERT IGNORE INTO memory_user_state (user_id) VALUES (:u)"), {"u": USER}
        )
        await holder.commit()
        assert await Statements(holder).rows(lock, {"user_id": USER})
        await waiter.execute(sa.text("SET SESSION innodb_lock_wait_timeout = 1"))
        with pytest.raises(DBAPIError) as caught:
            await Statements(waiter).rows(lock, {"user_id": USER})
        assert error_code(caught.value) == ("mysql", 1205) and is_transient(caught.value)
        assert not waiter.invalidated and not caught.value.connection_invalidated
        await holder.rollback()
        await waiter.rollback()
        assert await Statements(waiter).rows(lock, {"user_id": USER})  # the same connection, usable
        await waiter.rollback()


async def test_a_statement_cancelled_mid_flight_retires_its_connection(engine: AsyncEngine) -> None:
    """The reply may still be on the wire: the connection must never serve another statement."""
    async with engine.connect() as conn:
        busy = await connection_id(conn)
        await cancel_mid_statement(Statements(conn))
        assert conn.invalidated
    async with engine.connect() as first, engine.connect() as second:
        assert busy not in {await connection_id(first), await connection_id(second)}
        assert await Statements(first).rows(SLOW, {"seconds": 0}) == [(0,)]


def test_a_statement_that_cannot_compile_once_is_refused(engine: AsyncEngine) -> None:
    expanding = Prepared(sa.select(t.c.id).where(t.c.dedup_hash.in_(sa.bindparam("hashes", expanding=True))))
    with pytest.raises(ValueError, match="expanding IN"):
        expanding.compiled(engine.dialect)


async def test_writes_on_the_driver_commit_with_the_connection_and_roll_back_without_it(
    engine: AsyncEngine,
) -> None:
    ledger = account_repository._INSERT_LEDGER
    row = {"user_id": USER, "session_id": 1, "outcome": "extracted", "processed_at": NOW}
    mine = sa.select(ledger_table.c.event_id).where(ledger_table.c.user_id == USER)
    try:
        async with engine.connect() as conn:  # no begin(): the first prepared statement begins
            await Statements(conn).write(ledger, {**row, "event_id": "kept"})
            await conn.commit()
            await Statements(conn).write(ledger, {**row, "event_id": "dropped"})
        for _ in range(2):  # whichever pooled connection answers, it holds no open transaction
            async with engine.connect() as conn:
                assert list((await conn.execute(mine)).scalars()) == ["kept"]
    finally:
        async with engine.begin() as conn:
            await conn.execute(ledger_table.delete().where(ledger_table.c.user_id == USER))


async def test_the_lock_row_is_created_once_and_a_second_create_only_locks_it(engine: AsyncEngine) -> None:
    create = account_repository._CREATE_USER_STATE
    user = USER + 1
    try:
        async with engine.connect() as conn:
            accounts = account_repository.AccountRepository(Statements(conn))
            assert not await accounts.lock_user(user)
            await Statements(conn).write(create, {"new_user": user})
            await Statements(conn).write(create, {"new_user": user})  # a concurrent first writer's row
            assert await accounts.lock_user(user)
            await conn.commit()
        async with engine.connect() as conn:
            count = await conn.scalar(
                sa.text("SELECT COUNT(*) FROM memory_user_state WHERE user_id = :u"), {"u": user}
            )
            assert count == 1
    finally:
        async with engine.begin() as conn:
            await conn.execute(sa.text("DELETE FROM memory_user_state WHERE user_id = :u"), {"u": user})


async def test_lookups_on_the_autocommit_engine_begin_nothing_and_writes_begin_their_transaction(
    mysql_db: Database,
) -> None:
    async with mysql_db.read() as uow:
        await uow.memories.injection_window(USER, "proj-a", 12, 8)
        assert not uow.conn.in_transaction()  # no BEGIN spent on a lookup that commits by itself
    async with mysql_db.transaction() as uow:
        assert not await uow.accounts.lock_user(USER + 2)
        assert uow.conn.in_transaction()
