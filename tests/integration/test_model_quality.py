"""Each extraction model's quality from real history on both dialects: memories written by the
extraction handler (scripted model) and judged by the user through `MemoryService`, and random
histories checked memory by memory against the plain count (`tests/support/quality.py`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime, timedelta

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.adapters.db.database import Database
from service.adapters.db.engine import build_engine, upgrade_schema
from service.adapters.db.tables import memory_history, memory_item
from service.adapters.metrics import Metrics
from service.app.caches import CaptureSwitch
from service.app.memories import MemoryService
from service.app.model_quality import ModelQualityReport
from service.core.model import Status
from service.core.model_quality import NO_MODEL, Rejection
from service.core.project_keys import RobotKeys
from service.core.records import HistoryAction, HistoryActor, HistoryEntry
from tests.conftest import said
from tests.integration.conftest import HandlerFactory, make_event
from tests.support.clock import ManualClock
from tests.support.pool import history, items, set_capture
from tests.support.processes import MariaDbDatabase
from tests.support.quality import Fate, expected, fates, shapes
from tests.support.scripted_llm import ScriptedLlm

NOW = datetime(2031, 3, 1, 12, 0)


@pytest.fixture(scope="module", params=["sqlite", "mysql"])
async def own_db(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Database]:
    """A database of this module's alone: the figures are over every user's history."""
    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('quality') / 'memory.db'}"
        upgrade_schema(url)
        db = Database(build_engine(url, pool_size=1))
        yield db
        await db.dispose()
        return
    mariadb = MariaDbDatabase().create()
    db = Database(build_engine(mariadb.url, pool_size=4), build_engine(mariadb.url, 4, autocommit=True))
    yield db
    await db.dispose()
    mariadb.drop()


@pytest.fixture
async def db(own_db: Database) -> AsyncIterator[Database]:
    """Emptied, on a hand-moved clock."""
    await _empty(own_db)
    previous = own_db.clock
    own_db.clock = ManualClock(NOW)
    yield own_db
    own_db.clock = previous


async def _empty(db: Database) -> None:
    async with db.transaction() as uow:
        await uow.conn.execute(sa.delete(memory_history))
        await uow.conn.execute(sa.delete(memory_item))
        await uow.commit()


async def write_fates(db: Database, memories: list[Fate]) -> None:
    """Each fate as the history the service writes: the insert, touches, a restore that is no
    rejection, the user's first rejection and a second one that must not count again."""
    async with db.transaction() as uow:
        for memory_id, fate in enumerate(memories, start=1):
            born = NOW - timedelta(days=fate.age_days)

            async def row(
                action: HistoryAction, actor: HistoryActor, at: datetime, model: str | None = None
            ) -> None:
                entry = HistoryEntry(action, actor, model=model)
                await uow.memories.record(7, memory_id, entry, at)  # noqa: B023 (awaited at once)

            await row(HistoryAction.INSERT, HistoryActor.AUTO, born, fate.model)
            for i in range(fate.touches):
                await row(HistoryAction.TOUCH, HistoryActor.AUTO, born + timedelta(minutes=1 + i), "openai/b")
            await row(HistoryAction.RESTORE, HistoryActor.USER, born + timedelta(seconds=30))
            if fate.rejected_after is not None and fate.rejection is not None:
                at = born + timedelta(days=fate.rejected_after)
                await row(HistoryAction(fate.rejection.value), HistoryActor.USER, at)
                await row(HistoryAction.DISMISS, HistoryActor.USER, at + timedelta(seconds=1))
        await uow.commit()


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(memories=st.lists(fates(), max_size=12))
async def test_the_query_counts_what_the_memories_say_one_by_one(db: Database, memories: list[Fate]) -> None:
    await _empty(db)
    await write_fates(db, memories)
    assert shapes(await ModelQualityReport(db, Metrics()).figures()) == expected(memories)


async def test_the_window_ends_90_days_back_and_a_consolidators_or_users_rows_are_no_insert(
    db: Database,
) -> None:
    async with db.transaction() as uow:
        old = HistoryEntry(HistoryAction.INSERT, HistoryActor.AUTO, model="openai/a")
        await uow.memories.record(7, 1, old, NOW - timedelta(days=91))
        merged = HistoryEntry(HistoryAction.MERGE, HistoryActor.CONSOLIDATOR, model="openai/a")
        await uow.memories.record(7, 2, merged, NOW - timedelta(days=1))
        await uow.memories.record(7, 3, HistoryEntry(HistoryAction.CREATE, HistoryActor.USER), NOW)
        await uow.memories.record(7, 4, HistoryEntry(HistoryAction.INSERT, HistoryActor.AUTO), NOW)
        await uow.commit()
    [only] = await ModelQualityReport(db, Metrics()).figures()
    assert (only.model, only.created) == (NO_MODEL, 1)


