"""Database errors are classed by code on a real MariaDB and SQLite: outages are waited out, bugs are not.

Each error is produced for real (two connections crossing locks, a killed connection, a read-only
transaction, a statement timeout, a wrong password, a user without a grant, a locked account, an
expired password, an account that logs in by unix_socket only, a database that does not exist, a
closed port, a missing column), then classified; MySQL's own statement timeout (3024) and locked
account (3118), and a Galera node out of its cluster (1047), which this single MariaDB does not
raise, go through each driver's parser of the server's error packet. One test runs the consumer
against a schema with a missing column and watches the event reach the DLQ after three tries instead
of wedging its partition; another watches it wait out a database it may not log in to.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import struct
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, cast

import asyncmy.errors
import httpx
import pymysql.err
import pytest
import sqlalchemy as sa
from aiokafka import ConsumerRecord
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from service.adapters.db.database import Database
from service.adapters.db.engine import build_engine
from service.adapters.db.errors import MYSQL_TRANSIENT, error_code, is_transient
from service.adapters.kafka.dead_letters import ERROR, REASON, DeadLetterPublisher, header
from service.adapters.metrics import Metrics
from service.bootstrap import build_service
from service.config import Settings
from service.core.events import decode_event
from service.entrypoints.consumer import EventProcessor, Received
from service.entrypoints.process import Mode
from tests.conftest import event_payload, said
from tests.integration.conftest import HandlerFactory
from tests.support.dead_letters import RecordingDeadLetters
from tests.support.pool import set_capture
from tests.support.processes import MariaDbDatabase, free_port
from tests.support.scripted_llm import ScriptedLlm
from tests.support.tokens import SECRET, bearer, token


@pytest.fixture(params=["aiomysql", "asyncmy"])
def url(mariadb: MariaDbDatabase, request: pytest.FixtureRequest) -> URL:
    """The session's database once per MySQL driver, since each raises its own exception classes."""
    return make_url(mariadb.url).set(drivername=f"mysql+{request.param}")


@pytest.fixture
async def engine(url: URL) -> AsyncIterator[AsyncEngine]:
    """Over a `scratch` table of its own, dropped afterwards (the schema drift test sees every table)."""
    engine = build_engine(url.render_as_string(hide_password=False), pool_size=4)
    async with engine.begin() as conn:
        await conn.execute(sa.text("CREATE TABLE IF NOT EXISTS scratch (id INT PRIMARY KEY, v VARCHAR(4))"))
        await conn.execute(sa.text("INSERT IGNORE INTO scratch VALUES (1, 'a'), (2, 'b')"))
    yield engine
    async with engine.begin() as conn:
        await conn.execute(sa.text("DROP TABLE scratch"))
    await engine.dispose()


async def raised(work: Any) -> DBAPIError:
    with pytest.raises(DBAPIError) as caught:
        await work
    return caught.value


async def lock_row(conn: AsyncConnection, row: int) -> None:
    await conn.execute(sa.text("SELECT v FROM scratch WHERE id = :id FOR UPDATE"), {"id": row})


async def test_a_lock_wait_timeout_is_transient(engine: AsyncEngine) -> None:
    async with engine.connect() as holder, engine.connect() as waiter:
        await holder.begin()
        await lock_row(holder, 1)
        await waiter.execute(sa.text("SET SESSION innodb_lock_wait_timeout = 1"))
        exc = await raised(lock_row(waiter, 1))
    assert error_code(exc) == ("mysql", 1205) and is_transient(exc)


async def test_a_deadlock_is_transient(engine: AsyncEngine) -> None:
    async with engine.connect() as a, engine.connect() as b:
        await a.begin()
        await b.begin()
        await lock_row(a, 1)
        await lock_row(b, 2)
        first = asyncio.create_task(lock_row(a, 2))  # waits for b
        await asyncio.sleep(0.3)
        outcomes = await asyncio.gather(first, lock_row(b, 1), return_exceptions=True)
    [exc] = [o for o in outcomes if isinstance(o, BaseException)]
    assert isinstance(exc, DBAPIError) and error_code(exc) == ("mysql", 1213) and is_transient(exc)


async def test_a_write_in_a_read_only_transaction_is_transient(engine: AsyncEngine) -> None:
    """What a writer meets while a failover has left it on a read-only server."""
    async with engine.connect() as conn:
        await conn.execute(sa.text("SET SESSION TRANSACTION READ ONLY"))
        await conn.commit()
        exc = await raised(conn.execute(sa.text("UPDATE scratch SET v = 'c' WHERE id = 1")))
        await conn.rollback()
        await conn.execute(sa.text("SET SESSION TRANSACTION READ WRITE"))
        await conn.commit()
    assert error_code(exc) == ("mysql", 1792) and is_transient(exc)


