"""CPU per extracted event, by variant, side by side in one run: `python -m bench.cpu_profile`.

The extraction handler runs in this process over MariaDB, with the model in a process of its own
answering at once; 16 events are in flight. Variants swap one component at a time (the model call
through `litellm.acompletion` or the shared session, aiomysql or asyncmy, the hot path's statements
through SQLAlchemy or prepared on the driver's cursor), next to a bare reference
doing the same I/O with no service code: the same request body on one aiohttp POST and seven
statements through the raw driver. The last two variants are the same handler on sessions of a
project, over empty pools and over full ones (`tests/support/full_pool.py`: 180 machine-made ACTIVE
rows and 50 dismissed facts per user), so their ratio is what a steady-state user costs. Prints one
JSON line (`--bare <api base>`: the reference alone; `--pools [events]`: the last two alone).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import asyncmy
import orjson

from service.adapters.db import prepared
from service.adapters.db.database import Database
from service.adapters.db.engine import build_engine
from service.adapters.llm_client import AnswerShape, LlmClient, StructuredOutput, response_format
from service.adapters.metrics import Metrics
from service.app.caches import CaptureSwitch, ProjectRecorder
from service.app.extraction import ExtractionHandler, ExtractionSlots
from service.config import Settings
from service.core.comparison_set import EMPTY
from service.core.events import TaskFinishedEvent
from service.core.extraction_prompt import ANSWER_SCHEMA, build_extraction_messages
from service.core.outcomes import Outcome
from tests.support.backends import mysql_server
from tests.support.full_pool import PROJECT, full_pool
from tests.support.processes import MariaDbDatabase

MODEL = "openai/gpt-4o-mini"
EVENTS, USERS, IN_FLIGHT, WARM_UP = int(os.environ.get("BENCH_CPU_EVENTS", "1000")), 500, 16, 100
Work = Callable[[int, int], Awaitable[None]]


def event(user_id: int, session: int, project_key: str | None = None) -> TaskFinishedEvent:
    payload = {
        "eventId": f"cpu-{user_id}-{session}-{time.monotonic_ns()}",
        "occurredAt": "2026-12-03T10:00:00Z",
        "sessionId": session,
        "userId": user_id,
        "phase": "COMPLETED",
        "sessionType": "MAIN",
        "lastUserMessage": f"请记住这个长期偏好(bench-{user_id}):以后所有的报告都用中文来写,并附上摘要。",
        "lastAssistantMessage": "好的,以后的报告都会用中文撰写并附上摘要。",
        "projectKey": project_key,
    }
    return TaskFinishedEvent.model_validate_json(json.dumps(payload))


async def run_events(work: Any, first_user: int, events: int = EVENTS) -> float:
    """CPU ms per event for `work(user_id, session)` over `events` events after a warm-up."""
    slots = asyncio.Semaphore(IN_FLIGHT)

    async def one(i: int) -> None:
        async with slots:
            await work(first_user + i % USERS, 10 + i // USERS)

    await asyncio.gather(*(one(i) for i in range(WARM_UP)))
    started = time.process_time()
    await asyncio.gather(*(one(WARM_UP + i) for i in range(events)))
    return round((time.process_time() - started) * 1000 / events, 2)


def seed_full_pools(database: MariaDbDatabase, users: range) -> None:
    """Every user's pool as `full_pool()` has it, written in bulk over the raw driver."""
    pool = full_pool()
    rows = [
        (
            user,
            r.scope.value,
            r.project_key,
            r.content,
            r.source.value,
            r.status.value,
            r.dismissed_by.value if r.dismissed_by else None,
            r.dedup_hash,
            r.updated_at,
            r.updated_at,
        )
        for user in users
        for r in pool.active + pool.dismissed
    ]
    with database.server.connect(autocommit=False) as conn, conn.cursor() as cur:
        cur.execute(f"USE `{database.name}`")
        for start in range(0, len(rows), 5000):
            cur.executemany(
                "INSERT INTO memory_item (user_id, scope, project_key, content, source, status,"
                " dismissed_by, dedup_hash, created_at, updated_at)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                rows[start : start + 5000],
            )
        conn.commit()


