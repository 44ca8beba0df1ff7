"""The per-user extraction budget (`MEMORY_EXTRACTIONS_PER_USER_PER_DAY`) over the last 24 hours,
and the session's negative list (`MEMORY_NEGATIVE_LIST_MAX`)."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import timedelta

from structlog.testing import capture_logs

from service.adapters.db.database import Database
from service.app.caches import CaptureSwitch
from service.core.model import Group, Scope, Status
from service.core.outcomes import Outcome
from tests.integration.conftest import HandlerFactory, make_event
from tests.support.clock import ManualClock
from tests.support.pool import seed, set_capture
from tests.support.scripted_llm import ScriptedLlm

BUDGET = 3


async def test_the_budget_holds_at_its_edge_and_frees_up_24_hours_after_each_extraction(
    any_db: Database, clock: ManualClock, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int
) -> None:
    await set_capture(any_db, user_id)
    marker = f"b{user_id}"
    llm.script(marker, [{"type": "user", "content": "报告用中文"}])
    handler = make_handler(any_db, extractions_per_user_per_day=BUDGET)
    session = iter(range(1, 100))

    async def extract() -> Outcome:
        event = make_event(
            user_id, next(session), lastUserMessage=f"请记住这个长期偏好({marker}):报告用中文写。"
        )
        return (await handler.handle(event))[0]

    started = clock.now()
    assert [await extract() for _ in range(BUDGET)] == [Outcome.EXTRACTED] * BUDGET  # the edge: all of it
    clock.advance(timedelta(hours=1))
    with capture_logs() as logs:
        assert [await extract(), await extract()] == [Outcome.SKIPPED_BUDGET] * 2
    assert len(llm.calls(marker)) == BUDGET  # no model call beyond the budget
    spent = [entry for entry in logs if entry["event"] == "extraction_budget_spent"]
    assert [(e["user_id"], e["per_day"], e["log_level"]) for e in spent] == [(user_id, BUDGET, "info")]

    clock.advance(started + timedelta(hours=24) - clock.now())  # across the day boundary: still inside
    assert await extract() is Outcome.SKIPPED_BUDGET
    clock.advance(timedelta(seconds=1))  # the first three are now more than 24 hours old
    with capture_logs() as logs:
        assert [await extract() for _ in range(BUDGET)] == [Outcome.EXTRACTED] * BUDGET
        assert await extract() is Outcome.SKIPPED_BUDGET  # told 23 hours ago: not logged again
        clock.advance(started + timedelta(hours=25) - clock.now())
        assert await extract() is Outcome.SKIPPED_BUDGET  # told 24 hours ago: logged again
    assert [e["event"] for e in logs].count("extraction_budget_spent") == 1
    assert len(llm.calls(marker)) == 2 * BUDGET


async def test_a_user_over_budget_leaves_other_users_alone(
    any_db: Database, clock: ManualClock, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int
) -> None:
    other = user_id + 10**12
    for user in (user_id, other):
        await set_capture(any_db, user)
    handler = make_handler(any_db, extractions_per_user_per_day=1)
    outcomes = [
        (await handler.handle(make_event(user, session)))[0]
        for user, session in ((user_id, 1), (user_id, 2), (other, 3))
    ]
    assert outcomes == [Outcome.EXTRACTED, Outcome.SKIPPED_BUDGET, Outcome.EXTRACTED]


async def test_the_negative_list_is_the_sessions_newest_dismissals_within_the_bound(
    any_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int
) -> None:
    await set_capture(any_db, user_id)
    alpha, beta = Group(Scope.PROJECT, "alpha"), Group(Scope.PROJECT, "beta")
    for age, content, group in (
        (50, "用户拒绝的旧事实", None),
        (40, "项目 A 拒绝的事实", alpha),
        (30, "项目 B 拒绝的事实", beta),
        (20, "用户拒绝的新事实", None),
        (10, "项目 B 新拒绝的事实", beta),
    ):
        kwargs = {"group": group} if group else {}
        await seed(any_db, user_id, content, status=Status.DISMISSED, age_minutes=age, **kwargs)
    marker = f"n{user_id}"

    async def shown(project_key: str, bound: int) -> list[str]:
        event = make_event(
            user_id, lastUserMessage=f"请记住这个长期偏好({marker}):报告用中文写。", projectKey=project_key
        )
        await make_handler(any_db, negative_list_max=bound).handle(event)
        return list(llm.calls(marker)[-1].data["dismissed"])[::-1]  # the prompt shows them oldest first

    assert await shown("alpha", 200) == ["用户拒绝的新事实", "项目 A 拒绝的事实", "用户拒绝的旧事实"]
    assert await shown("alpha", 2) == ["用户拒绝的新事实", "项目 A 拒绝的事实"]
    assert await shown("beta", 200) == [
        "项目 B 新拒绝的事实",
        "用户拒绝的新事实",
        "项目 B 拒绝的事实",
        "用户拒绝的旧事实",
    ]


async def test_events_queued_for_a_model_slot_do_not_pass_a_spent_budget(
    any_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int
) -> None:
    """Every read round of a burst runs before the first model call ends: the extractions admitted
    but not yet in the ledger count against the budget too."""
    await set_capture(any_db, user_id)
    marker = f"q{user_id}"
    llm.script(marker, [{"type": "user", "content": "报告用中文"}], delay_s=0.05)
    handler = make_handler(any_db, slots=1, database_slots=10, extractions_per_user_per_day=2)
    events = [
        make_event(user_id, session, lastUserMessage=f"请记住这个长期偏好({marker}):报告用中文写。")
        for session in range(1, 21)
    ]
    outcomes = Counter(outcome for outcome, _ in await asyncio.gather(*map(handler.handle, events)))
    assert outcomes == {Outcome.EXTRACTED: 2, Outcome.SKIPPED_BUDGET: 18}
    assert len(llm.calls(marker)) == 2
    assert await handler.handle(
        make_event(user_id, 21, lastUserMessage=f"请记住({marker}):报告用中文写。")
    ) == (
        Outcome.SKIPPED_BUDGET,
        None,
    )


async def test_a_refusal_is_remembered_until_the_oldest_extraction_leaves_the_window(
    any_db: Database, clock: ManualClock, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int
) -> None:
    """Over budget, an event is skipped from the warm caches alone, without a read round."""
    await set_capture(any_db, user_id)
    marker = f"r{user_id}"
    llm.script(marker, [{"type": "user", "content": "报告用中文"}])
    handler = make_handler(any_db, capture=CaptureSwitch(any_db, 60), extractions_per_user_per_day=1)
    events = iter(
        make_event(user_id, session, lastUserMessage=f"请记住这个长期偏好({marker}):报告用中文写。")
        for session in range(1, 100)
    )
    started = clock.now()
    assert (await handler.handle(next(events)))[0] is Outcome.EXTRACTED
    await handler.warm([user_id])
    assert handler.outcome_without_io(next(events)) is None  # not refused yet: the ledger decides
    clock.advance(timedelta(hours=2))
    assert (await handler.handle(next(events)))[0] is Outcome.SKIPPED_BUDGET
    await handler.warm([user_id])  # as the consumer does for each fetched batch
    assert handler.outcome_without_io(next(events)) is Outcome.SKIPPED_BUDGET
    clock.advance(started + timedelta(hours=24, seconds=1) - clock.now())
    await handler.warm([user_id])
    assert handler.outcome_without_io(next(events)) is None
    assert (await handler.handle(next(events)))[0] is Outcome.EXTRACTED