async def test_a_scripted_week_shows_which_model_users_reject(
    db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int
) -> None:
    """Model A writes four memories 40 days ago, model B four 10 days ago, extracted by the real
    handler; the user dismisses, deletes (erasing the history's texts) and edits some, and a later
    extraction re-confirms one. The figures, the endpoint's source, and the gauges agree."""
    clock = db.clock
    assert isinstance(clock, ManualClock)
    await set_capture(db, user_id)
    service = MemoryService(db, CaptureSwitch(db, 0), RobotKeys())
    facts = {f"q{user_id}-{i}": f"第{i}条偏好:报告里的表格都用{i}号字体来排版" for i in range(8)}
    for marker, fact in facts.items():
        llm.script(marker, [{"type": "user", "content": fact}])
    clock.advance(timedelta(days=-40))

    async def extract(markers: list[str], model: str) -> None:
        for n, marker in enumerate(markers):
            clock.advance(timedelta(minutes=1))
            event = make_event(user_id, n + 1, lastUserMessage=said(marker))
            await make_handler(db, default_model=model).handle(event)

    markers = list(facts)
    await extract(markers[:4], "openai/model-a")
    rows = {r.content: r.id for r in await items(db, user_id)}
    a = [rows[facts[m]] for m in markers[:4]]
    clock.advance(timedelta(days=2))
    await service.edit(user_id, a[0], None, Status.DISMISSED)  # A: dismissed within 7 days
    clock.advance(timedelta(days=10))
    await service.edit(user_id, a[1], "表格一律用五号字", None)  # A: edited within 30 days
    await extract([markers[2]], "openai/model-b")  # A's third re-confirmed by B
    clock.advance(timedelta(days=18))
    await extract(markers[4:], "openai/model-b")  # B: ten days before NOW
    rows = {r.content: r.id for r in await items(db, user_id)}
    b = [rows[facts[m]] for m in markers[4:]]
    clock.advance(timedelta(days=1))
    await service.delete(user_id, b[0])
    await service.delete(user_id, b[1])
    clock.advance(timedelta(days=5))
    await service.edit(user_id, b[2], None, Status.DISMISSED)
    clock.advance(timedelta(days=4) - timedelta(minutes=10))
    assert clock.now() <= NOW

    erased = [h for h in await history(db, user_id) if h["memory_id"] in b[:2]]
    assert erased and all(h["new_content"] is None and h["old_content"] is None for h in erased)
    metrics = Metrics()
    figures = await ModelQualityReport(db, metrics).refresh()

    by_model = {q.model: q for q in figures}
    model_a, model_b = by_model["openai/model-a"], by_model["openai/model-b"]
    assert (model_a.created, model_a.reconfirmed, model_a.touches) == (4, 1, 1)
    assert [
        (h.cohort, h.rejected[Rejection.DISMISSED], h.rejected[Rejection.EDITED]) for h in model_a.horizons
    ] == [
        (4, 1, 0),
        (4, 1, 1),
    ]
    assert (model_b.created, model_b.reconfirmed) == (4, 0)
    seven, thirty = model_b.horizons
    assert (seven.cohort, seven.rejected[Rejection.DELETED], seven.rejected[Rejection.DISMISSED]) == (4, 2, 1)
    assert (seven.rejected_rate, thirty.cohort, thirty.rejected_rate) == (0.75, 0, None)
    sample = metrics.registry.get_sample_value
    assert sample("mao_memory_model_memories_created", {"model": "openai/model-b"}) == 4
    assert (
        sample(
            "mao_memory_model_memories_rejected",
            {"model": "openai/model-b", "kind": "deleted", "within": "7d"},
        )
        == 2
    )
    assert sample("mao_memory_model_memories_cohort", {"model": "openai/model-a", "within": "30d"}) == 4
    assert sample("mao_memory_model_memories_reconfirmed", {"model": "openai/model-a"}) == 1

    await _empty(db)
    await ModelQualityReport(db, metrics).refresh()
    assert sample("mao_memory_model_memories_created", {"model": "openai/model-b"}) is None
