"""The extraction handler against a real database, with litellm calling the scripted model (seed 8 P2)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

import pytest

from service.adapters.db.database import Database, UnitOfWork
from service.app.caches import CaptureSwitch
from service.app.extraction import ModelRejected, ModelUnavailable
from service.core.model import Group, Scope, Source, Status
from service.core.outcomes import Outcome
from service.core.project_keys import RobotKeys
from tests.conftest import eventually, said
from tests.integration.conftest import DEFAULT_MODEL, HandlerFactory, make_event
from tests.support.pool import history, items, ledger, ledger_of_user, seed, set_capture
from tests.support.scripted_llm import ScriptedLlm


async def test_new_fact_is_inserted_with_its_origin_and_history(
    any_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int
) -> None:
    await set_capture(any_db, user_id)
    llm.script(f"m{user_id}", [{"type": "user", "action": "insert", "content": "报告用中文写"}])
    event = make_event(user_id, 42, lastUserMessage=said(f"m{user_id}"))

    outcome, extracted = await make_handler(any_db).handle(event)

    assert outcome is Outcome.EXTRACTED and extracted is not None and extracted.added == 1
    [item] = await items(any_db, user_id)
    assert (item.scope, item.content, item.source, item.status, item.origin_session_id) == (
        "USER",
        "报告用中文写",
        "AUTO",
        "ACTIVE",
        42,
    )
    [entry] = await history(any_db, user_id)
    assert (
        entry["action"],
        entry["actor"],
        entry["new_content"],
        entry["event_id"],
        entry["session_id"],
    ) == ("insert", "auto", "报告用中文写", event.event_id, 42)
    assert entry["model"] == DEFAULT_MODEL
    assert [r["outcome"] for r in await ledger(any_db, event.event_id)] == ["extracted"]


async def test_same_fact_again_only_touches_updated_at(
    any_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int
) -> None:
    await set_capture(any_db, user_id)
    llm.script(f"m{user_id}", [{"type": "user", "content": "报告用中文写"}])
    handler = make_handler(any_db)
    await handler.handle(make_event(user_id, 1, lastUserMessage=said(f"m{user_id}")))
    [before] = await items(any_db, user_id)

    await handler.handle(make_event(user_id, 2, lastUserMessage=said(f"m{user_id}")))

    [after] = await items(any_db, user_id)
    assert after.id == before.id and after.updated_at > before.updated_at
    assert [h["action"] for h in await history(any_db, user_id)] == ["insert", "touch"]


async def test_dismissed_fact_is_never_revived(
    any_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int
) -> None:
    await set_capture(any_db, user_id)
    row_id = await seed(any_db, user_id, "报告用中文写", status=Status.DISMISSED)
    [before] = await items(any_db, user_id)
    llm.script(f"m{user_id}", [{"type": "user", "content": "报告用中文写"}])

    await make_handler(any_db).handle(make_event(user_id, lastUserMessage=said(f"m{user_id}")))

    [after] = await items(any_db, user_id)
    assert (after.id, after.status, after.updated_at) == (row_id, "DISMISSED", before.updated_at)


async def test_capture_off_or_never_set_makes_no_llm_call(
    mysql_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int
) -> None:
    handler = make_handler(mysql_db)
    marker = f"m{user_id}"
    assert (await handler.handle(make_event(user_id, lastUserMessage=said(marker))))[
        0
    ] is Outcome.SKIPPED_CAPTURE_OFF
    await set_capture(mysql_db, user_id, False)
    assert (await handler.handle(make_event(user_id, lastUserMessage=said(marker))))[
        0
    ] is Outcome.SKIPPED_CAPTURE_OFF
    assert llm.calls(marker) == []


@pytest.mark.parametrize(
    ("overrides", "outcome"),
    [
        ({"phase": "FAILED"}, Outcome.SKIPPED_PHASE),
        ({"phase": "CANCELLED"}, Outcome.SKIPPED_PHASE),
        ({"sessionType": "SUBAGENT"}, Outcome.SKIPPED_SESSION_TYPE),
        ({"sessionType": "SIDE_TASK"}, Outcome.SKIPPED_SESSION_TYPE),
        ({"lastAssistantMessage": None}, Outcome.SKIPPED_SHORT),
    ],
)
async def test_filtered_events_make_no_llm_call(
    mysql_db: Database,
    make_handler: HandlerFactory,
    llm: ScriptedLlm,
    user_id: int,
    overrides: dict[str, object],
    outcome: Outcome,
) -> None:
    await set_capture(mysql_db, user_id)
    marker = f"m{user_id}"
    result = await make_handler(mysql_db).handle(
        make_event(user_id, lastUserMessage=said(marker), **overrides)
    )
    assert result[0] is outcome and llm.calls(marker) == []


async def test_short_user_message_makes_no_llm_call(
    mysql_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int
) -> None:
    await set_capture(mysql_db, user_id)
    result = await make_handler(mysql_db).handle(make_event(user_id, lastUserMessage=f"好的 m{user_id} 谢谢"))
    assert result[0] is Outcome.SKIPPED_SHORT and llm.calls(f"m{user_id}") == []


async def test_a_processed_event_id_is_applied_once(
    any_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int
) -> None:
    await set_capture(any_db, user_id)
    llm.script(f"m{user_id}", [{"type": "user", "content": "报告用中文写"}])
    event = make_event(user_id, lastUserMessage=said(f"m{user_id}"))
    handler = make_handler(any_db)

    assert (await handler.handle(event))[0] is Outcome.EXTRACTED
    assert (await handler.handle(event))[0] is Outcome.SKIPPED_DUPLICATE_EVENT

    assert len(llm.calls(f"m{user_id}")) == 1
    assert [h["action"] for h in await history(any_db, user_id)] == ["insert"]


async def test_event_ids_are_compared_exactly_on_both_dialects(
    any_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int
) -> None:
    """MySQL's `_bin` collations pad with spaces; the ledger compares bytes on both dialects."""
    await set_capture(any_db, user_id)
    llm.script(f"a{user_id}", [{"type": "user", "content": "报告用中文写"}])
    llm.script(f"b{user_id}", [{"type": "user", "content": "代码注释用英文写"}])
    handler = make_handler(any_db)
    first = make_event(user_id, 1, eventId=f"e-{user_id}", lastUserMessage=said(f"a{user_id}"))
    padded = make_event(user_id, 2, eventId=f"e-{user_id}  ", lastUserMessage=said(f"b{user_id}"))

    assert (await handler.handle(first))[0] is Outcome.EXTRACTED
    assert (await handler.handle(padded))[0] is Outcome.EXTRACTED

    assert sorted(r["event_id"] for r in await ledger_of_user(any_db, user_id)) == [
        f"e-{user_id}",
        f"e-{user_id}  ",
    ]
    assert (await ledger(any_db, f"e-{user_id}  "))[0]["session_id"] == 2
    assert len(await items(any_db, user_id)) == 2


