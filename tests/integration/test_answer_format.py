"""The prompt's answer format and the request's structured-output mode are one decision, whatever the
client learns while an event waits for its model slot (issue 39, defect 4)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from service.adapters.db.database import Database
from service.adapters.llm_client import LlmClient, StructuredOutput
from service.adapters.metrics import Metrics
from service.core.comparison_set import ComparisonSet
from service.core.extraction_prompt import build_extraction_messages
from service.core.outcomes import Outcome
from tests.conftest import said
from tests.integration.conftest import HandlerFactory, make_event
from tests.support.pool import items, set_capture
from tests.support.scripted_llm import Request, ScriptedLlm


def formatted(request: Request) -> bool:
    return request.body.get("response_format") is not None


@pytest.fixture
async def client(llm: ScriptedLlm) -> AsyncIterator[LlmClient]:
    made = LlmClient(
        Metrics(),
        llm.api_base,
        None,
        timeout_s=10,
        max_retries=2,
        retry_base_s=0.01,
        structured_output=StructuredOutput.JSON_OBJECT,
    )
    yield made
    await made.stop()


async def test_a_mode_restored_while_an_event_waits_for_its_slot_is_not_sent_to_its_bare_prompt(
    sqlite_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, client: LlmClient, user_id: int
) -> None:
    """A model loading (503 in every format) walks the client down to no structured output, and
    json_object is due back after `MODE_RETRY_S`. An event builds its prompt (a bare array) while
    another holds the only model slot; json_object comes back before its turn. Sent as json_object,
    the model answers an object the bare prompt never named, and the event's facts would be lost."""
    await set_capture(sqlite_db, user_id)
    walk, hold, wait = (f"{name}{user_id}" for name in ("walk", "hold", "wait"))
    llm.script(walk, status=503, only_if=formatted)
    llm.script(walk, [])
    llm.script(hold, [], delay_s=1.5)
    llm.script(wait, {"facts": ["报告用中文"]}, only_if=formatted)  # json mode, no wrapper asked for
    llm.script(wait, [{"type": "user", "content": "报告用中文"}])
    handler = make_handler(sqlite_db, llm=client, slots=1)

    async def event(marker: str, session: int) -> Outcome:
        return (await handler.handle(make_event(user_id, session, lastUserMessage=said(marker))))[0]

    assert await event(walk, 1) is Outcome.EXTRACTED
    assert client.mode("openai/scripted-default") is StructuredOutput.OFF
    holder = asyncio.ensure_future(event(hold, 2))
    while not llm.calls(hold):
        await asyncio.sleep(0.01)
    waiter = asyncio.ensure_future(event(wait, 3))
    await asyncio.sleep(0.3)  # its prompt is built; it waits for the slot
    client._mode_retry_s = 0  # the retry time of the left mode has passed meanwhile

    assert await holder is Outcome.EXTRACTED
    assert await waiter is Outcome.EXTRACTED
    sent = llm.calls(wait)
    assert [formatted(r) for r in sent] == [False]
    bare = build_extraction_messages("", "", None, ComparisonSet.of([], []))[0]["content"]
    assert sent[0].messages[0]["content"] == bare
    assert [i.content for i in await items(sqlite_db, user_id)] == ["报告用中文"]
    assert client.mode("openai/scripted-default") is StructuredOutput.JSON_OBJECT  # the next one tries it