@asynccontextmanager
async def service_handler(
    database: MariaDbDatabase,
    api_base: str,
    driver: str,
    fast: bool,
    direct: bool = True,
    pools: str | None = None,
) -> AsyncIterator[tuple[Work, int]]:
    """The handler's `work` and its first user. `pools` "empty" or "full": sessions of PROJECT,
    over empty pools or full ones."""
    prepared.DIRECT_DIALECTS = frozenset({"mysql"} if direct else ())
    url = database.url.replace("mysql+asyncmy://", f"mysql+{driver}://")
    db = Database(build_engine(url, 20), build_engine(url, 20, autocommit=True))
    client = LlmClient(Metrics(), api_base, "k", timeout_s=10, max_retries=0, retry_base_s=0.01)
    if not fast:
        client._endpoints[MODEL] = None
    settings = Settings(_env_file=None, default_model=MODEL, capture_cache_ttl_s=3600)  # type: ignore[call-arg]
    projects = ProjectRecorder(db)
    handler = ExtractionHandler(
        db, client, Metrics(), settings, CaptureSwitch(db, 3600), projects, ExtractionSlots.of(64, 10)
    )
    first_user = 1_000_000 * (1 + len(driver) + 10 * fast + 20 * direct + 40 * len(pools or ""))
    users = range(first_user, first_user + USERS)
    project = PROJECT if pools else None
    if pools == "full":
        seed_full_pools(database, users)
    async with db.transaction() as uow:
        for u in users:
            await uow.accounts.set_capture(u, True, db.now())
        await uow.commit()
    await handler.warm(users)
    for u in users if project else ():  # a project is recorded once per user and process
        await projects.remember(u, PROJECT)

    async def work(user_id: int, session: int) -> None:
        outcome, _ = await handler.handle(event(user_id, session, project))
        assert outcome is Outcome.EXTRACTED, outcome

    try:
        yield work, first_user
    finally:
        await client.stop()
        await db.dispose()


async def service_variant(
    database: MariaDbDatabase, api_base: str, driver: str, fast: bool, direct: bool = True
) -> float:
    async with service_handler(database, api_base, driver, fast, direct) as (work, first_user):
        return await run_events(work, first_user)


async def bare_reference(database: MariaDbDatabase, api_base: str) -> float:
    """The floor: the same I/O per event with no service code around it. The same request body the
    service sends (its prompt, structured output and token cap), the answer decoded, and seven
    statements like the service's through the raw asyncmy driver, over users holding a memory each."""
    first_user = 9_000_000
    pool = await asyncmy.create_pool(
        host=mysql_server().host,
        port=mysql_server().port,
        user="root",
        db=database.name,
        maxsize=20,
        autocommit=False,
    )
    async with pool.acquire() as conn, conn.cursor() as cur:
        await cur.executemany(
            "INSERT INTO memory_item (user_id, scope, project_key, content, source, status, dedup_hash,"
            " created_at, updated_at) VALUES (%s, 'USER', '', %s, 'AUTO', 'ACTIVE', %s, NOW(6), NOW(6))",
            [(u, f"用户{u}的偏好", f"{u:040d}") for u in range(first_user, first_user + USERS)],
        )
        await conn.commit()
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64))
    url = f"{api_base}/chat/completions"
    sample = event(first_user, 1)
    messages = build_extraction_messages(
        sample.last_user_message or "", sample.last_assistant_message or "", None, EMPTY, True
    )
    body = {
        "model": "gpt-4o-mini",
        "messages": messages,
        "temperature": 0,
        "max_tokens": 1024,
        "response_format": response_format(
            StructuredOutput.JSON_SCHEMA, AnswerShape("memories", ANSWER_SCHEMA, 1024)
        ),
    }

    async def work(user_id: int, session_id: int) -> None:
        event_id = f"bare-{user_id}-{session_id}-{time.monotonic_ns()}"
        async with pool.acquire() as conn, conn.cursor() as cur:
            await cur.execute(
                "SELECT EXISTS(SELECT 1 FROM memory_event_ledger WHERE event_id=%s)", (event_id,)
            )
            await cur.fetchall()
            await cur.execute("SELECT * FROM memory_item WHERE user_id=%s AND status='ACTIVE'", (user_id,))
            await cur.fetchall()
            await conn.commit()
        async with session.post(url, data=orjson.dumps(body)) as response:
            answer = orjson.loads(await response.read())
        orjson.loads(answer["choices"][0]["message"]["content"])
        async with pool.acquire() as conn, conn.cursor() as cur:
            await cur.execute("SELECT user_id FROM memory_user_state WHERE user_id=%s FOR UPDATE", (user_id,))
            await cur.fetchall()
            await cur.execute(
                "INSERT INTO memory_event_ledger VALUES (%s, %s, %s, 'extracted', NOW(6))",
                (event_id, user_id, session_id),
            )
            await cur.execute("SELECT * FROM memory_item WHERE user_id=%s AND status='ACTIVE'", (user_id,))
            rows = await cur.fetchall()
            await cur.execute("UPDATE memory_item SET updated_at=NOW(6) WHERE id=%s", (rows[0][0],))
            await cur.execute(
                "INSERT INTO memory_history (memory_id, user_id, action, actor, created_at) "
                "VALUES (%s, %s, 'touch', 'auto', NOW(6))",
                (rows[0][0], user_id),
            )
            await conn.commit()

    try:
        return await run_events(work, first_user)
    finally:
        await session.close()
        pool.close()
        await pool.wait_closed()