async def test_a_redelivery_racing_the_first_delivery_is_applied_once(
    any_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int
) -> None:
    """Both pass the ledger read before either writes; the ledger insert under the lock decides."""
    await set_capture(any_db, user_id)
    llm.script(f"m{user_id}", [{"type": "user", "content": "报告用中文写"}], delay_s=0.3)
    event = make_event(user_id, lastUserMessage=said(f"m{user_id}"))
    handler = make_handler(any_db)

    outcomes = await asyncio.gather(handler.handle(event), handler.handle(event))

    assert sorted(o for o, _ in outcomes) == sorted([Outcome.EXTRACTED, Outcome.SKIPPED_DUPLICATE_EVENT])
    assert len(llm.calls(f"m{user_id}")) == 2
    assert [h["action"] for h in await history(any_db, user_id)] == ["insert"]
    assert len(await ledger_of_user(any_db, user_id)) == 1


class CountedReads:
    """The database with its concurrent read rounds counted."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self.active = self.most = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)

    @asynccontextmanager
    async def prepared_read(self) -> AsyncIterator[UnitOfWork]:
        self.active += 1
        self.most = max(self.most, self.active)
        try:
            async with self._db.prepared_read() as uow:
                yield uow
        finally:
            self.active -= 1


async def test_model_calls_and_database_rounds_each_keep_their_own_bound(
    mysql_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int
) -> None:
    """A burst queues for a slot, not on the connection pool, and never holds more than its bounds."""
    users = [user_id + i for i in range(6)]
    for u in users:
        await set_capture(mysql_db, u)
        llm.script(f"m{u}", [{"type": "user", "content": f"事实{u}"}], delay_s=0.2)
    counted = CountedReads(mysql_db)
    handler = make_handler(
        cast(Database, counted), capture=CaptureSwitch(mysql_db, 0), slots=2, database_slots=1
    )

    outcomes = await asyncio.gather(
        *(handler.handle(make_event(u, lastUserMessage=said(f"m{u}"))) for u in users)
    )

    assert [o for o, _ in outcomes] == [Outcome.EXTRACTED] * 6
    assert counted.most == 1
    calls = sorted(r.at for u in users for r in llm.calls(f"m{u}"))
    assert all(later - earlier >= 0.15 for earlier, later in zip(calls, calls[2:], strict=False))


async def test_a_model_slot_is_free_while_its_event_waits_on_the_database(
    mysql_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int
) -> None:
    """One model slot: the second user's call starts while the first user's write waits for a lock."""
    first, second = user_id, user_id + 1
    for u in (first, second):
        await set_capture(mysql_db, u)
        llm.script(f"m{u}", [{"type": "user", "content": f"事实{u}"}])
    handler = make_handler(mysql_db, capture=CaptureSwitch(mysql_db, 0), slots=1, database_slots=2)

    async with mysql_db.locked_user(first):  # someone else holds the first user's lock meanwhile
        waiting = asyncio.create_task(handler.handle(make_event(first, lastUserMessage=said(f"m{first}"))))

        async def first_calls() -> int:
            return len(llm.calls(f"m{first}"))

        assert await eventually(first_calls, bool) == 1  # its answer is in; its write waits
        outcome, _ = await asyncio.wait_for(
            handler.handle(make_event(second, lastUserMessage=said(f"m{second}"))), timeout=10
        )
        assert outcome is Outcome.EXTRACTED and not waiting.done()
    assert (await waiting)[0] is Outcome.EXTRACTED
    assert [i.content for i in await items(mysql_db, first)] == [f"事实{first}"]


@pytest.mark.parametrize(
    "reply",
    [
        "this is not json",
        '{"type": "user", "content": "x"}',
        [{"type": "user", "content": f"事实{i}"} for i in range(4)],
        [],
    ],
    ids=["invalid-json", "not-a-list", "four-items", "empty"],
)
async def test_answers_dropped_as_a_whole_write_nothing(
    mysql_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int, reply: object
) -> None:
    await set_capture(mysql_db, user_id)
    llm.script(f"m{user_id}", reply)
    event = make_event(user_id, lastUserMessage=said(f"m{user_id}"))
    expected = Outcome.EXTRACTED if reply == [] else Outcome.FAILED  # [] is a valid "nothing to keep"
    assert (await make_handler(mysql_db).handle(event))[0] is expected
    assert await items(mysql_db, user_id) == []
    assert [r["outcome"] for r in await ledger(mysql_db, event.event_id)] == [expected.value]


async def test_an_item_over_120_characters_is_dropped_alone(
    mysql_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int
) -> None:
    await set_capture(mysql_db, user_id)
    llm.script(
        f"m{user_id}", [{"type": "user", "content": "长" * 121}, {"type": "user", "content": "长" * 120}]
    )
    await make_handler(mysql_db).handle(make_event(user_id, lastUserMessage=said(f"m{user_id}")))
    assert [i.content for i in await items(mysql_db, user_id)] == ["长" * 120]


async def test_a_model_outage_leaves_the_event_unfinished_for_a_later_try(
    mysql_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int
) -> None:
    await set_capture(mysql_db, user_id)
    llm.script(f"m{user_id}", status=500, times=3)
    llm.script(f"m{user_id}", [{"type": "user", "content": "恢复之后记住的事实"}])
    event = make_event(user_id, lastUserMessage=said(f"m{user_id}"))
    handler = make_handler(mysql_db)

    with pytest.raises(ModelUnavailable):
        await handler.handle(event)
    assert len(llm.calls(f"m{user_id}")) == 3  # the first call and two bounded retries
    assert await items(mysql_db, user_id) == [] and await ledger(mysql_db, event.event_id) == []

    assert (await handler.handle(event))[0] is Outcome.EXTRACTED  # the later try
    assert [i.content for i in await items(mysql_db, user_id)] == ["恢复之后记住的事实"]
    assert [r["outcome"] for r in await ledger(mysql_db, event.event_id)] == ["extracted"]


async def test_an_unusable_answer_finishes_the_event_without_memory(
    mysql_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int
) -> None:
    await set_capture(mysql_db, user_id)
    llm.script(f"m{user_id}", "我记住了,不过不用 JSON。")
    event = make_event(user_id, lastUserMessage=said(f"m{user_id}"))
    assert (await make_handler(mysql_db).handle(event))[0] is Outcome.FAILED
    assert [r["outcome"] for r in await ledger(mysql_db, event.event_id)] == ["failed"]


async def test_a_request_the_provider_rejects_is_not_retried_and_not_finished(
    mysql_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int
) -> None:
    await set_capture(mysql_db, user_id)
    llm.script(f"m{user_id}", status=400)
    event = make_event(user_id, lastUserMessage=said(f"m{user_id}"))
    with pytest.raises(ModelRejected, match="400"):
        await make_handler(mysql_db).handle(event)
    assert len(llm.calls(f"m{user_id}")) <= 2  # a mode not yet answered may be tried once more, weaker
    assert await ledger(mysql_db, event.event_id) == []


async def test_model_comes_from_the_setting_else_the_default(
    mysql_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int
) -> None:
    await set_capture(mysql_db, user_id)
    handler = make_handler(mysql_db)
    await handler.handle(make_event(user_id, 1, lastUserMessage=said(f"m{user_id}")))
    async with mysql_db.transaction() as uow:
        await uow.accounts.set_extraction_model("openai/admin-chosen", mysql_db.now())
        await uow.commit()
    try:
        await handler.handle(make_event(user_id, 2, lastUserMessage=said(f"m{user_id}")))
    finally:
        async with mysql_db.transaction() as uow:
            await uow.accounts.set_extraction_model("", mysql_db.now())
            await uow.commit()
    assert [r.model for r in llm.calls(f"m{user_id}")] == ["scripted-default", "admin-chosen"]


@pytest.mark.parametrize("project_key", [None, "", "  ", "WEIXIN", "FEISHU:oc_5f2a"])
async def test_project_fact_without_a_valid_project_key_is_stored_as_user(
    mysql_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int, project_key: str | None
) -> None:
    await set_capture(mysql_db, user_id)
    llm.script(f"m{user_id}", [{"type": "project", "content": "仓库测试用 Vitest"}])
    handler = make_handler(mysql_db, robot_project_keys="WEIXIN,FEISHU")
    await handler.handle(make_event(user_id, lastUserMessage=said(f"m{user_id}"), projectKey=project_key))
    [item] = await items(mysql_db, user_id)
    assert (item.scope, item.project_key) == ("USER", "")


async def test_project_fact_with_a_project_key_is_stored_in_that_project(
    any_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int
) -> None:
    await set_capture(any_db, user_id)
    llm.script(f"m{user_id}", [{"type": "project", "content": "仓库测试用 Vitest"}])
    await make_handler(any_db).handle(
        make_event(user_id, lastUserMessage=said(f"m{user_id}"), projectKey="mao")
    )
    [item] = await items(any_db, user_id)
    assert (item.scope, item.project_key) == ("PROJECT", "mao")


async def test_events_of_every_phase_record_the_project(
    mysql_db: Database, make_handler: HandlerFactory, user_id: int
) -> None:
    handler = make_handler(mysql_db, robot_project_keys="WEIXIN")
    await handler.handle(make_event(user_id, 1, phase="FAILED", projectKey="alpha"))
    await handler.handle(make_event(user_id, 2, sessionType="SUBAGENT", projectKey="beta"))
    await handler.handle(make_event(user_id, 3, projectKey="WEIXIN"))
    async with mysql_db.read() as uow:
        assert sorted(await uow.accounts.seen_projects(user_id)) == ["alpha", "beta"]


async def test_prompt_shows_aliases_of_auto_rows_and_dismissed_contents_only(
    mysql_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int
) -> None:
    await set_capture(mysql_db, user_id)
    for filler in ("a", "b", "c"):  # real ids of this user's rows are then surely above the aliases
        await seed(mysql_db, user_id + 10**15, filler)
    auto = await seed(mysql_db, user_id, "自动用户事实")
    await seed(mysql_db, user_id, "手写事实", source=Source.MANUAL)
    await seed(mysql_db, user_id, "项目自动事实", group=Group(Scope.PROJECT, "mao"))
    await seed(mysql_db, user_id, "别的项目事实", group=Group(Scope.PROJECT, "other"))
    await seed(mysql_db, user_id, "被忽略的事实", status=Status.DISMISSED)

    await make_handler(mysql_db).handle(
        make_event(user_id, lastUserMessage=said(f"m{user_id}"), projectKey="mao")
    )

    [call] = llm.calls(f"m{user_id}")
    data = call.data
    assert sorted(e["content"] for e in data["existing"]) == ["自动用户事实", "项目自动事实"]
    assert {e["id"] for e in data["existing"]} == {1, 2} and auto not in {1, 2}
    assert data["dismissed"] == ["被忽略的事实"]
    assert "手写事实" not in call.text and "别的项目事实" not in call.text


async def test_a_users_next_prompt_extends_the_last_and_its_log_aliases_resolve(
    any_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int
) -> None:
    """The second event's prompt repeats the first's memories and appends the row the first one
    inserted; the model's touch of that row, by the alias the log gave it, reaches the row."""
    await set_capture(any_db, user_id)
    async with any_db.locked_user(user_id) as uow:  # the lock row, with its removal mark
        await uow.commit()
    for fact in ("事实一", "事实二", "事实三"):
        await seed(any_db, user_id, fact)
    handler = make_handler(any_db)
    llm.script(f"a{user_id}", [{"type": "user", "action": "insert", "content": "新事实"}])
    llm.script(f"b{user_id}", [{"type": "user", "action": "touch", "existingId": 4}])
    await handler.handle(make_event(user_id, 1, lastUserMessage=said(f"a{user_id}")))
    await handler.handle(make_event(user_id, 1, lastUserMessage=said(f"b{user_id}")))

    [first], [second] = llm.calls(f"a{user_id}"), llm.calls(f"b{user_id}")
    before, after = first.messages[-1]["content"], second.messages[-1]["content"]
    assert after.startswith(before[: before.rindex("\n\n")] + "\n\nChanges:\n4\tuser\t新事实\n\n")
    assert {"id": 4, "type": "user", "content": "新事实"} in second.data["existing"]
    [row] = [r for r in await items(any_db, user_id) if r.content == "新事实"]
    assert [h["action"] for h in await history(any_db, user_id) if h["memory_id"] == row.id] == [
        "insert",
        "touch",
    ]


