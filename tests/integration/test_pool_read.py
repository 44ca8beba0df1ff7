"""The pool read under the user's lock fetches what `decide` needs, not the pool: the ACTIVE count,
the referenced rows, the rows holding the candidates' hashes and each group's D14 victims. A row
the model was shown and that changed before the lock is handled as the whole-pool read handled it."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import pytest

from service.adapters.db.database import Database
from service.adapters.llm_client import LlmClient
from service.core.model import USER_GROUP, Group, Scope, Source, Status
from service.core.normalize import dedup_hash
from service.core.outcomes import Outcome
from service.core.pool_read import PoolQuery
from tests.integration.conftest import HandlerFactory, make_event
from tests.support.meanwhile_llm import AnswerAfter
from tests.support.pool import history, items, seed, set_capture
from tests.support.scripted_llm import ScriptedLlm

MAO = Group(Scope.PROJECT, "mao")
OTHER = Group(Scope.PROJECT, "other")


async def pool_of(db: Database, user_id: int) -> dict[str, int]:
    """A mixed pool, ids by content: machine-made rows of both groups from oldest (1) to newest,
    a MANUAL row older than all, another project's row, dismissed rows."""
    ids = {"手写": await seed(db, user_id, "手写", source=Source.MANUAL, age_minutes=999)}
    for i in range(1, 6):
        ids[f"用户{i}"] = await seed(db, user_id, f"用户{i}", age_minutes=100 - i)
        ids[f"项目{i}"] = await seed(db, user_id, f"项目{i}", group=MAO, age_minutes=100 - i)
    ids["合并"] = await seed(db, user_id, "合并", source=Source.CONSOLIDATED, age_minutes=50)
    ids["别的项目"] = await seed(db, user_id, "别的项目", group=OTHER, age_minutes=999)
    ids["忽略"] = await seed(db, user_id, "忽略", status=Status.DISMISSED, age_minutes=999)
    return ids


async def read(db: Database, user_id: int, project_key: str | None, query: PoolQuery) -> dict[int, Any]:
    async with db.locked_user(user_id) as uow:
        found = await uow.memories.pool(user_id, project_key, query)
    return {"count": found.active_count, "ids": {r.id for r in found.rows}}


def query(refs: Collection[int] = (), hashes: Collection[str] = (), **victims: int) -> PoolQuery:
    groups = {"user": USER_GROUP, "mao": MAO}
    return PoolQuery(frozenset(refs), frozenset(hashes), {groups[g]: n for g, n in victims.items()})


async def test_the_count_is_every_active_row_of_the_user(any_db: Database, user_id: int) -> None:
    await pool_of(any_db, user_id)
    found = await read(any_db, user_id, "mao", query())
    assert found == {"count": 13, "ids": set()}  # MANUAL and another project's rows count; DISMISSED not


async def test_referenced_rows_are_read_whatever_became_of_them(any_db: Database, user_id: int) -> None:
    ids = await pool_of(any_db, user_id)
    wanted = {ids["用户3"], ids["手写"], ids["忽略"]}
    found = await read(any_db, user_id, "mao", query(wanted))
    assert found["ids"] == wanted


async def test_rows_holding_a_candidates_hash_are_read_in_any_state(any_db: Database, user_id: int) -> None:
    ids = await pool_of(any_db, user_id)
    hashes = {dedup_hash(Scope.USER, "", "忽略"), dedup_hash(Scope.PROJECT, "mao", "项目2"), "0" * 40}
    found = await read(any_db, user_id, "mao", query(hashes=hashes))
    assert found["ids"] == {ids["忽略"], ids["项目2"]}


async def test_victims_are_each_groups_oldest_machine_made_rows(any_db: Database, user_id: int) -> None:
    ids = await pool_of(any_db, user_id)
    found = await read(any_db, user_id, "mao", query(user=2, mao=1))
    assert found["ids"] == {ids["用户1"], ids["用户2"], ids["项目1"]}  # never the older MANUAL row
    found = await read(any_db, user_id, None, query(user=3, mao=3))
    assert found["ids"] == {ids["用户1"], ids["用户2"], ids["用户3"]}  # no project: no project victims


# What became of the row meanwhile, and the row and history the extraction leaves, by its action.
# Still machine-made and ACTIVE in its group: the reference holds, and an update replaces the words
# found under the lock. No longer the machine's to change: the candidate is dropped, never inserted.
REWORDED = ("别人改写的事实", "AUTO", "ACTIVE")
CHANGES: dict[str, dict[str, tuple[list[tuple[str, str, str]], list[tuple[str, Any, Any]]]]] = {
    "reworded": {
        "touch": ([REWORDED], [("touch", None, None)]),
        "update": (
            [("报告与邮件都用中文", "AUTO", "ACTIVE")],
            [("update", REWORDED[0], "报告与邮件都用中文")],
        ),
    },
    "edited": dict.fromkeys(("touch", "update"), ([("用户改写的事实", "MANUAL", "ACTIVE")], [])),
    "dismissed": dict.fromkeys(("touch", "update"), ([("报告用中文", "AUTO", "DISMISSED")], [])),
    "deleted": dict.fromkeys(("touch", "update"), ([], [])),
}


@pytest.mark.parametrize("action", ["touch", "update"])
@pytest.mark.parametrize("change", list(CHANGES))
async def test_a_referenced_row_changed_since_the_read_round(
    any_db: Database,
    make_handler: HandlerFactory,
    llm: ScriptedLlm,
    llm_client: LlmClient,
    user_id: int,
    change: str,
    action: str,
) -> None:
    await set_capture(any_db, user_id)
    row_id = await seed(any_db, user_id, "报告用中文", age_minutes=60)

    async def meanwhile() -> None:
        async with any_db.locked_user(user_id) as uow:
            now = any_db.now()
            if change in ("reworded", "edited"):
                text = "别人改写的事实" if change == "reworded" else "用户改写的事实"
                source = Source.MANUAL if change == "edited" else None
                await uow.memories.update_content(
                    user_id, row_id, text, dedup_hash(Scope.USER, "", text), now, source
                )
            elif change == "dismissed":
                await uow.memories.set_status(user_id, row_id, Status.DISMISSED, now)
            else:
                await uow.memories.delete(user_id, row_id)
            await uow.commit()

    llm.script(
        f"m{user_id}", [{"type": "user", "action": action, "existingId": 1, "content": "报告与邮件都用中文"}]
    )
    handler = make_handler(any_db, AnswerAfter(llm_client, meanwhile))
    event = make_event(
        user_id, lastUserMessage=f"请记住这个长期偏好(m{user_id}):以后所有的报告都用中文来写。"
    )

    assert (await handler.handle(event))[0] is Outcome.EXTRACTED

    rows, trail = CHANGES[change][action]
    assert [(r.content, r.source, r.status) for r in await items(any_db, user_id)] == rows
    history_rows = await history(any_db, user_id)
    assert [(h["action"], h["old_content"], h["new_content"]) for h in history_rows] == trail
