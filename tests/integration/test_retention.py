"""Retention on both dialects: touch runs folded across rounds, expired ledger rows, old trails of gone
memories, the periodic claim, and a database of 100,000 ledger and 50,000 history rows."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from service.adapters.db.database import Database
from service.adapters.db.engine import build_engine, upgrade_schema
from service.adapters.db.retention_repository import RetentionRepository
from service.adapters.db.tables import memory_event_ledger, memory_history, memory_item
from service.adapters.metrics import Metrics
from service.app import retention
from service.app.caches import CaptureSwitch
from service.app.memories import MemoryService, NotFound
from service.app.retention import Horizons, RetentionJob
from service.core.model import Scope, Status
from service.core.normalize import dedup_hash
from service.core.project_keys import RobotKeys
from service.entrypoints.http.api_models import HistoryItem
from tests.conftest import said
from tests.integration.conftest import HandlerFactory, make_event
from tests.support.clock import ManualClock
from tests.support.pool import items, ledger, set_capture
from tests.support.processes import MariaDbDatabase
from tests.support.scripted_llm import ScriptedLlm

HORIZONS = Horizons(ledger=timedelta(days=30), deleted_history=timedelta(days=365))
OUTPUT = Path(__file__).resolve().parents[1] / "output"


def history_row(user_id: int, memory_id: int, action: str, when: datetime) -> dict[str, object]:
    return {"memory_id": memory_id, "user_id": user_id, "action": action, "actor": "llm", "created_at": when}


async def write_trail(db: Database, user_id: int, memory_id: int, actions: list[str]) -> None:
    now = db.now()
    rows = [history_row(user_id, memory_id, a, now + timedelta(seconds=i)) for i, a in enumerate(actions)]
    async with db.transaction() as uow:
        await uow.conn.execute(memory_history.insert(), rows)
        await uow.commit()


async def stored_trail(db: Database, user_id: int) -> list[tuple[str, int]]:
    async with db.read() as uow:
        page = await RetentionRepository(uow.conn).history_page(user_id, (-1, -1), 100)
    return [(r.action, r.repeat_count) for r in page]


def iso(when: datetime) -> str:
    return when.isoformat(timespec="milliseconds") + "Z"


def counted(shown: list[dict[str, object]]) -> list[tuple[object, object]]:
    return [(h["action"], h["count"]) for h in shown]


def job(db: Database, metrics: Metrics | None = None) -> RetentionJob:
    return RetentionJob(db, metrics or Metrics(), HORIZONS)


async def trail(db: Database, user_id: int, memory_id: int) -> list[dict[str, object]]:
    """The history as the API shows it."""
    return [
        HistoryItem.of(r)
        for r in await MemoryService(db, CaptureSwitch(db, 0), RobotKeys()).history(user_id, memory_id)
    ]


async def test_touch_runs_fold_across_rounds_and_the_trail_still_replays(
    any_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int, clock: ManualClock
) -> None:
    """Session 1: insert, touch ×4; user dismiss and restore; session 2: touch ×2 → retention → session
    2: touch ×2 more → retention."""
    await set_capture(any_db, user_id)
    handler = make_handler(any_db)
    memories = MemoryService(any_db, CaptureSwitch(any_db, 0), RobotKeys())
    llm.script(f"m{user_id}", [{"type": "user", "content": "报告用中文写"}])

    async def round_of(session: int, times: int) -> None:
        for _ in range(times):
            clock.advance(timedelta(hours=1))
            await handler.handle(make_event(user_id, session, lastUserMessage=said(f"m{user_id}")))

    await round_of(1, 5)
    [item] = await items(any_db, user_id)
    first_touch_at = clock.now() - timedelta(hours=3)  # events came hourly; the first was the insert
    clock.advance(timedelta(minutes=5))
    await memories.edit(user_id, item.id, None, Status.DISMISSED)
    await memories.edit(user_id, item.id, None, Status.ACTIVE)
    await round_of(2, 2)

    await job(any_db).run_once()

    shown = await trail(any_db, user_id, item.id)
    assert counted(shown) == [("insert", 1), ("touch", 4), ("dismiss", 1), ("restore", 1), ("touch", 2)]
    # The folded row spans the first touch to the fourth, three hours later.
    assert (shown[1]["createdAt"], shown[1]["lastAt"]) == (
        iso(first_touch_at),
        iso(first_touch_at + timedelta(hours=3)),
    )

    await round_of(2, 2)
    again = await job(any_db).run_once()
    shown = await trail(any_db, user_id, item.id)
    assert counted(shown) == [("insert", 1), ("touch", 4), ("dismiss", 1), ("restore", 1), ("touch", 4)]
    assert again.touches_folded >= 2
    [after] = await items(any_db, user_id)
    assert after.content == "报告用中文写" and after.status == Status.ACTIVE.value


async def test_a_fold_keeps_every_session_and_model_that_touched_the_memory(
    any_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int, clock: ManualClock
) -> None:
    """The history API's originSessionId and model of each touch survive retention: only touches of one
    session by one model fold together."""
    await set_capture(any_db, user_id)
    llm.script(f"m{user_id}", [{"type": "user", "content": "报告用中文写"}])
    plan = [(1, "openai/model-a")] * 3 + [(2, "openai/model-a")] * 2 + [(2, "openai/model-b")] * 2
    for session, model in plan:
        clock.advance(timedelta(hours=1))
        event = make_event(user_id, session, lastUserMessage=said(f"m{user_id}"))
        await make_handler(any_db, default_model=model).handle(event)
    [item] = await items(any_db, user_id)

    await job(any_db).run_once()

    shown = [
        (h["action"], h["originSessionId"], h["model"], h["count"])
        for h in await trail(any_db, user_id, item.id)
    ]
    assert shown == [
        ("insert", 1, "openai/model-a", 1),
        ("touch", 1, "openai/model-a", 2),
        ("touch", 2, "openai/model-a", 2),
        ("touch", 2, "openai/model-b", 2),
    ]


async def test_a_fold_that_lost_a_race_changes_nothing(any_db: Database, user_id: int) -> None:
    """Two replicas folding one run: the second finds the keeper's count changed and backs off."""
    await write_trail(any_db, user_id, 1, ["insert", "touch", "touch", "touch"])
    async with any_db.read() as uow:
        page = await RetentionRepository(uow.conn).history_page(user_id, (-1, -1), 100)
    folds, open_run = retention.fold_touches(page, None)
    assert folds == [] and open_run is not None  # the run reaches the page's end
    plan = open_run.close()
    assert plan is not None
    results = []
    for _ in range(2):
        async with any_db.transaction() as uow:
            results.append(await RetentionRepository(uow.conn).apply_fold(plan))
            await uow.commit()
    assert results == [2, 0]
    assert await stored_trail(any_db, user_id) == [("insert", 1), ("touch", 3)]