async def test_a_killed_connection_is_transient(engine: AsyncEngine) -> None:
    async with engine.connect() as victim, engine.connect() as killer:
        connection_id = (await victim.execute(sa.text("SELECT CONNECTION_ID()"))).scalar_one()
        await killer.execute(sa.text(f"KILL {int(connection_id)}"))
        exc = await raised(victim.execute(sa.text("SELECT 1")))
    code = error_code(exc)
    assert code is not None and code[1] in MYSQL_TRANSIENT and is_transient(exc)


async def test_a_connection_the_server_dropped_for_idleness_is_transient(engine: AsyncEngine) -> None:
    """The server closed the connection after its wait_timeout ("gone away" / "lost connection")."""
    async with engine.connect() as conn:
        await conn.execute(sa.text("SET SESSION wait_timeout = 1"))
        await asyncio.sleep(2.5)
        exc = await raised(conn.execute(sa.text("SELECT 1")))
    assert is_transient(exc)


async def test_a_statement_timeout_is_transient(engine: AsyncEngine) -> None:
    """MariaDB's max_statement_time: the server is too slow right now, the statement is fine."""
    async with engine.connect() as conn:
        exc = await raised(conn.execute(sa.text("SET STATEMENT max_statement_time=0.01 FOR SELECT SLEEP(1)")))
    assert error_code(exc) == ("mysql", 1969) and is_transient(exc)


@pytest.mark.parametrize(
    ("code", "message"),
    [
        (3024, "Query execution was interrupted, maximum statement execution time exceeded"),
        (3118, "Access denied for user 'svc'@'%'. Account is locked."),
        (1047, "WSREP has not yet prepared node for application use"),
    ],
    ids=["mysql-statement-timeout", "mysql-account-locked", "galera-node-out-of-its-cluster"],
)
async def test_errors_this_mariadb_does_not_raise_are_transient(
    engine: AsyncEngine, code: int, message: str
) -> None:
    """MySQL's max_execution_time and locked account, and a Galera node that lost its cluster: the
    error packet the server sends is parsed by the driver's own code into its own exception class,
    then wrapped as SQLAlchemy does."""
    packet = b"\xff" + struct.pack("<h", code) + b"#HY000" + message.encode()
    parse = {"aiomysql": pymysql.err, "asyncmy": asyncmy.errors}[engine.dialect.driver]
    with pytest.raises(Exception) as caught:
        parse.raise_mysql_exception(packet)
    exc = DBAPIError.instance("SELECT 1", None, caught.value, engine.dialect.loaded_dbapi.Error)
    assert error_code(exc) == ("mysql", code) and is_transient(exc)


async def connect_error(url: URL) -> DBAPIError:
    engine = build_engine(url.render_as_string(hide_password=False), pool_size=1)
    try:
        async with engine.connect() as conn:
            return await raised(conn.execute(sa.text("SELECT 1")))
    except DBAPIError as exc:
        return exc
    finally:
        await engine.dispose()


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"password": "not-the-password"}, 1045),  # credentials being rotated
        ({"database": "mm_no_such_database"}, 1049),  # not created or restored yet
        ({"host": "127.0.0.1", "port": free_port()}, 2003),  # nothing listens there
    ],
    ids=["access-denied", "unknown-database", "closed-port"],
)
async def test_a_database_that_cannot_be_used_is_transient(
    url: URL, change: dict[str, Any], code: int
) -> None:
    exc = await connect_error(url.set(**change))
    assert error_code(exc) == ("mysql", code) and is_transient(exc)


CREATE = "CREATE USER {user} IDENTIFIED BY 'pw'"
GRANT = "GRANT ALL ON `{db}`.* TO {user}"
LOCK = "ALTER USER {user} ACCOUNT LOCK"
EXPIRE = "ALTER USER {user} PASSWORD EXPIRE"


@contextlib.contextmanager
def account(mariadb: MariaDbDatabase, *setup: str) -> Iterator[str]:
    """A user of its own, made by `setup` (statements naming it `{user}` and the test database
    `{db}`), dropped afterwards; yields its name."""
    name = f"mm_acct_{uuid.uuid4().hex[:8]}"
    user = f"'{name}'@'%'"
    try:
        with mariadb.server.connect(autocommit=True) as admin, admin.cursor() as cur:
            for statement in setup:
                cur.execute(statement.format(user=user, db=mariadb.name))
        yield name
    finally:
        with mariadb.server.connect(autocommit=True) as admin, admin.cursor() as cur:
            cur.execute(f"DROP USER IF EXISTS {user}")