def start_model_server(delay_s: float = 0.0) -> tuple[subprocess.Popen[str], str]:
    # The model runs in a process of its own, so its CPU stays out of the figures.
    server = subprocess.Popen(  # noqa: S603 - fixed arguments
        [sys.executable, "-m", "bench.model_server", str(delay_s)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None
    return server, server.stdout.readline().strip()


async def measure(api_base: str) -> dict[str, Any]:
    database = MariaDbDatabase().create()
    try:
        figures = {
            "bare_reference": await bare_reference(database, api_base),
            "before: acompletion+aiomysql, statements through SQLAlchemy": await service_variant(
                database, api_base, "aiomysql", fast=False, direct=False
            ),
            "session+aiomysql, prepared": await service_variant(database, api_base, "aiomysql", fast=True),
            "session+asyncmy, statements through SQLAlchemy": await service_variant(
                database, api_base, "asyncmy", fast=True, direct=False
            ),
            "session+asyncmy, prepared statements on the driver": await service_variant(
                database, api_base, "asyncmy", fast=True
            ),
            **await pool_variants(database, api_base),
        }
    finally:
        database.drop()
    return {"events": EVENTS, "in_flight": IN_FLIGHT, "cpu_ms_per_event": figures}


POOL_ROUNDS = 4
EMPTY_POOLS = "project sessions, empty pools"
FULL_POOLS = "project sessions, full pools (180 ACTIVE + 50 dismissed)"


async def pool_variants(database: MariaDbDatabase, api_base: str, events: int = EVENTS) -> dict[str, float]:
    """The same handler over empty and over full pools, taking turns in rounds, so that a change
    in the machine's load falls on both alike."""
    async with (
        service_handler(database, api_base, "asyncmy", True, pools="empty") as empty,
        service_handler(database, api_base, "asyncmy", True, pools="full") as full,
    ):
        spent: dict[str, list[float]] = {EMPTY_POOLS: [], FULL_POOLS: []}
        for _ in range(POOL_ROUNDS):
            for name, (work, first_user) in ((EMPTY_POOLS, empty), (FULL_POOLS, full)):
                spent[name].append(await run_events(work, first_user, events // POOL_ROUNDS))
    return {name: round(sum(figures) / len(figures), 2) for name, figures in spent.items()}


def main() -> dict[str, Any]:
    server, api_base = start_model_server()
    try:
        return asyncio.run(measure(api_base))
    finally:
        assert server.stdin is not None
        server.stdin.close()
        server.wait(10)


async def bare_only(api_base: str) -> dict[str, float]:
    database = MariaDbDatabase().create()
    try:
        return {"bare_reference": await bare_reference(database, api_base)}
    finally:
        database.drop()


async def pools_only(api_base: str, events: int) -> dict[str, float]:
    database = MariaDbDatabase().create()
    try:
        return await pool_variants(database, api_base, events)
    finally:
        database.drop()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--bare"]:  # bench/run.py's case 2, against its own model server
        print(json.dumps(asyncio.run(bare_only(sys.argv[2]))))
    elif sys.argv[1:2] == ["--pools"]:
        server, base = start_model_server()
        try:
            print(json.dumps(asyncio.run(pools_only(base, int(sys.argv[2]) if sys.argv[2:] else EVENTS))))
        finally:
            assert server.stdin is not None
            server.stdin.close()
            server.wait(10)
    else:
        print(json.dumps(main()))