async def test_injection_window_on_both_dialects(any_db: Database, user_id: int) -> None:
    from service.app.caches import CaptureSwitch
    from service.app.memories import MemoryService
    from tests.support.pool import seed_many

    # Project and user memories interleave in time; project ones still come first (seed 5.2).
    await seed_many(any_db, user_id, [f"项目{i}" for i in range(14)], group=Group(Scope.PROJECT, "mao"))
    await seed_many(any_db, user_id, [f"用户{i}" for i in range(10)])
    service = MemoryService(any_db, CaptureSwitch(any_db, 0), RobotKeys())
    injected = await service.injection(user_id, "mao")
    assert [h.content for h in injected.memories] == [f"项目{i}" for i in range(13, 1, -1)] + [
        f"用户{i}" for i in range(9, 1, -1)
    ]
    assert [h.content for h in (await service.injection(user_id, None)).memories] == [
        f"用户{i}" for i in range(9, 1, -1)
    ]


async def test_a_990_kb_event_reaches_the_model_as_a_bounded_request(
    any_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int
) -> None:
    """A 990 KB event once became a 391,943-character request: the conversation is cut to
    MEMORY_LLM_CONVERSATION_TOKENS, the head of the user's message and the end of the reply kept."""
    await set_capture(any_db, user_id)
    llm.script(f"m{user_id}", [{"type": "user", "action": "insert", "content": "报告用中文写"}])
    user = said(f"m{user_id}") + "下面是日志:" + "log line 0123456789 " * 30_000
    assistant = "分析如下:" + "步骤与细节。" * 60_000 + "结论:以后报告都用中文。"
    assert len((user + assistant).encode()) > 990_000

    outcome, _ = await make_handler(any_db).handle(
        make_event(user_id, 1, lastUserMessage=user, lastAssistantMessage=assistant)
    )

    assert outcome is Outcome.EXTRACTED
    [request] = llm.calls(f"m{user_id}")
    turn = request.data["conversation"]
    assert turn["user"].startswith(said(f"m{user_id}")) and turn["assistant"].endswith(
        "结论:以后报告都用中文。"
    )
    assert "…[cut " in turn["user"] and "…[cut " in turn["assistant"]
    assert len(turn["user"]) + len(turn["assistant"]) < 12_000  # 4,000 estimated tokens at most
    assert len(request.raw) < 20_000