@pytest.mark.parametrize(
    ("setup", "code"),
    [
        ([CREATE], 1044),  # the user exists, its grant does not (yet)
        ([CREATE, GRANT, LOCK], 4151),  # locked during an incident or a rotation
        ([CREATE, GRANT, EXPIRE], 1820),  # logged in, but may only reset the password
        (["CREATE USER {user} IDENTIFIED VIA unix_socket", GRANT], 1698),  # socket login only
    ],
    ids=["no-grant", "account-locked", "password-expired", "unix-socket-account-over-tcp"],
)
async def test_an_account_that_cannot_use_the_database_is_transient(
    url: URL, mariadb: MariaDbDatabase, setup: list[str], code: int
) -> None:
    """Access to the account is an operator's fix (grant, unlock, reset, re-create), never the event's."""
    with account(mariadb, *setup) as user:
        exc = await connect_error(url.set(username=user, password="pw"))
    assert error_code(exc) == ("mysql", code) and is_transient(exc)


async def test_an_expired_password_refused_at_login_is_transient(url: URL, mariadb: MariaDbDatabase) -> None:
    """With disconnect_on_expired_password ON (MySQL 8's default) the login itself is refused (1862).
    MariaDB sets the variable only globally: the test sets it and puts the old value back."""
    with mariadb.server.connect(autocommit=True) as admin, admin.cursor() as cur:
        cur.execute("SELECT @@GLOBAL.disconnect_on_expired_password")
        (before,) = cur.fetchone()
        cur.execute("SET GLOBAL disconnect_on_expired_password = ON")
    try:
        with account(mariadb, CREATE, GRANT, EXPIRE) as user:
            exc = await connect_error(url.set(username=user, password="pw"))
    finally:
        with mariadb.server.connect(autocommit=True) as admin, admin.cursor() as cur:
            cur.execute("SET GLOBAL disconnect_on_expired_password = %s", (before,))
    assert error_code(exc) == ("mysql", 1862) and is_transient(exc)


@pytest.mark.parametrize("locked", [False, True], ids=["wrong-password", "account-locked"])
async def test_while_access_is_denied_readyz_fails_and_the_api_answers_503(
    url: URL, mariadb: MariaDbDatabase, locked: bool
) -> None:
    """Readiness (and so the MaoMemoryNotReady alert) and the API both say "database unavailable"."""
    with account(mariadb, CREATE, GRANT, *([LOCK] if locked else [])) as user:
        denied = url.set(username=user, password="pw" if locked else "not-the-password")
        ready, listed = await _readyz_and_a_list(denied)
    assert ready.status_code == 503 and ready.json()["checks"] == {"database": "fail"}
    assert listed.status_code == 503 and listed.json()["code"] == 50300


async def _readyz_and_a_list(url: URL) -> tuple[httpx.Response, httpx.Response]:
    settings = Settings(
        _env_file=None, database_url=url.render_as_string(hide_password=False), jwt_secret=SECRET
    )
    service = build_service(settings, Mode.API)
    # An answered outage ends in the app: nothing is re-raised for the server to log.
    transport = httpx.ASGITransport(app=service.http)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            return await client.get("/readyz"), await client.get("/api/v1/memory", headers=bearer(token(7)))
    finally:
        await service.db.dispose()


@pytest.mark.parametrize(
    ("statement", "code"),
    [
        ("SELECT no_such_column FROM scratch", 1054),
        ("SELECT 1 FROM no_such_table", 1146),
        ("INSERT INTO scratch VALUES (3, 'too long')", 1406),
        ("INSERT INTO scratch VALUES (1, 'x')", 1062),
        ("SELEC 1", 1064),
    ],
)
async def test_bugs_and_bad_data_are_not_transient(engine: AsyncEngine, statement: str, code: int) -> None:
    async with engine.connect() as conn:
        exc = await raised(conn.execute(sa.text(statement)))
    assert error_code(exc) == ("mysql", code) and not is_transient(exc)


async def test_sqlite_busy_is_transient_and_a_missing_table_is_not(tmp_path: Path) -> None:
    path = tmp_path / "busy.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t (id INTEGER)")
    holder.execute("BEGIN IMMEDIATE")
    engine = create_async_engine(f"sqlite+aiosqlite:///{path}", connect_args={"timeout": 0})
    try:
        async with engine.connect() as conn:
            busy = await raised(conn.execute(sa.text("INSERT INTO t VALUES (1)")))
            missing = await raised(conn.execute(sa.text("SELECT * FROM no_such_table")))
    finally:
        await engine.dispose()
        holder.close()
    assert error_code(busy) == ("sqlite", 5) and is_transient(busy)
    assert error_code(missing) == ("sqlite", 1) and not is_transient(missing)


