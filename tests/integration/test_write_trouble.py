"""A write's trouble stays its own: a read-only database costs no extra model call, and a user whose
row is locked elsewhere does not stall other users.

The real processor, handler and litellm client against the scripted model, on MariaDB.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import pymysql
import pytest
from sqlalchemy.engine import make_url

from service.adapters.db.database import Database
from service.adapters.db.engine import build_engine
from service.adapters.metrics import Metrics
from service.core.outcomes import Outcome
from service.entrypoints.consumer import EventProcessor
from tests.conftest import event_payload, said
from tests.integration.conftest import HandlerFactory
from tests.integration.test_model_failure_budget import received, record
from tests.support.dead_letters import RecordingDeadLetters
from tests.support.pool import ledger, set_capture
from tests.support.processes import MariaDbDatabase
from tests.support.scripted_llm import ScriptedLlm


def admin(mariadb: MariaDbDatabase) -> pymysql.connections.Connection:  # type: ignore[type-arg]
    return mariadb.server.connect(autocommit=True)


@pytest.fixture
def writer_url(mariadb: MariaDbDatabase) -> Iterator[str]:
    """An account with every right on the test database but none over the server, as a service's
    own account has: a read-only server refuses its writes (root's are let through)."""
    name = f"mm_writer_{uuid.uuid4().hex[:8]}"
    with admin(mariadb) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE USER '{name}'@'%' IDENTIFIED BY 'pw'")
        cur.execute(f"GRANT ALL ON `{mariadb.name}`.* TO '{name}'@'%'")
    yield make_url(mariadb.url).set(username=name, password="pw").render_as_string(hide_password=False)
    with admin(mariadb) as conn, conn.cursor() as cur:
        cur.execute("SET GLOBAL read_only = 0")
        cur.execute(f"DROP USER '{name}'@'%'")


@pytest.fixture
async def writer_db(writer_url: str) -> AsyncIterator[Database]:
    db = Database(build_engine(writer_url, pool_size=10), build_engine(writer_url, 10, autocommit=True))
    yield db
    await db.dispose()


def processor(
    db: Database, make_handler: HandlerFactory, metrics: Metrics, slots: int = 10
) -> EventProcessor:
    return EventProcessor(make_handler(db, database_slots=slots), RecordingDeadLetters(), metrics)  # type: ignore[arg-type]


async def test_a_read_only_window_costs_one_model_call_per_event(
    writer_db: Database,
    mariadb: MariaDbDatabase,
    make_handler: HandlerFactory,
    llm: ScriptedLlm,
    metrics: Metrics,
    user_id: int,
) -> None:
    """The server turns read-only (a failover) for 3 s while 10 events are between their model call
    and their write: each write is tried again with the answer kept, never the call."""
    await set_capture(writer_db, user_id)
    marker = f"ro{user_id}"
    llm.script(marker, [{"type": "user", "content": "只读期间也只问一次模型"}])
    retries_before = metrics.db_retries._value.get()  # the handler's (session-wide) metrics
    events = [event_payload(user_id, n, lastUserMessage=said(marker)) for n in range(1, 11)]
    with admin(mariadb) as conn, conn.cursor() as cur:
        cur.execute("SET GLOBAL read_only = 1")
        try:
            tasks = [
                asyncio.create_task(processor(writer_db, make_handler, metrics)(received(record(e, n))))
                for n, e in enumerate(events)
            ]
            await asyncio.sleep(3)
            assert not any(task.done() for task in tasks)
        finally:
            cur.execute("SET GLOBAL read_only = 0")
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)

    assert len(llm.calls(marker)) == len(events)
    assert metrics.db_retries._value.get() - retries_before >= len(events)
    assert all([await ledger(writer_db, e["eventId"]) for e in events])


async def test_a_user_whose_row_is_locked_elsewhere_does_not_stall_other_users(
    mysql_db: Database,
    mariadb: MariaDbDatabase,
    make_handler: HandlerFactory,
    llm: ScriptedLlm,
    user_id: int,
) -> None:
    """Another session holds one user's lock row for 15 s while 15 of that user's events and 100 of
    another user's arrive, with 10 database slots: the other user's events all finish meanwhile, and
    the locked user's finish once the row is let go."""
    locked, other = user_id, user_id + 1
    for user in (locked, other):
        await set_capture(mysql_db, user)
        llm.script(f"u{user}", [{"type": "user", "content": f"用户{user}的偏好"}])
    metrics = Metrics()
    run = processor(mysql_db, make_handler, metrics)
    with admin(mariadb) as holder, holder.cursor() as cur:
        cur.execute(f"USE `{mariadb.name}`")
        cur.execute("INSERT IGNORE INTO memory_user_state (user_id) VALUES (%s)", (locked,))
        cur.execute("BEGIN")
        cur.execute("SELECT user_id FROM memory_user_state WHERE user_id = %s FOR UPDATE", (locked,))
        blocked = [
            asyncio.create_task(
                run(received(record(event_payload(locked, n, lastUserMessage=said(f"u{locked}")), n)))
            )
            for n in range(1, 16)
        ]
        await asyncio.sleep(0.5)
        started = time.monotonic()
        flowing = [
            run(received(record(event_payload(other, n, lastUserMessage=said(f"u{other}")), n)))
            for n in range(1, 101)
        ]
        await asyncio.wait_for(asyncio.gather(*flowing), timeout=12)
        took = time.monotonic() - started
        assert not any(task.done() for task in blocked)
        await asyncio.sleep(max(0.0, 15 - took))
        cur.execute("COMMIT")
    await asyncio.wait_for(asyncio.gather(*blocked), timeout=60)

    assert took < 12
    assert metrics.events.labels(Outcome.EXTRACTED.value)._value.get() == 115