async def test_expired_ledger_rows_go_and_recent_ones_still_make_redeliveries_skips(
    any_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int, clock: ManualClock
) -> None:
    await set_capture(any_db, user_id)
    llm.script(f"m{user_id}", [{"type": "user", "content": "报告用中文写"}])
    handler = make_handler(any_db)
    old = make_event(user_id, 1, lastUserMessage=said(f"m{user_id}"))
    await handler.handle(old)
    clock.advance(timedelta(days=29))
    recent = make_event(user_id, 2, lastUserMessage=said(f"m{user_id}"))
    await handler.handle(recent)
    clock.advance(timedelta(days=2))

    metrics = Metrics()
    report = await job(any_db, metrics).run_once()

    assert await ledger(any_db, old.event_id) == [] and len(await ledger(any_db, recent.event_id)) == 1
    assert report.ledger_deleted >= 1
    assert metrics.retention_removed.labels("ledger_expired")._value.get() == report.ledger_deleted
    assert (await handler.handle(recent))[0].value == "skipped_duplicate_event"


async def test_the_trail_of_a_memory_gone_for_a_year_is_removed_and_no_other(
    any_db: Database, user_id: int, clock: ManualClock
) -> None:
    memories = MemoryService(any_db, CaptureSwitch(any_db, 0), RobotKeys())
    kept_alive = await memories.create(user_id, Scope.USER, "一直都在的记忆", None)
    gone_long = await memories.create(user_id, Scope.USER, "很久以前删掉的", None)
    gone_recently = await memories.create(user_id, Scope.USER, "最近删掉的", None)
    await memories.delete(user_id, gone_long.id)
    clock.advance(timedelta(days=200))
    await memories.delete(user_id, gone_recently.id)
    clock.advance(timedelta(days=200))

    report = await job(any_db).run_once()

    assert report.history_purged >= 2  # create + delete of the long-gone memory
    with pytest.raises(NotFound):
        await trail(any_db, user_id, gone_long.id)
    assert [h["action"] for h in await trail(any_db, user_id, gone_recently.id)] == ["create", "delete"]
    assert [h["action"] for h in await trail(any_db, user_id, kept_alive.id)] == ["create"]


