"""Round trips per extracted event, counted by the server: `python -m bench.round_trips [driver]`.

Runs the real extraction handler in this process over a fresh MariaDB database and the scripted
model, and reads MariaDB's global statement counters around a batch of events (one new fact, one
restated fact per user, as a steady pool sees them), in sessions of a project: once with users whose
pools are empty, once with full ones (`tests/support/full_pool.py`). Prints one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import pymysql

from bench.cpu_profile import seed_full_pools
from service.adapters.db.database import Database
from service.adapters.db.engine import build_engine
from service.adapters.llm_client import LlmClient
from service.adapters.metrics import Metrics
from service.app.caches import CaptureSwitch, ProjectRecorder
from service.app.extraction import ExtractionHandler, ExtractionSlots
from service.config import Settings
from service.core.events import TaskFinishedEvent
from tests.support.backends import mysql_server
from tests.support.full_pool import PROJECT
from tests.support.processes import MariaDbDatabase
from tests.support.scripted_llm import ScriptedLlm

COUNTERS = (
    "Com_select",
    "Com_insert",
    "Com_update",
    "Com_delete",
    "Com_commit",
    "Com_rollback",
    "Com_set_option",
    "Com_begin",
    "Questions",
)
USERS = 50


def counters() -> dict[str, int]:
    with (
        pymysql.connect(host=mysql_server().host, port=mysql_server().port, user="root") as conn,
        conn.cursor() as cur,
    ):
        cur.execute("SHOW GLOBAL STATUS WHERE Variable_name IN %s", (COUNTERS,))
        return {name: int(value) for name, value in cur.fetchall()}


def event(user_id: int, session: int, marker: str) -> TaskFinishedEvent:
    """An event of a session of PROJECT; `marker` picks the scripted answer."""
    return TaskFinishedEvent.model_validate_json(
        json.dumps(
            {
                "eventId": f"rt-{user_id}-{session}",
                "projectKey": PROJECT,
                "occurredAt": "2026-12-03T10:00:00Z",
                "sessionId": session,
                "userId": user_id,
                "phase": "COMPLETED",
                "sessionType": "MAIN",
                "lastUserMessage": f"请记住这个长期偏好({marker}):以后所有的报告都用中文来写。",
                "lastAssistantMessage": "好的。",
            }
        )
    )


async def main(driver: str) -> dict[str, Any]:
    by_pool = {pools: await per_event(driver, pools) for pools in ("empty", "full")}
    return {"driver": driver, "events": 2 * USERS, "per_event": by_pool}


async def per_event(driver: str, pools: str) -> dict[str, float]:
    database = MariaDbDatabase().create()
    if pools == "full":
        seed_full_pools(database, range(1, USERS + 1))
    llm = ScriptedLlm(record=False).start()
    url = database.url.replace("mysql+asyncmy://", f"mysql+{driver}://")
    db = Database(build_engine(url, 10), build_engine(url, 10, autocommit=True))
    client = LlmClient(Metrics(), llm.api_base, "k", timeout_s=5, max_retries=0, retry_base_s=0.01)
    settings = Settings(_env_file=None, default_model="openai/gpt-4o-mini", capture_cache_ttl_s=60)  # type: ignore[call-arg]
    handler = ExtractionHandler(
        db,
        client,
        Metrics(),
        settings,
        CaptureSwitch(db, 60),
        ProjectRecorder(db),
        ExtractionSlots.of(16, 10),
    )
    try:
        for u in range(USERS):
            async with db.transaction() as uow:
                await uow.accounts.set_capture(u + 1, True, db.now())
                await uow.commit()
            llm.script(f"rt-{u + 1}", [{"type": "user", "content": f"用户{u + 1}的偏好"}])
        await handler.warm(range(1, USERS + 1))
        for u in range(USERS):  # warm-up: each user's first event, connections opened
            await handler.handle(event(u + 1, 1, f"rt-{u + 1}"))
        before = counters()
        for session in (2, 3):
            for u in range(USERS):
                await handler.handle(event(u + 1, session, f"rt-{u + 1}"))
        after = counters()
    finally:
        await client.stop()
        await db.dispose()
        llm.stop()
        database.drop()
    return {k.removeprefix("Com_"): round((after[k] - before[k]) / (2 * USERS), 2) for k in COUNTERS}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "asyncmy"))))