@pytest.mark.mysql  # a database of its own on MariaDB
async def test_an_unknown_column_reaches_the_dlq_after_three_tries_instead_of_wedging(
    make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int
) -> None:
    broken = MariaDbDatabase().create()
    db = Database(build_engine(broken.url, 2), build_engine(broken.url, 2, autocommit=True))
    try:
        await set_capture(db, user_id)
        async with db.engine.begin() as conn:  # a deployment whose schema lost a column
            await conn.execute(sa.text("ALTER TABLE memory_event_ledger DROP COLUMN outcome"))
        llm.script(f"m{user_id}", [{"type": "user", "content": "报告用中文写"}])
        payload = event_payload(user_id, 3, lastUserMessage=said(f"m{user_id}"))
        raw = json.dumps(payload).encode()
        record = ConsumerRecord("t", 0, 5, 0, 0, b"3", raw, None, len(b"3"), len(raw), [])
        dead_letters = RecordingDeadLetters()
        processor = EventProcessor(
            make_handler(db), cast(DeadLetterPublisher, dead_letters), Metrics(), after_commit=None
        )
        async with asyncio.timeout(20):
            await processor(Received(record, decode_event(raw, 1 << 20)))
    finally:
        with contextlib.suppress(Exception):
            await db.dispose()
        broken.drop()
    [(_, _, headers)] = dead_letters.published
    assert header(headers, REASON) == "processing_error" and "1054" in (header(headers, ERROR) or "")


async def test_an_event_waits_out_denied_access_instead_of_reaching_the_dlq(
    make_handler: HandlerFactory, url: URL, user_id: int
) -> None:
    """Credentials rotated under a running consumer: the event is retried with back-off and never
    finished, so its offset stays put, where a bug would have been dead-lettered after three tries."""
    denied = url.set(password="not-the-password").render_as_string(hide_password=False)
    db = Database(build_engine(denied, 2), build_engine(denied, 2, autocommit=True))
    raw = json.dumps(event_payload(user_id, 3, lastUserMessage=said(f"m{user_id}"))).encode()
    record = ConsumerRecord("t", 0, 5, 0, 0, b"3", raw, None, len(b"3"), len(raw), [])
    dead_letters, metrics = RecordingDeadLetters(), Metrics()
    processor = EventProcessor(
        make_handler(db), cast(DeadLetterPublisher, dead_letters), metrics, after_commit=None
    )
    try:
        # Back-off delays of 0.5, 1 and 2 s, each spread by ±50 %: the third try starts by 2.25 s
        # and a fifth cannot start before 3.75 s, so 2.5 s holds three or four tries.
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(2.5):
                await processor(Received(record, decode_event(raw, 1 << 20)))
    finally:
        await db.dispose()
    assert dead_letters.published == []
    assert metrics.registry.get_sample_value("mao_memory_db_retries_total") in (3, 4)


@pytest.mark.parametrize("autocommit", [False, True], ids=["write-engine", "read-engine"])
async def test_a_session_opened_while_the_password_was_expired_leaves_the_pool(
    mariadb: MariaDbDatabase, url: URL, autocommit: bool
) -> None:
    """A session opened while the password is expired answers 1820 to everything until closed, even
    after the reset: the pool must drop it, or the API would answer 503 until the connection recycles."""

    async def select_one() -> int:
        async with engine.connect() as conn:
            return int((await conn.execute(sa.text("SELECT 1"))).scalar_one())

    def admin(statement: str) -> None:
        with mariadb.server.connect(autocommit=True) as server, server.cursor() as cur:
            cur.execute(statement.format(user=f"'{name}'@'%'"))

    with account(mariadb, CREATE, GRANT) as name:
        login = url.set(username=name, password="pw").render_as_string(hide_password=False)
        engine = build_engine(login, 1, autocommit)
        try:
            assert await select_one() == 1
            await engine.dispose()  # the next session is opened while the password is expired
            admin(EXPIRE)
            expired = await raised(select_one())
            assert error_code(expired) == ("mysql", 1820) and is_transient(expired)
            admin("ALTER USER {user} IDENTIFIED BY 'pw'")  # the reset
            assert await select_one() == 1
        finally:
            await engine.dispose()
