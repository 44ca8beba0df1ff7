"""Seed 10.6, the D13/D14 points, against MariaDB with the real litellm path to the scripted model."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from service.adapters.db.database import Database
from service.adapters.db.memory_repository import MemoryRepository
from service.adapters.db.tables import memory_item
from service.core.model import Group, Scope, Source, Status
from service.core.normalize import dedup_hash
from service.core.outcomes import Outcome
from service.core.project_keys import RobotKeys
from tests.integration.conftest import HandlerFactory, make_event
from tests.support.pool import history, items, seed, seed_many, set_capture
from tests.support.scripted_llm import ScriptedLlm

MAO = Group(Scope.PROJECT, "mao")


def said(marker: str) -> str:
    return f"关于偏好再说一次({marker}):报告和邮件都请用中文写。"


async def run(
    db: Database, make_handler: HandlerFactory, user_id: int, project_key: str | None = None
) -> Outcome:
    event = make_event(user_id, lastUserMessage=said(f"m{user_id}"), projectKey=project_key)
    return (await make_handler(db).handle(event))[0]


def alias_of(llm: ScriptedLlm, user_id: int, content: str) -> int:
    """The alias the model was shown for a content, read back from the prompt it received."""
    [call] = llm.calls(f"m{user_id}")[-1:]
    return next(int(e["id"]) for e in call.data["existing"] if e["content"] == content)


async def test_touch_refreshes_only_updated_at(
    mysql_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int
) -> None:
    await set_capture(mysql_db, user_id)
    await seed(mysql_db, user_id, "报告用中文", age_minutes=60)
    await seed(mysql_db, user_id, "另一事实", age_minutes=60)
    before = {i.content: i for i in await items(mysql_db, user_id)}
    llm.script(f"m{user_id}", [{"type": "user", "action": "touch", "existingId": 1}])

    await run(mysql_db, make_handler, user_id)

    after = {i.content: i for i in await items(mysql_db, user_id)}
    assert set(after) == set(before)
    touched = before["报告用中文"] if alias_of(llm, user_id, "报告用中文") == 1 else before["另一事实"]
    assert after[touched.content].updated_at > touched.updated_at
    untouched = next(c for c in before if c != touched.content)
    assert after[untouched].updated_at == before[untouched].updated_at
    assert after[touched.content].content == touched.content


async def test_update_rewrites_content_and_rehashes(
    mysql_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int
) -> None:
    await set_capture(mysql_db, user_id)
    row_id = await seed(mysql_db, user_id, "报告用中文")
    llm.script(
        f"m{user_id}",
        [{"type": "user", "action": "update", "existingId": 1, "content": "报告和邮件都用中文"}],
    )

    await run(mysql_db, make_handler, user_id)

    [item] = await items(mysql_db, user_id)
    assert (item.id, item.content, item.source) == (row_id, "报告和邮件都用中文", "AUTO")
    async with mysql_db.read() as uow:
        stored = await uow.conn.scalar(sa.select(memory_item.c.dedup_hash).where(memory_item.c.id == row_id))
    assert stored == dedup_hash(Scope.USER, "", "报告和邮件都用中文")
    update = (await history(mysql_db, user_id))[-1]
    assert (update["action"], update["old_content"], update["new_content"]) == (
        "update",
        "报告用中文",
        "报告和邮件都用中文",
    )


async def test_update_colliding_with_an_existing_hash_falls_back_to_touch(
    mysql_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int
) -> None:
    await set_capture(mysql_db, user_id)
    auto_id = await seed(mysql_db, user_id, "报告用中文", age_minutes=60)
    await seed(mysql_db, user_id, "报告和邮件都用中文", source=Source.MANUAL, age_minutes=60)
    before = {i.id: i for i in await items(mysql_db, user_id)}
    llm.script(
        f"m{user_id}",
        [{"type": "user", "action": "update", "existingId": 1, "content": "报告和邮件都用中文"}],
    )

    await run(mysql_db, make_handler, user_id)

    after = {i.id: i for i in await items(mysql_db, user_id)}
    assert [a.content for a in after.values()] == [b.content for b in before.values()]
    assert after[auto_id].updated_at > before[auto_id].updated_at


@pytest.mark.parametrize("target", ["manual", "dismissed", "missing"])
async def test_references_outside_the_comparison_set_drop_the_candidate(
    mysql_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int, target: str
) -> None:
    await set_capture(mysql_db, user_id)
    manual = await seed(mysql_db, user_id, "手写事实", source=Source.MANUAL, age_minutes=60)
    dismissed = await seed(mysql_db, user_id, "忽略事实", status=Status.DISMISSED, age_minutes=60)
    ref = {"manual": manual, "dismissed": dismissed, "missing": 10**12}[target]
    before = await items(mysql_db, user_id)
    llm.script(
        f"m{user_id}",
        [
            {"type": "user", "action": "touch", "existingId": ref},
            {"type": "user", "action": "update", "existingId": ref, "content": "改写尝试"},
            {"type": "user", "action": "update", "existingId": 1, "content": "没有别名 1"},
        ],
    )

    await run(mysql_db, make_handler, user_id)

    assert await items(mysql_db, user_id) == before


async def test_new_wording_of_a_dismissed_fact_is_still_inserted(
    mysql_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int
) -> None:
    await set_capture(mysql_db, user_id)
    await seed(mysql_db, user_id, "报告用中文", status=Status.DISMISSED)
    llm.script(
        f"m{user_id}",
        [{"type": "user", "content": "汇报类输出使用中文"}, {"type": "user", "content": "报告用中文"}],
    )

    await run(mysql_db, make_handler, user_id)

    [call] = llm.calls(f"m{user_id}")
    assert call.data["dismissed"] == ["报告用中文"] and call.data["existing"] == []
    assert sorted((i.content, i.status) for i in await items(mysql_db, user_id)) == [
        ("报告用中文", "DISMISSED"),
        ("汇报类输出使用中文", "ACTIVE"),
    ]


async def test_a_failing_comparison_query_falls_back_to_exact_hashing(
    mysql_db: Database,
    make_handler: HandlerFactory,
    llm: ScriptedLlm,
    user_id: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await set_capture(mysql_db, user_id)
    await seed(mysql_db, user_id, "报告用中文", age_minutes=60)
    [before] = await items(mysql_db, user_id)

    async def broken(*_: object, **__: object) -> list[str]:
        raise sa.exc.ProgrammingError("SELECT …", {}, Exception("table is being rebuilt"))

    monkeypatch.setattr(MemoryRepository, "extraction_inputs", broken)
    llm.script(
        f"m{user_id}", [{"type": "user", "content": "报告用中文"}, {"type": "user", "content": "新事实"}]
    )

    assert await run(mysql_db, make_handler, user_id) is Outcome.EXTRACTED

    [call] = llm.calls(f"m{user_id}")
    assert call.data["existing"] == []
    after = {i.content: i for i in await items(mysql_db, user_id)}
    assert set(after) == {"报告用中文", "新事实"}
    assert after["报告用中文"].updated_at > before.updated_at  # the exact hash still touches


async def test_at_200_active_the_oldest_auto_row_of_the_group_is_demoted(
    mysql_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int
) -> None:
    await set_capture(mysql_db, user_id)
    ids = await seed_many(mysql_db, user_id, [f"用户事实{i}" for i in range(150)])
    project_ids = await seed_many(mysql_db, user_id, [f"项目事实{i}" for i in range(50)], group=MAO)
    llm.script(
        f"m{user_id}",
        [{"type": "project", "content": "新项目事实"}, {"type": "user", "content": "新用户事实"}],
    )

    await run(mysql_db, make_handler, user_id, "mao")

    rows = {i.id: i for i in await items(mysql_db, user_id)}
    assert sum(r.status == "ACTIVE" for r in rows.values()) == 200
    demoted = sorted(i for i, r in rows.items() if r.status == "DISMISSED")
    assert demoted == sorted([ids[0], project_ids[0]])
    assert {r.content for r in rows.values() if r.status == "ACTIVE"} >= {"新项目事实", "新用户事实"}
    actions = [h["action"] for h in await history(mysql_db, user_id)]
    assert actions.count("demote") == 2 and actions.count("insert") == 2


async def test_at_200_with_only_manual_rows_in_the_group_the_insert_is_dropped(
    mysql_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int
) -> None:
    await set_capture(mysql_db, user_id)
    await seed_many(mysql_db, user_id, [f"手写{i}" for i in range(100)], source=Source.MANUAL)
    await seed_many(mysql_db, user_id, [f"项目{i}" for i in range(100)], group=MAO)
    before = await items(mysql_db, user_id)
    llm.script(f"m{user_id}", [{"type": "user", "content": "新用户事实"}])

    await run(mysql_db, make_handler, user_id, "mao")

    assert await items(mysql_db, user_id) == before  # MANUAL never demoted, project rows not this group


async def test_a_demoted_row_can_be_restored(
    mysql_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int
) -> None:
    from service.app.caches import CaptureSwitch
    from service.app.memories import MemoryService

    await set_capture(mysql_db, user_id)
    ids = await seed_many(mysql_db, user_id, [f"事实{i}" for i in range(200)])
    llm.script(f"m{user_id}", [{"type": "user", "content": "新事实"}])
    await run(mysql_db, make_handler, user_id)
    service = MemoryService(mysql_db, CaptureSwitch(mysql_db, 0), RobotKeys())
    await service.delete(user_id, ids[1])

    restored = await service.edit(user_id, ids[0], None, Status.ACTIVE)

    assert restored.status is Status.ACTIVE and restored.content == "事实0"


async def test_adversarial_answers_change_no_row(
    mysql_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int
) -> None:
    """The model answers with other users' ids, MANUAL ids, huge, negative, string and nested ids."""
    victim = user_id + 10**12
    await set_capture(mysql_db, user_id)
    await seed_many(mysql_db, user_id + 2 * 10**12, [f"填充{i}" for i in range(5)])  # real ids above aliases
    victim_ids = await seed_many(mysql_db, victim, ["别人的事实一", "别人的事实二"])
    manual = await seed(mysql_db, user_id, "我的手写", source=Source.MANUAL)
    await seed(mysql_db, user_id, "我的自动", age_minutes=30)
    mine_before, victim_before = await items(mysql_db, user_id), await items(mysql_db, victim)
    hostile_ids: list[object] = [
        *victim_ids,
        manual,
        2**63,
        2**64 + 1,
        -1,
        0,
        "1",
        "1; DROP TABLE memory_item",
        1.5,
        True,
        None,
        {"id": 1},
        [1],
        {"$ref": 1},
    ]
    for hostile in hostile_ids:
        llm.reset()
        llm.script(
            f"m{user_id}",
            [
                {"type": "user", "action": "update", "existingId": hostile, "content": "被篡改"},
                {"type": "user", "action": "touch", "existingId": hostile},
                {"type": "project", "action": "update", "existingId": hostile, "content": "被篡改"},
            ],
        )
        await run(mysql_db, make_handler, user_id, "mao")

    assert await items(mysql_db, victim) == victim_before
    mine_after = await items(mysql_db, user_id)
    assert [(i.id, i.content, i.status, i.source) for i in mine_after] == [
        (i.id, i.content, i.status, i.source) for i in mine_before
    ]
    assert not any(i.content == "被篡改" for i in mine_after)
