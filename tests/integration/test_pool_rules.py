"""Sequences that broke the pool's rules (issue 39), each on MariaDB and SQLite through the real
handlers: a user's dismissal of a demoted fact, blank texts from the model, and a delete during
retention's scan."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from service.adapters.db.database import Database
from service.adapters.db.retention_repository import RetentionRepository
from service.adapters.llm_client import LlmClient
from service.adapters.metrics import Metrics
from service.app.caches import CaptureSwitch
from service.app.consolidation import Consolidator
from service.app.extraction import Extracted, ModelRejected
from service.app.memories import MemoryService, NotFound
from service.app.retention import Horizons, RetentionJob
from service.core.consolidation import RunResult, Thresholds
from service.core.model import DismissedBy, Scope, Status
from service.core.normalize import identity
from service.core.outcomes import Outcome
from service.core.project_keys import RobotKeys
from tests.conftest import said
from tests.integration.conftest import HandlerFactory, make_event
from tests.support.clock import ManualClock
from tests.support.pool import history, items, seed_many, set_capture
from tests.support.scripted_llm import ScriptedLlm

MODEL = "openai/scripted-default"
HORIZONS = Horizons(ledger=timedelta(days=30), deleted_history=timedelta(days=365))


def service(db: Database) -> MemoryService:
    return MemoryService(db, CaptureSwitch(db, 0), RobotKeys())


async def extract(db: Database, make_handler: HandlerFactory, user_id: int, session: int) -> Outcome:
    event = make_event(user_id, session, lastUserMessage=said(f"m{user_id}"))
    return (await make_handler(db).handle(event))[0]


async def test_dismissing_a_fact_demoted_for_room_is_the_users_rejection_for_good(
    any_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int
) -> None:
    """The user says no to a demoted fact: D3 holds from then on, though the row was DISMISSED."""
    await set_capture(any_db, user_id)
    ids = await seed_many(any_db, user_id, [f"事实{i}" for i in range(200)])
    llm.script(f"m{user_id}", [{"type": "user", "content": "新事实"}], times=1)
    llm.script(f"m{user_id}", [{"type": "user", "content": "事实0"}])
    await extract(any_db, make_handler, user_id, 1)  # demotes 事实0 for room

    item = await service(any_db).edit(user_id, ids[0], None, Status.DISMISSED)

    assert (item.status, item.dismissed_by) == (Status.DISMISSED, DismissedBy.USER)
    trail = [(h["action"], h["actor"]) for h in await history(any_db, user_id) if h["memory_id"] == ids[0]]
    assert trail == [("demote", "auto"), ("dismiss", "user")]
    assert await extract(any_db, make_handler, user_id, 2) is Outcome.EXTRACTED  # the model restates it
    rows = {i.id: i for i in await items(any_db, user_id)}
    assert rows[ids[0]].status == "DISMISSED"
    assert "事实0" in llm.calls(f"m{user_id}")[-1].data["dismissed"]  # now on the negative list
    again = await service(any_db).edit(user_id, ids[0], None, Status.DISMISSED)  # a second click
    assert again.dismissed_by is DismissedBy.USER
    assert len([h for h in await history(any_db, user_id) if h["memory_id"] == ids[0]]) == 2


async def test_blank_texts_from_the_model_are_never_written(
    any_db: Database,
    make_handler: HandlerFactory,
    llm: ScriptedLlm,
    llm_client: LlmClient,
    user_id: int,
) -> None:
    """An update to a Hangul filler, a blank insert and a blank merge: blank by the identity rule,
    though `clean_content` keeps them. Each is dropped, and the three facts stay as they were."""
    await set_capture(any_db, user_id)
    facts = [f"c{user_id} 事实{n}" for n in "甲乙丙"]
    ids = await seed_many(any_db, user_id, facts)
    llm.script(
        f"m{user_id}",
        [
            {"type": "user", "action": "update", "existingId": 1, "content": "\u3164"},
            {"type": "user", "action": "insert", "content": "\u115f\u2800\ufe0f"},
        ],
    )
    assert await extract(any_db, make_handler, user_id, 1) is Outcome.EXTRACTED
    llm.script(f"c{user_id}", [{"op": "merge", "sourceIds": [2, 3], "content": "\u3164\u3164"}])
    consolidator = Consolidator(any_db, llm_client, Metrics(), Thresholds(1, 1, 1))
    assert await consolidator.run(Extracted(user_id, None, MODEL, 1, 3)) == [RunResult.ABANDONED_INVALID]

    rows = await items(any_db, user_id)
    assert [(r.id, r.content, r.status) for r in rows] == [
        (i, f, "ACTIVE") for i, f in zip(ids, facts, strict=True)
    ]
    assert all(identity(h["new_content"] or "x") for h in await history(any_db, user_id))


async def test_a_memory_deleted_while_retention_scans_keeps_its_trail(
    any_db: Database, clock: ManualClock, monkeypatch: pytest.MonkeyPatch, user_id: int
) -> None:
    """Retention reads the user's history, then the live ids. A delete between the two made the
    memory look long gone: its whole trail went, the delete row just written included."""
    memories = service(any_db)
    item = await memories.create(user_id, Scope.USER, "很久以前写下的事实", None)
    clock.advance(timedelta(days=400))  # its trail is older than the horizon
    live_ids = RetentionRepository.memory_ids

    async def deleted_meanwhile(repo: RetentionRepository, user: int) -> list[int]:
        if user == user_id and await memories.get(user_id, item.id):
            await memories.delete(user_id, item.id)
        return await live_ids(repo, user)

    monkeypatch.setattr(RetentionRepository, "memory_ids", deleted_meanwhile)
    await RetentionJob(any_db, Metrics(), HORIZONS).run_once()

    trail = [(h.action, h.actor) for h in await memories.history(user_id, item.id)]
    assert trail == [("create", "user"), ("delete", "user")]
    monkeypatch.undo()
    clock.advance(timedelta(days=366))  # once the delete itself is old, the trail goes
    await RetentionJob(any_db, Metrics(), HORIZONS).run_once()
    with pytest.raises(NotFound):
        await memories.history(user_id, item.id)


@pytest.mark.parametrize("first_fails", [True, False])
async def test_a_refusal_owed_only_to_an_extraction_in_flight_waits_for_it(
    any_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int, first_fails: bool
) -> None:
    """At the limit, an extraction in flight may fail and never reach the ledger: an event refused
    for it alone is not skipped for good, it is counted again once that one is over."""
    await set_capture(any_db, user_id)
    slow, later = f"slow{user_id}", f"later{user_id}"
    llm.script(
        slow, [{"type": "user", "content": "第一个事实"}], status=400 if first_fails else 200, delay_s=0.5
    )
    llm.script(later, [{"type": "user", "content": "第二个事实"}])
    handler = make_handler(any_db, extractions_per_user_per_day=1)
    first = asyncio.ensure_future(handler.handle(make_event(user_id, 1, lastUserMessage=said(slow))))
    while not llm.calls(slow):
        await asyncio.sleep(0.01)

    outcome, _ = await handler.handle(make_event(user_id, 2, lastUserMessage=said(later)))

    if first_fails:
        with pytest.raises(ModelRejected):
            await first
        assert outcome is Outcome.EXTRACTED
        assert [i.content for i in await items(any_db, user_id)] == ["第二个事实"]
    else:
        assert (await first)[0] is Outcome.EXTRACTED
        assert outcome is Outcome.SKIPPED_BUDGET  # the ledger's own count refuses it
        assert not llm.calls(later)
