"""D15 against MariaDB (and SQLite where named): the model's plan applied in one transaction per group,
or not at all."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pytest
import sqlalchemy as sa

from service.adapters.db.database import Database
from service.adapters.db.engine import build_engine
from service.adapters.db.memory_repository import MemoryRepository
from service.adapters.llm_client import LlmClient
from service.adapters.metrics import Metrics
from service.app.caches import CaptureSwitch
from service.app.consolidation import Consolidator
from service.app.extraction import Extracted
from service.app.memories import MemoryService
from service.core.consolidation import RunResult, Thresholds
from service.core.model import MAX_ACTIVE_PER_USER, Group, Scope, Source, Status
from service.core.project_keys import RobotKeys
from tests.support.backends import mysql_server
from tests.support.pool import history, items, seed, seed_many
from tests.support.processes import OUTPUT, MariaDbDatabase
from tests.support.scripted_llm import ScriptedLlm

MAO = Group(Scope.PROJECT, "mao")
MODEL = "openai/scripted-default"


@pytest.fixture
def consolidator(mysql_db: Database, llm_client: LlmClient, metrics: Metrics) -> Consolidator:
    return Consolidator(mysql_db, llm_client, metrics, Thresholds())


def extracted(user_id: int, project_key: str | None = None, added: int = 1) -> Extracted:
    return Extracted(user_id, project_key, MODEL, added, active_after=MAX_ACTIVE_PER_USER)


async def pool(db: Database, user_id: int, marker: str, count: int = 40) -> list[int]:
    """`count` AUTO rows in the USER group, oldest first, so alias i is the i-th row."""
    return await seed_many(db, user_id, [f"{marker} 事实{i}" for i in range(count)])


async def test_no_call_when_a_condition_fails(
    mysql_db: Database, consolidator: Consolidator, llm: ScriptedLlm, user_id: int
) -> None:
    marker = f"c{user_id}"
    await pool(mysql_db, user_id, marker, count=20)
    assert await consolidator.run(extracted(user_id)) == [RunResult.SKIPPED_THRESHOLD]  # 20 ≤ 30 and ≤ 150
    await pool(mysql_db, user_id, f"{marker}b", count=20)
    assert await consolidator.run(extracted(user_id, added=0)) == [RunResult.SKIPPED_THRESHOLD]
    async with mysql_db.locked_user(user_id) as uow:
        await uow.accounts.set_consolidation_due(user_id, mysql_db.now() + timedelta(hours=1))
        await uow.commit()
    assert await consolidator.run(extracted(user_id)) == [RunResult.SKIPPED_COOLDOWN]
    assert llm.calls(marker) == []


async def test_merge_replaces_its_sources_in_one_transaction(
    mysql_db: Database, consolidator: Consolidator, llm: ScriptedLlm, user_id: int
) -> None:
    marker = f"c{user_id}"
    ids = await pool(mysql_db, user_id, marker)
    llm.script(
        marker,
        [
            {"op": "merge", "sourceIds": [1, 2, 3], "content": "三条合一的完整事实"},
            {"op": "drop", "sourceIds": [4]},
            {"op": "keep", "sourceIds": [5]},
        ],
    )

    assert await consolidator.run(extracted(user_id)) == [RunResult.APPLIED]

    rows = {i.id: i for i in await items(mysql_db, user_id)}
    assert not set(ids[:4]) & set(rows)
    [merged] = [r for r in rows.values() if r.source == "CONSOLIDATED"]
    assert (merged.content, merged.origin_session_id, merged.status) == ("三条合一的完整事实", None, "ACTIVE")
    assert len(rows) == 40 - 4 + 1
    trail = await history(mysql_db, user_id)
    assert sorted(h["action"] for h in trail if h["actor"] == "consolidator") == ["drop"] + ["merge"] * 4
    assert len({h["created_at"] for h in trail if h["actor"] == "consolidator"}) == 1  # one transaction
    [call] = llm.calls(marker)
    assert [e["id"] for e in call.data["memories"]] == list(range(1, 41))
    async with mysql_db.read() as uow:
        assert await uow.accounts.consolidation_due(user_id) is not None


async def test_merge_over_120_characters_abandons_the_group(
    mysql_db: Database, consolidator: Consolidator, llm: ScriptedLlm, user_id: int
) -> None:
    marker = f"c{user_id}"
    await pool(mysql_db, user_id, marker)
    before = await items(mysql_db, user_id)
    llm.script(
        marker,
        [{"op": "drop", "sourceIds": [3]}, {"op": "merge", "sourceIds": [1, 2], "content": "长" * 121}],
    )
    assert await consolidator.run(extracted(user_id)) == [RunResult.ABANDONED_INVALID]
    assert await items(mysql_db, user_id) == before


async def test_llm_error_changes_nothing(
    mysql_db: Database, consolidator: Consolidator, llm: ScriptedLlm, user_id: int
) -> None:
    marker = f"c{user_id}"
    await pool(mysql_db, user_id, marker)
    before = await items(mysql_db, user_id)
    llm.script(marker, status=503)
    assert await consolidator.run(extracted(user_id)) == [RunResult.ABANDONED_ERROR]
    assert await items(mysql_db, user_id) == before


async def test_manual_and_dismissed_rows_are_never_shown_or_changed(
    mysql_db: Database, consolidator: Consolidator, llm: ScriptedLlm, user_id: int
) -> None:
    marker = f"c{user_id}"
    await pool(mysql_db, user_id, marker)
    await seed(mysql_db, user_id, f"{marker} 手写", source=Source.MANUAL)
    await seed(mysql_db, user_id, f"{marker} 忽略", status=Status.DISMISSED)
    await seed(mysql_db, user_id, f"{marker} 项目", group=MAO)
    keep = {
        i.id: i for i in await items(mysql_db, user_id) if i.source == "MANUAL" or i.status == "DISMISSED"
    }
    llm.script(marker, [{"op": "merge", "sourceIds": list(range(1, 41)), "content": "全部合一"}])

    assert await consolidator.run(extracted(user_id)) == [RunResult.APPLIED]

    [call] = llm.calls(marker)
    shown = [e["content"] for e in call.data["memories"]]
    assert len(shown) == 40 and not any(("手写" in c or "忽略" in c or "项目" in c) for c in shown)
    after = {i.id: i for i in await items(mysql_db, user_id)}
    assert all(after[i] == row for i, row in keep.items())
    assert sorted(i.content for i in after.values()) == sorted(
        ["全部合一", f"{marker} 手写", f"{marker} 忽略", f"{marker} 项目"]
    )


async def test_a_merge_that_restates_an_existing_row_deletes_its_sources_in_its_favour(
    mysql_db: Database, consolidator: Consolidator, llm: ScriptedLlm, user_id: int
) -> None:
    marker = f"c{user_id}"
    ids = await pool(mysql_db, user_id, marker)
    manual = await seed(mysql_db, user_id, "已有的完整事实", source=Source.MANUAL)
    llm.script(marker, [{"op": "merge", "sourceIds": [1, 2], "content": "已有的完整事实"}])
    assert await consolidator.run(extracted(user_id)) == [RunResult.APPLIED]
    rows = {i.id for i in await items(mysql_db, user_id)}
    assert manual in rows and not {ids[0], ids[1]} & rows and len(rows) == 39


async def test_the_cooldown_is_read_back_by_a_restarted_service(
    mariadb: MariaDbDatabase,
    mysql_db: Database,
    consolidator: Consolidator,
    llm: ScriptedLlm,
    user_id: int,
    llm_client: LlmClient,
) -> None:
    marker = f"c{user_id}"
    await pool(mysql_db, user_id, marker)
    llm.script(marker, [])
    assert await consolidator.run(extracted(user_id)) == [RunResult.APPLIED]

    restarted_db = Database(build_engine(mariadb.url, pool_size=2))  # nothing shared with the first one
    try:
        restarted = Consolidator(restarted_db, llm_client, Metrics(), Thresholds())
        assert await restarted.run(extracted(user_id)) == [RunResult.SKIPPED_COOLDOWN]
    finally:
        await restarted_db.dispose()
    assert len(llm.calls(marker)) == 1


async def test_a_connection_killed_between_insert_and_deletes_leaves_the_group_unchanged(
    mysql_db: Database,
    consolidator: Consolidator,
    llm: ScriptedLlm,
    user_id: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    marker = f"c{user_id}"
    await pool(mysql_db, user_id, marker)
    before = await items(mysql_db, user_id)
    llm.script(marker, [{"op": "merge", "sourceIds": [1, 2], "content": "合并"}])
    original = MemoryRepository.delete
    killed: list[int] = []

    async def kill_then_delete(self: MemoryRepository, user: int, row_id: int) -> None:
        if not killed:
            connection_id = int(await self.conn.scalar(sa.text("SELECT CONNECTION_ID()")) or 0)
            with mysql_server().connect() as admin:
                admin.cursor().execute(f"KILL {connection_id}")
            killed.append(connection_id)
        await original(self, user, row_id)

    monkeypatch.setattr(MemoryRepository, "delete", kill_then_delete)

    assert await consolidator.run(extracted(user_id)) == [RunResult.ABANDONED_ERROR]

    assert killed and await items(mysql_db, user_id) == before
    assert not any(h["actor"] == "consolidator" for h in await history(mysql_db, user_id))


async def test_a_pool_of_200_paraphrase_pairs_is_merged_in_one_call(
    mysql_db: Database, consolidator: Consolidator, llm: ScriptedLlm, user_id: int
) -> None:
    marker = f"c{user_id}"
    contents = [
        f"{marker} 事实{k}" + ("(说法一)" if v == 0 else "(说法二)") for k in range(100) for v in (0, 1)
    ]
    await seed_many(mysql_db, user_id, contents)
    plan = [
        {"op": "merge", "sourceIds": [2 * k + 1, 2 * k + 2], "content": f"{marker} 事实{k}"}
        for k in range(100)
    ]
    llm.script(marker, plan)
    started = time.perf_counter()

    assert await consolidator.run(extracted(user_id)) == [RunResult.APPLIED]

    elapsed = time.perf_counter() - started
    after = await items(mysql_db, user_id)
    assert len(after) == 100 and all(i.source == "CONSOLIDATED" for i in after)
    calls = len(llm.calls(marker))
    assert calls == 1
    OUTPUT.mkdir(parents=True, exist_ok=True)
    (OUTPUT / "consolidation.txt").write_text(
        f"rows_before=200 rows_after={len(after)} llm_calls={calls} elapsed_s={elapsed:.3f}\n"
    )


async def test_a_pool_within_every_threshold_is_not_even_counted(
    metrics: Metrics, llm_client: LlmClient
) -> None:
    """schedule() decides from the count the extraction committed; only a larger pool is queried."""
    unreachable = Database(build_engine("mysql+aiomysql://root@127.0.0.1:1/none", pool_size=1))
    consolidator = Consolidator(unreachable, llm_client, metrics, Thresholds())

    def count(result: RunResult) -> float:
        value = metrics.registry.get_sample_value("mao_memory_consolidations_total", {"result": result.value})
        return value or 0.0

    skipped, crashed = count(RunResult.SKIPPED_THRESHOLD), count(RunResult.ABANDONED_ERROR)
    try:
        consolidator.schedule(Extracted(7, None, MODEL, added=1, active_after=30))
        await consolidator.close(5)
        assert count(RunResult.SKIPPED_THRESHOLD) == skipped + 1
        assert count(RunResult.ABANDONED_ERROR) == crashed
        consolidator.schedule(Extracted(7, None, MODEL, added=1, active_after=31))
        await consolidator.close(5)
        assert count(RunResult.ABANDONED_ERROR) == crashed + 1  # it went to the (unreachable) database
    finally:
        await unreachable.dispose()


@pytest.mark.parametrize(
    "answer",
    [
        [{"op": "keep", "sourceIds": [1]}, {"op": "drop", "sourceIds": [2]}],
        [{"op": "drop", "sourceIds": [2]}],  # the row it repeats is kept by not being mentioned
    ],
    ids=["kept-by-name", "kept-unmentioned"],
)
async def test_a_drop_whose_kept_twin_the_user_deleted_meanwhile_leaves_the_group_alone(
    any_db: Database, llm: ScriptedLlm, llm_client: LlmClient, user_id: int, answer: list[object]
) -> None:
    """The user deletes one of two rows stating a fact while the model answers that the other only
    repeats it: dropping the other would leave no row stating the fact."""
    marker = f"c{user_id}"
    twins = [f"{marker} 报告用中文写", f"{marker} 报告请用中文撰写"]
    ids = await seed_many(any_db, user_id, twins + [f"{marker} 事实{i}" for i in range(38)])
    llm.script(marker, answer, delay_s=0.5)
    memories = MemoryService(any_db, CaptureSwitch(any_db, 0), RobotKeys())
    consolidator = Consolidator(any_db, llm_client, Metrics(), Thresholds())

    run = asyncio.create_task(consolidator.run(extracted(user_id)))
    async with asyncio.timeout(10):
        while not llm.calls(marker):  # the request reached the model, which answers in 0.5 s
            await asyncio.sleep(0.01)
    await memories.delete(user_id, ids[0])

    assert await run == [RunResult.ABANDONED_STALE]
    rows = {i.id: i for i in await items(any_db, user_id)}
    assert rows[ids[1]].content == twins[1] and len(rows) == 39
    assert not any(h["actor"] == "consolidator" for h in await history(any_db, user_id))
