"""An erasure racing an extraction of the same user (issue 38): whichever commits first, nothing of
the user remains in any table. The model call is held open by a client that waits on a signal, so
each order is forced rather than hoped for."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from service.adapters.db.database import Database
from service.adapters.llm_client import LlmAnswer, LlmClient, StructuredOutput
from service.adapters.metrics import Metrics
from service.app.consolidation import Consolidator
from service.app.erasure import UserEraser
from service.app.extraction import Extracted
from service.core.consolidation import RunResult, Thresholds
from service.core.outcomes import Outcome
from tests.conftest import said
from tests.integration.conftest import HandlerFactory, make_event
from tests.support.meanwhile_llm import AnswerAfter
from tests.support.pool import items, remember_projects, seed, seed_many, set_capture
from tests.support.scripted_llm import ScriptedLlm
from tests.support.stored import rows_of_user

PROJECT = "proj-race"


async def a_user_with_rows(db: Database, llm: ScriptedLlm, user_id: int) -> None:
    """Capture on, a memory, a project; the model will answer one new fact."""
    await set_capture(db, user_id)
    await seed(db, user_id, f"旧事实{user_id}")
    await remember_projects(db, user_id, PROJECT)
    llm.script(f"m{user_id}", [{"type": "user", "content": f"新事实{user_id}"}])


def event_of(user_id: int) -> object:
    return make_event(user_id, 3, lastUserMessage=said(f"m{user_id}"), projectKey=PROJECT)


class Held:
    """The model's answer held back until `release`: `answered` is set once the answer is in."""

    def __init__(self) -> None:
        self.answered = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self) -> None:
        self.answered.set()
        await self.release.wait()


async def test_an_extraction_answered_after_the_erasure_committed_writes_nothing(
    any_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, llm_client: LlmClient, user_id: int
) -> None:
    db = any_db
    await a_user_with_rows(db, llm, user_id)
    held = Held()
    handler = make_handler(db, llm=AnswerAfter(llm_client, held))
    extraction = asyncio.create_task(handler.handle(event_of(user_id)))  # type: ignore[arg-type]
    await asyncio.wait_for(held.answered.wait(), 10)  # inside the model call, capture read as on

    removed = await UserEraser(db, Metrics()).erase(user_id)
    held.release.set()
    outcome, extracted = await asyncio.wait_for(extraction, 10)

    assert removed["memories"] == 1 and removed["capturePreference"] == 1 and removed["projects"] == 1
    assert (outcome, extracted) == (Outcome.SKIPPED_CAPTURE_OFF, None)
    assert set((await rows_of_user(db, user_id)).values()) == {0}


async def test_an_erasure_after_the_extraction_committed_removes_what_it_wrote(
    mysql_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int
) -> None:
    await a_user_with_rows(mysql_db, llm, user_id)
    outcome, _ = await make_handler(mysql_db).handle(event_of(user_id))  # type: ignore[arg-type]
    assert outcome is Outcome.EXTRACTED and len(await items(mysql_db, user_id)) == 2

    removed = await UserEraser(mysql_db, Metrics()).erase(user_id)

    assert (removed["memories"], removed["ledger"], removed["history"]) == (2, 1, 1)  # seeded: no history
    assert set((await rows_of_user(mysql_db, user_id)).values()) == {0}


async def test_an_erasure_waiting_on_the_persisting_extraction_removes_what_it_wrote(
    mysql_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, llm_client: LlmClient, user_id: int
) -> None:
    """The other order under the lock: the extraction's write is ahead of the erasure in the lock's
    queue; the erasure waits for it, then removes the rows it committed."""
    await a_user_with_rows(mysql_db, llm, user_id)
    held = Held()
    handler = make_handler(mysql_db, llm=AnswerAfter(llm_client, held))
    extraction = asyncio.create_task(handler.handle(event_of(user_id)))  # type: ignore[arg-type]
    await asyncio.wait_for(held.answered.wait(), 10)
    async with mysql_db.locked_user(user_id) as blocker:  # queues both writers, in this order:
        held.release.set()  # the extraction's write first,
        await asyncio.sleep(0.3)
        erasure = asyncio.create_task(UserEraser(mysql_db, Metrics()).erase(user_id))  # then the erasure
        await asyncio.sleep(0.3)
        assert not extraction.done() and not erasure.done()
        await blocker.commit()
    outcome, _ = await asyncio.wait_for(extraction, 10)
    removed = await asyncio.wait_for(erasure, 10)

    assert outcome is Outcome.EXTRACTED
    assert (removed["memories"], removed["ledger"]) == (2, 1)
    assert set((await rows_of_user(mysql_db, user_id)).values()) == {0}


@pytest.mark.parametrize("attempt", range(4))
async def test_an_erasure_and_an_extraction_released_together_leave_nothing(
    mysql_db: Database,
    make_handler: HandlerFactory,
    llm: ScriptedLlm,
    llm_client: LlmClient,
    user_id: int,
    attempt: int,
) -> None:
    """No order forced: the erasure and the extraction's write start at the same moment."""
    await a_user_with_rows(mysql_db, llm, user_id)
    eraser = UserEraser(mysql_db, Metrics())
    erasures: list[asyncio.Task[dict[str, int]]] = []

    async def erase_now() -> None:
        erasures.append(asyncio.create_task(eraser.erase(user_id)))
        await asyncio.sleep(attempt * 0.002)

    handler = make_handler(mysql_db, llm=AnswerAfter(llm_client, erase_now))
    await handler.handle(event_of(user_id))  # type: ignore[arg-type]
    await asyncio.gather(*erasures)

    assert set((await rows_of_user(mysql_db, user_id)).values()) == {0}


class ErasedWhileAsked:
    """The consolidation's model call: the erasure commits while it is in flight, then the
    provider answers with an error (the real client, a scripted 503)."""

    def __init__(self, llm: LlmClient, erase: Callable[[], Awaitable[object]]) -> None:
        self._llm = llm
        self._erase = erase

    def mode(self, model: str) -> StructuredOutput:
        return self._llm.mode(model)

    async def complete(self, *args: Any, **kwargs: Any) -> LlmAnswer:
        await self._erase()
        return await self._llm.complete(*args, **kwargs)


async def test_a_consolidation_of_an_erased_user_leaves_no_row_behind(
    any_db: Database, llm: ScriptedLlm, llm_client: LlmClient, user_id: int
) -> None:
    """A run scheduled by an extraction that committed before the erasure: its model call fails
    after the erasure, and the back-off it would record would recreate the user's row."""
    marker = f"c{user_id}"
    await seed_many(any_db, user_id, [f"{marker} 事实{i}" for i in range(3)])
    llm.script(marker, status=503)
    eraser = UserEraser(any_db, Metrics())
    consolidator = Consolidator(
        any_db,
        ErasedWhileAsked(llm_client, lambda: eraser.erase(user_id)),
        Metrics(),
        Thresholds(user_target=1),
    )

    results = await consolidator.run(Extracted(user_id, None, "openai/scripted-default", 1, 3))

    assert results == [RunResult.ABANDONED_ERROR]
    assert set((await rows_of_user(any_db, user_id)).values()) == {0}