async def test_the_periodic_run_is_claimed_once_per_interval(any_db: Database, clock: ManualClock) -> None:
    key = f"retention.test.{time.monotonic_ns()}"

    async def claim() -> bool:
        async with any_db.transaction() as uow:
            claimed = await uow.accounts.claim_periodic(key, any_db.now(), timedelta(hours=24))
            await uow.commit()
        return claimed

    assert await asyncio.gather(claim(), claim()) in ([True, False], [False, True])
    clock.advance(timedelta(hours=23))
    assert await claim() is False
    clock.advance(timedelta(hours=1))
    assert await claim() is True and await claim() is False


async def test_pages_smaller_than_a_run_fold_it_whole(
    any_db: Database, user_id: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(retention, "HISTORY_PAGE", 3)
    await write_trail(any_db, user_id, 9, ["insert", *["touch"] * 7, "demote", "touch"])
    await job(any_db).run_once()
    assert await stored_trail(any_db, user_id) == [("insert", 1), ("touch", 7), ("demote", 1), ("touch", 1)]


USERS, LIVE, GONE, TOUCHES = 500, 5, 5, 8


@pytest.fixture(params=["mysql", "sqlite"])
async def fresh_db(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Database]:
    """A database of its own, so row counts before and after are exact."""
    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path / 'retention.db'}"
        upgrade_schema(url)
        db = Database(build_engine(url, 1))
        yield db
        await db.dispose()
        return
    mariadb = MariaDbDatabase().create()
    db = Database(build_engine(mariadb.url, 4), build_engine(mariadb.url, 4, autocommit=True))
    try:
        yield db
    finally:
        await db.dispose()
        mariadb.drop()


async def seed_large(db: Database) -> None:
    """100,000 ledger rows (half past the horizon); 50,000 history rows: per user, five live memories
    (insert + 9 touches each) and five deleted 400 days ago (insert, 8 touches, delete)."""
    now = db.now()
    ledger_rows = [
        {
            "event_id": f"evt-{i}",
            "user_id": i % USERS,
            "session_id": i,
            "outcome": "extracted",
            "processed_at": now - timedelta(days=40 if i % 2 else 10, seconds=i),
        }
        for i in range(100_000)
    ]
    items_rows = [
        {
            "user_id": u,
            "scope": "USER",
            "project_key": "",
            "content": f"fact {u}-{m}",
            "source": "AUTO",
            "status": "ACTIVE",
            "dedup_hash": dedup_hash(Scope.USER, "", f"fact {u}-{m}"),
            "created_at": now,
            "updated_at": now,
        }
        for u in range(USERS)
        for m in range(LIVE)
    ]
    async with db.transaction() as uow:
        for start in range(0, len(ledger_rows), 5000):
            await uow.conn.execute(memory_event_ledger.insert(), ledger_rows[start : start + 5000])
        await uow.conn.execute(memory_item.insert(), items_rows)
        live = (await uow.conn.execute(sa.select(memory_item.c.id, memory_item.c.user_id))).all()
        history_rows: list[dict[str, object]] = []
        for memory_id, user_id in live:
            recent = now - timedelta(days=1)
            history_rows += [history_row(user_id, memory_id, "insert", recent)]
            history_rows += [history_row(user_id, memory_id, "touch", recent) for _ in range(TOUCHES + 1)]
        for user_id in range(USERS):
            for m in range(GONE):
                gone_id, old = 10_000_000 + user_id * GONE + m, now - timedelta(days=400)
                history_rows += [history_row(user_id, gone_id, "insert", old)]
                history_rows += [history_row(user_id, gone_id, "touch", old) for _ in range(TOUCHES)]
                history_rows += [history_row(user_id, gone_id, "delete", old)]
        for start in range(0, len(history_rows), 5000):
            await uow.conn.execute(memory_history.insert(), history_rows[start : start + 5000])
        await uow.commit()


