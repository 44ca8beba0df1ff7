"""Sequences that broke the pool's rules (issue 39), each on MariaDB and SQLite through the real
handlers: a user's dismissal of a demoted fact, and blank texts from the model."""

from __future__ import annotations

from service.adapters.db.database import Database
from service.adapters.llm_client import LlmClient
from service.adapters.metrics import Metrics
from service.app.caches import CaptureSwitch
from service.app.consolidation import Consolidator
from service.app.extraction import Extracted
from service.app.memories import MemoryService
from service.core.consolidation import RunResult, Thresholds
from service.core.model import DismissedBy, Status
from service.core.normalize import identity
from service.core.outcomes import Outcome
from service.core.project_keys import RobotKeys
from tests.conftest import said
from tests.integration.conftest import HandlerFactory, make_event
from tests.support.pool import history, items, seed_many, set_capture
from tests.support.scripted_llm import ScriptedLlm

MODEL = "openai/scripted-default"


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
