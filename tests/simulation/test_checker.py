"""The invariant checker fails when any single rule is broken, and passes a step that keeps them all."""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

import pytest

from service.core import normalize
from tests.simulation.checker import (
    Actor,
    Offered,
    Replayed,
    Row,
    Violation,
    check_after_retention,
    check_step,
)
from tests.simulation.conftest import Simulate

T0 = datetime(2027, 3, 1, 12, 0)
T1 = T0 + timedelta(hours=5)


def row(id: int, content: str, source: str = "AUTO", status: str = "ACTIVE", **kw: Any) -> Row:
    fields = {"scope": "USER", "project_key": "", "dismissed_by": None, "updated_at": T0} | kw
    if status == "DISMISSED" and fields["dismissed_by"] is None:
        fields["dismissed_by"] = "USER"
    return Row(
        id,
        fields["scope"],
        fields["project_key"],
        content,
        source,
        status,
        fields["dismissed_by"],
        fields["updated_at"],
    )


def entry(
    memory_id: int, action: str, actor: str, old: str | None = None, new: str | None = None
) -> dict[str, Any]:
    return {
        "memory_id": memory_id,
        "action": action,
        "actor": actor,
        "old_content": old,
        "new_content": new,
        "created_at": T1,
    }


def history_of(rows: list[Row]) -> dict[int, Replayed]:
    """What a consistent history says of these rows."""
    return {r.id: Replayed(r.content, r.status, r.source, r.dismissed_by, r.updated_at) for r in rows}


def check(
    before: list[Row],
    after: list[Row],
    entries: list[dict[str, Any]] | None = None,
    actor: Actor = "extraction",
    offered: Offered | None = None,
    ever_seen: set[int] | None = None,
) -> list[str]:
    return check_step(
        actor,
        {r.id: r for r in before},
        {r.id: r for r in after},
        entries or [],
        ever_seen if ever_seen is not None else {r.id for r in before},
        history_of(before),
        offered,
    )


def test_a_step_that_keeps_every_rule_passes() -> None:
    before = [row(1, "报告用中文"), row(2, "手写", "MANUAL")]
    inserted = row(3, "新事实", updated_at=T1)
    touched = row(1, "报告用中文", updated_at=T1)
    entries = [entry(1, "touch", "auto"), entry(3, "insert", "auto", new="新事实")]
    offered = Offered(json.dumps([{"type": "user", "content": "新事实"}]), None)
    assert check(before, [touched, before[1], inserted], entries, offered=offered) == []


def test_over_200_active_rows_is_caught() -> None:
    rows = [row(i, f"事实{i}") for i in range(201)]
    assert any("over 200" in p for p in check(rows, rows))


def test_two_active_rows_with_one_identity_are_caught() -> None:
    rows = [row(1, "报告用中文"), row(2, "报告\u200b用中文")]
    assert any("same identity" in p for p in check(rows, rows))


def test_a_reused_id_is_caught() -> None:
    new = row(5, "新事实", updated_at=T1)
    problems = check([], [new], [entry(5, "insert", "auto", new="新事实")], ever_seen={5})
    assert any("reused" in p for p in problems)


def test_a_manual_row_changed_by_the_machine_is_caught() -> None:
    manual = row(2, "手写", "MANUAL")
    touched = row(2, "手写", "MANUAL", updated_at=T1)
    assert any("MANUAL row 2 changed" in p for p in check([manual], [touched], [entry(2, "touch", "auto")]))


def test_a_user_dismissal_revived_by_the_machine_is_caught() -> None:
    dismissed = row(3, "不要的事实", status="DISMISSED")
    revived = row(3, "不要的事实", updated_at=T1)
    problems = check([dismissed], [revived], [entry(3, "restore", "auto")])
    assert any("user-dismissed row 3 changed" in p for p in problems)


def test_an_active_row_deleted_without_a_merge_or_drop_is_caught() -> None:
    gone = row(4, "会消失的事实")
    assert any("row 4 deleted by extraction" in p for p in check([gone], [], [entry(4, "delete", "auto")]))
    assert (
        check([gone], [], [entry(4, "drop", "consolidator", old="会消失的事实")], actor="consolidation") == []
    )


def test_a_new_fact_that_does_not_get_in_while_there_is_room_is_caught() -> None:
    pool = [row(i, f"事实{i}") for i in range(200)]
    offered = Offered(json.dumps([{"type": "user", "content": "新事实"}]), None)
    assert any("did not get in" in p for p in check(pool, pool, offered=offered))
    manual_only = [row(i, f"手写{i}", "MANUAL") for i in range(200)]
    assert check(manual_only, manual_only, offered=offered) == []  # no machine-made row: no room


def test_a_row_its_history_does_not_describe_is_caught() -> None:
    before = [row(1, "报告用中文")]
    rewritten = row(1, "报告用英文", updated_at=T1)
    assert any("history of 1" in p for p in check(before, [rewritten], [entry(1, "touch", "auto")]))


async def test_a_broken_rule_in_the_service_is_caught_by_the_simulation(
    monkeypatch: pytest.MonkeyPatch, simulate: Simulate
) -> None:
    """Undo one rule (the hash goes back to trim-and-fold, blind to invisible and full-width
    differences) and a short simulated year ends in a violation: two ACTIVE rows that look alike."""
    monkeypatch.setattr(normalize, "identity", normalize.normalize)
    with pytest.raises(Violation, match="same identity"):
        await simulate(users=1, events=300)


def folded_history(touch_count: int, last_at: datetime | None) -> list[dict[str, Any]]:
    insert = entry(1, "insert", "llm", new="报告用中文写") | {
        "created_at": T0,
        "repeat_count": 1,
        "last_at": None,
    }
    touch = entry(1, "touch", "llm") | {"created_at": T0 + timedelta(hours=1)}
    return [insert, touch | {"repeat_count": touch_count, "last_at": last_at}]


def test_a_folded_history_that_adds_up_and_ends_at_the_last_touch_passes() -> None:
    rows = {1: row(1, "报告用中文写", updated_at=T1)}
    assert check_after_retention(rows, folded_history(3, T1), Counter({1: 3})) == []


def test_a_fold_that_lost_a_touch_or_its_last_time_is_caught() -> None:
    rows = {1: row(1, "报告用中文写", updated_at=T1)}
    [lost] = check_after_retention(rows, folded_history(2, T1), Counter({1: 3}))
    assert "2 touches of 1 are left of 3" in lost
    [stale] = check_after_retention(rows, folded_history(3, None), Counter({1: 3}))
    assert "replays to" in stale


def test_a_trail_removed_under_a_live_memory_is_caught() -> None:
    rows = {1: row(1, "报告用中文写", updated_at=T1)}
    assert check_after_retention(rows, [], Counter({1: 3})) != []