@pytest.mark.slow  # a volume run: `make test-fast` leaves it out
async def test_a_run_over_100k_ledger_and_50k_history_rows(fresh_db: Database) -> None:
    """Figures go to tests/output/retention-<dialect>.json. While it runs, a writer takes one user's lock
    over and over, as extraction does: how long it waited is the time the job kept a user locked."""
    await seed_large(fresh_db)
    probe_user, waits, stop = USERS + 1, [0.0], asyncio.Event()

    async def extraction_like_writer() -> None:
        while not stop.is_set():
            asked = time.perf_counter()
            async with fresh_db.locked_user(probe_user) as uow:
                waits.append(time.perf_counter() - asked)
                await uow.commit()
            await asyncio.sleep(0.005)

    writer = asyncio.create_task(extraction_like_writer())
    try:
        report = await job(fresh_db).run_once()
    finally:
        stop.set()
        await writer

    history_before = USERS * (LIVE * (TOUCHES + 2) + GONE * (TOUCHES + 2))
    assert report.rows_before == {
        "memory_event_ledger": 100_000,
        "memory_history": history_before,
        "memory_item": 2500,
    }
    # Live memories keep their insert and one folded touch; the deleted ones' trails are gone.
    assert report.rows_after == {
        "memory_event_ledger": 50_000,
        "memory_history": USERS * LIVE * 2,
        "memory_item": 2500,
    }
    assert report.ledger_deleted == 50_000
    assert report.transactions >= 50 + USERS  # ledger batches, one fold page and one purge per user
    # Small transactions: none holds the database for more than a tenth of the run.
    assert report.longest_transaction_ms < report.duration_s * 1000 / 10
    async with fresh_db.read() as uow:
        counts = (
            (
                await uow.conn.execute(
                    sa.select(memory_history.c.repeat_count).where(memory_history.c.action == "touch")
                )
            )
            .scalars()
            .all()
        )
    assert set(counts) == {TOUCHES + 1}
    figures = {
        "dialect": fresh_db.engine.dialect.name,
        **report.as_dict(),
        "writer_lock_waits": len(waits),
        "writer_longest_wait_ms": round(max(waits) * 1000, 2),
    }
    OUTPUT.mkdir(exist_ok=True)
    (OUTPUT / f"retention-{figures['dialect']}.json").write_text(json.dumps(figures, indent=2))
    print(json.dumps(figures))


async def test_a_run_reports_its_progress_after_each_transaction(
    any_db: Database, user_id: int, clock: ManualClock
) -> None:
    memories = MemoryService(any_db, CaptureSwitch(any_db, 0), RobotKeys())
    for i in range(3):
        await memories.delete(
            user_id, (await memories.create(user_id, Scope.USER, f"删掉的第{i}条", None)).id
        )
    clock.advance(timedelta(days=400))
    seen: list[tuple[int, int]] = []

    report = await job(any_db).run_once(lambda r: seen.append((r.transactions, r.history_purged)))

    assert [t for t, _ in seen] == list(range(1, report.transactions + 1))  # after each one
    assert seen == sorted(seen) and seen[-1] == (report.transactions, report.history_purged)
    assert report.history_purged >= 6
    assert "history rows purged" in report.line()
