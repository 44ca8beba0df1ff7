"""Rules that span rounds (touch → merge → demote → restore), on MariaDB and SQLite.

Each test names the lifecycle defect it guards against; each fails when its rule is undone.
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

import pytest

from service.adapters.db.database import Database
from service.adapters.llm_client import LlmClient
from service.adapters.metrics import Metrics
from service.app.caches import CaptureSwitch
from service.app.consolidation import Consolidator
from service.app.extraction import Extracted
from service.app.memories import Duplicate, MemoryService
from service.core.consolidation import RunResult, Thresholds
from service.core.injection_prompt import MemoryHint, render_injection
from service.core.model import DismissedBy, Scope, Source, Status
from service.core.outcomes import Outcome
from service.core.project_keys import RobotKeys
from tests.conftest import said
from tests.integration.conftest import HandlerFactory, make_event
from tests.support.clock import ManualClock
from tests.support.meanwhile_llm import AnswerAfter
from tests.support.pool import history, items, seed, seed_many, set_capture
from tests.support.scripted_llm import ScriptedLlm

MODEL = "openai/scripted-default"


def service(db: Database) -> MemoryService:
    return MemoryService(db, CaptureSwitch(db, 0), RobotKeys())


async def extract(db: Database, make_handler: HandlerFactory, user_id: int, session: int) -> Outcome:
    event = make_event(user_id, session, lastUserMessage=said(f"m{user_id}"))
    return (await make_handler(db).handle(event))[0]


def shown(llm: ScriptedLlm, user_id: int) -> dict[str, Any]:
    """The data block of the latest extraction prompt the model received for the user."""
    return llm.calls(f"m{user_id}")[-1].data


def extracted(user_id: int, added: int = 1) -> Extracted:
    return Extracted(user_id, None, MODEL, added, active_after=200)


# 1. Merged rows stay in the lifecycle.


async def test_merged_rows_are_matched_demoted_and_merged_again(
    any_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, llm_client: LlmClient, user_id: int
) -> None:
    await set_capture(any_db, user_id)
    await seed_many(any_db, user_id, [f"手写{i}" for i in range(150)], source=Source.MANUAL)
    merged = await seed_many(any_db, user_id, [f"合并{i}" for i in range(50)], source=Source.CONSOLIDATED)
    llm.script(f"m{user_id}", [{"type": "user", "action": "touch", "existingId": 50}], times=1)
    llm.script(f"m{user_id}", [{"type": "user", "content": "一个全新的事实"}])

    await extract(any_db, make_handler, user_id, 1)  # shown, and touched through its alias
    assert len(shown(llm, user_id)["existing"]) == 50
    assert [h["memory_id"] for h in await history(any_db, user_id) if h["action"] == "touch"] == [merged[-1]]
    await extract(any_db, make_handler, user_id, 2)  # 200 ACTIVE: a merged row makes room

    rows = {i.id: i for i in await items(any_db, user_id)}
    assert rows[merged[0]].status == "DISMISSED"  # the oldest merged row, not a MANUAL one
    assert sum(i.status == "ACTIVE" for i in rows.values()) == 200
    assert any(i.content == "一个全新的事实" and i.status == "ACTIVE" for i in rows.values())

    marker = "合并1"
    llm.script(marker, [])
    consolidator = Consolidator(any_db, llm_client, Metrics(), Thresholds())
    assert await consolidator.run(extracted(user_id)) == [RunResult.APPLIED]
    [call] = [c for c in llm.calls(marker) if "memories" in c.data]  # the extraction prompts show it too
    assert {m["content"] for m in call.data["memories"]} >= {f"合并{i}" for i in range(1, 50)}


# 2. A capacity demotion is not a rejection.


async def test_a_fact_demoted_for_room_comes_back_and_its_history_shows_both_steps(
    any_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int
) -> None:
    await set_capture(any_db, user_id)
    ids = await seed_many(any_db, user_id, [f"事实{i}" for i in range(200)])
    llm.script(f"m{user_id}", [{"type": "user", "content": "新事实"}], times=1)
    llm.script(f"m{user_id}", [{"type": "user", "content": "事实0"}])

    await extract(any_db, make_handler, user_id, 1)
    demoted = {i.id: i for i in await items(any_db, user_id)}[ids[0]]
    assert demoted.status == "DISMISSED"
    async with any_db.read() as uow:
        assert (await uow.memories.get(user_id, ids[0])).dismissed_by is DismissedBy.CAPACITY  # type: ignore[union-attr]

    await extract(any_db, make_handler, user_id, 2)

    assert shown(llm, user_id)["dismissed"] == []  # never offered to the model as a rejection
    rows = {i.id: i for i in await items(any_db, user_id)}
    assert rows[ids[0]].status == "ACTIVE" and rows[ids[1]].status == "DISMISSED"  # the cap held
    trail = [(h["action"], h["actor"]) for h in await history(any_db, user_id) if h["memory_id"] == ids[0]]
    assert trail == [("demote", "auto"), ("restore", "auto")]


async def test_a_fact_demoted_for_room_typed_by_the_user_is_restored_as_theirs(
    any_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int
) -> None:
    await set_capture(any_db, user_id)
    ids = await seed_many(any_db, user_id, [f"事实{i}" for i in range(200)])
    llm.script(f"m{user_id}", [{"type": "user", "content": "新事实"}])
    await extract(any_db, make_handler, user_id, 1)
    await service(any_db).delete(user_id, ids[5])  # room for the user's own write

    item = await service(any_db).create(user_id, Scope.USER, " 事实0 ", None)

    assert (item.id, item.status, item.source, item.dismissed_by) == (
        ids[0],
        Status.ACTIVE,
        Source.MANUAL,
        None,
    )
    trail = [(h["action"], h["actor"]) for h in await history(any_db, user_id) if h["memory_id"] == ids[0]]
    assert trail == [("demote", "auto"), ("restore", "user")]
    user_dismissed = await seed(any_db, user_id, "用户拒绝的事实", status=Status.DISMISSED)
    with pytest.raises(Duplicate):
        await service(any_db).create(user_id, Scope.USER, "用户拒绝的事实", None)
    assert {i.id: i.status for i in await items(any_db, user_id)}[user_dismissed] == "DISMISSED"


# 3. A consolidation never erases a newer update.


async def test_a_consolidation_whose_source_changed_meanwhile_leaves_the_group_alone(
    any_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, llm_client: LlmClient, user_id: int
) -> None:
    await set_capture(any_db, user_id)
    ids = await seed_many(any_db, user_id, [f"c{user_id} 事实{i}" for i in range(40)])
    # The extraction prompt shows the rows too: its rule comes first.
    llm.script(
        f"m{user_id}", [{"type": "user", "action": "update", "existingId": 1, "content": "更完整的新说法"}]
    )
    llm.script(f"c{user_id}", [{"op": "merge", "sourceIds": [1, 2], "content": "合并后的事实"}])

    async def update_first_row() -> None:
        await extract(any_db, make_handler, user_id, 1)

    consolidator = Consolidator(
        any_db, AnswerAfter(llm_client, update_first_row, purpose="consolidation"), Metrics(), Thresholds()
    )
    assert await consolidator.run(extracted(user_id)) == [RunResult.ABANDONED_STALE]

    rows = {i.id: i for i in await items(any_db, user_id)}
    assert rows[ids[0]].content == "更完整的新说法" and ids[1] in rows and len(rows) == 40
    assert not any(h["actor"] == "consolidator" for h in await history(any_db, user_id))


# 4. A merge never folds ACTIVE rows into a dismissed one.


async def test_a_merge_into_a_user_dismissed_fact_is_abandoned_and_into_a_demoted_one_restores_it(
    any_db: Database, llm: ScriptedLlm, llm_client: LlmClient, user_id: int, clock: ManualClock
) -> None:
    marker = f"c{user_id}"
    ids = await seed_many(any_db, user_id, [f"{marker} 事实{i}" for i in range(40)])
    rejected = await seed(any_db, user_id, "用户拒绝的说法", status=Status.DISMISSED)
    demoted = await seed(
        any_db, user_id, "容量收起的说法", status=Status.DISMISSED, dismissed_by=DismissedBy.CAPACITY
    )
    consolidator = Consolidator(any_db, llm_client, Metrics(), Thresholds())
    llm.script(marker, [{"op": "merge", "sourceIds": [1, 2], "content": "用户拒绝的说法"}], times=1)
    llm.script(marker, [{"op": "merge", "sourceIds": [1, 2], "content": "容量收起的说法"}])

    assert await consolidator.run(extracted(user_id)) == [RunResult.ABANDONED_INVALID]
    rows = {i.id: i for i in await items(any_db, user_id)}
    assert rows[ids[0]].status == rows[ids[1]].status == "ACTIVE" and rows[rejected].status == "DISMISSED"

    clock.advance(timedelta(hours=25))
    assert await consolidator.run(extracted(user_id)) == [RunResult.APPLIED]
    rows = {i.id: i for i in await items(any_db, user_id)}
    assert ids[0] not in rows and ids[1] not in rows and rows[demoted].status == "ACTIVE"
    assert rows[rejected].status == "DISMISSED"


# 5. Ids are never reused.


async def test_ids_are_never_reused_after_a_delete(any_db: Database, user_id: int) -> None:
    memories = service(any_db)
    first = await memories.create(user_id, Scope.USER, "会被删除的最新记忆", None)
    await memories.delete(user_id, first.id)

    second = await memories.create(user_id, Scope.USER, "另一条记忆", None)

    assert second.id > first.id
    assert [h["action"] for h in await history(any_db, user_id) if h["memory_id"] == second.id] == ["create"]


# 6. Text that renders the same is one memory.

LOOKALIKES = [
    "报告\u200b用中文写",  # zero-width space
    "\ufeff报告用中文写",  # BOM
    "报告用中文写\u2060",  # word joiner
    "Cafe\u0301 的报告用中文写",  # NFD
    "ＡＢＣ报告用中文写",  # full-width
]
CANONICAL = ["报告用中文写", "报告用中文写", "报告用中文写", "Café 的报告用中文写", "ABC报告用中文写"]


@pytest.mark.parametrize(("lookalike", "canonical"), list(zip(LOOKALIKES, CANONICAL, strict=True)))
async def test_invisible_differences_are_one_memory(
    any_db: Database, user_id: int, lookalike: str, canonical: str
) -> None:
    memories = service(any_db)
    await memories.create(user_id, Scope.USER, canonical, None)
    with pytest.raises(Duplicate):
        await memories.create(user_id, Scope.USER, lookalike, None)


async def test_joiners_survive_inside_emoji_and_words_and_nowhere_else(
    any_db: Database, user_id: int
) -> None:
    family, persian = "👨\u200d👩\u200d👧 周末陪家人", "می\u200cخواهم"
    memories = service(any_db)
    stored = await memories.create(user_id, Scope.USER, family, None)
    await memories.create(user_id, Scope.USER, persian, None)
    await memories.create(user_id, Scope.USER, "👨👩👧 周末陪家人", None)  # renders differently: another fact

    assert stored.content == family
    prompt = render_injection([MemoryHint(Scope.USER, None, family), MemoryHint(Scope.USER, None, persian)])
    assert family in prompt and persian in prompt
    assert render_injection([MemoryHint(Scope.USER, None, "a\u200d b\u200c")]).endswith("- [用户] a b")


async def test_twenty_invisible_characters_are_not_a_message(
    any_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int
) -> None:
    await set_capture(any_db, user_id)
    event = make_event(user_id, 1, lastUserMessage=f"m{user_id}" + "\u200b" * 30)
    outcome, _ = await make_handler(any_db).handle(event)
    assert outcome is Outcome.SKIPPED_SHORT and llm.calls(f"m{user_id}") == []


# 7. The cooldown is spent only on a call, and a failed call backs off for an hour.


async def test_no_call_no_cooldown_and_a_failed_call_backs_off_for_an_hour(
    any_db: Database, llm: ScriptedLlm, llm_client: LlmClient, user_id: int, clock: ManualClock
) -> None:
    marker = f"c{user_id}"
    await seed_many(any_db, user_id, [f"{marker} 手写{i}" for i in range(40)], source=Source.MANUAL)
    await seed(any_db, user_id, f"{marker} 唯一的自动事实")
    consolidator = Consolidator(any_db, llm_client, Metrics(), Thresholds())

    assert await consolidator.run(extracted(user_id)) == [RunResult.SKIPPED_NOTHING_TO_MERGE]
    async with any_db.read() as uow:
        assert await uow.accounts.consolidation_due(user_id) is None  # nothing claimed

    await seed(any_db, user_id, f"{marker} 第二条自动事实")
    llm.script(marker, status=503, times=3)  # the call and its two retries
    assert await consolidator.run(extracted(user_id)) == [RunResult.ABANDONED_ERROR]
    async with any_db.read() as uow:
        assert await uow.accounts.consolidation_due(user_id) == clock.now() + timedelta(hours=1)

    clock.advance(timedelta(minutes=59))
    assert await consolidator.run(extracted(user_id)) == [RunResult.SKIPPED_COOLDOWN]
    clock.advance(timedelta(minutes=2))
    llm.script(marker, json.dumps([]))
    assert await consolidator.run(extracted(user_id)) == [RunResult.APPLIED]
    async with any_db.read() as uow:
        assert await uow.accounts.consolidation_due(user_id) == clock.now() + timedelta(hours=24)
    assert len(llm.calls(marker)) == 3 + 1


async def test_concurrent_runs_claim_the_cooldown_once(
    any_db: Database, llm: ScriptedLlm, llm_client: LlmClient, user_id: int
) -> None:
    marker = f"c{user_id}"
    await seed_many(any_db, user_id, [f"{marker} 事实{i}" for i in range(40)])
    llm.script(marker, [], delay_s=0.2)
    consolidators = [Consolidator(any_db, llm_client, Metrics(), Thresholds()) for _ in range(3)]
    results = await asyncio.gather(*(c.run(extracted(user_id)) for c in consolidators))
    assert sorted(r[0] for r in results) == sorted([RunResult.APPLIED] + [RunResult.SKIPPED_COOLDOWN] * 2)
    assert len(llm.calls(marker)) == 1
