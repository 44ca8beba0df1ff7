"""The invariant checkers fail when any single rule is broken, and pass a step (or an upgrade) that
keeps them all."""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

import pytest

from service.app import memories as _memories  # noqa: F401  (binds `identity` before a test patches it)
from service.core import normalize
from service.core.consolidation import ConsolidationPlan, Merge
from service.core.consolidation_ops import GroupState, MergeAway, decide
from service.core.model import Group, MemoryRow, Scope, Source, Status
from service.core.model_quality import Rejection
from service.core.normalize import dedup_hash
from tests.simulation.checker import (
    Actor,
    Made,
    Offered,
    Replayed,
    Row,
    UserRejection,
    Violation,
    check_after_retention,
    check_step,
    expected_quality,
    lost_facts,
    quality_differences,
    reported_quality,
)
from tests.simulation.conftest import Simulate
from tests.simulation.model import wording
from tests.simulation.twins import KINDS, TwinRow, _old_hash, check_twins, twin_sets

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
    gone, twin = row(4, "用户7的事实5:会消失的说法"), row(5, "用户7的事实5:留下的说法")
    assert any("row 4 deleted by extraction" in p for p in check([gone], [], [entry(4, "delete", "auto")]))
    dropped = [entry(4, "drop", "consolidator", old=gone.content)]
    assert check([gone, twin], [twin], dropped, actor="consolidation") == []


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


def test_a_consolidation_that_leaves_a_fact_unstated_is_caught_unless_the_user_deleted_it() -> None:
    kept, dropped = row(1, "用户7的事实3:报告用中文"), row(2, "用户7的事实3:中文写报告")
    other = row(3, "用户7的事实4:周末不开会")
    drop = [entry(2, "drop", "consolidator", old=dropped.content)]
    user_delete = entry(1, "delete", "user", old=kept.content)
    problems = check([kept, dropped, other], [other], [user_delete, *drop], actor="consolidation")
    assert any("row 1 deleted by consolidation" in p for p in problems)  # not known to be the user's
    lost = check_step(
        "consolidation",
        {r.id: r for r in (kept, dropped, other)},
        {3: other},
        [user_delete, *drop],
        {1, 2, 3},
        history_of([kept, dropped, other]),
        user_deleted=frozenset({1}),
    )
    assert lost == ["fact ('USER', '', (7, 3)) lost: no ACTIVE row states it"]
    assert lost_facts({1: kept, 2: dropped}, {}, frozenset({1, 2})) == []  # the user deleted both
    merged = row(4, "用户7的事实3:报告一律用中文", "CONSOLIDATED", updated_at=T1)
    assert lost_facts({1: kept, 2: dropped}, {4: merged}, frozenset()) == []  # new words, same fact


def test_every_twin_set_is_one_identity_under_distinct_revision_0001_hashes() -> None:
    sets = list(twin_sets(7))
    for rows in sets:
        assert len({normalize.identity(r.content) for r in rows}) == 1
        assert len({_old_hash(r) for r in rows}) == len(rows)
    pairs = {(a.source, a.state, b.source, b.state) for a, b, *_ in sets}
    assert len(pairs) == len(KINDS) ** 2  # every kind before and after every other


def twin(id: int, kind: tuple[str, str, str | None], hours: int) -> TwinRow:
    created = T0 + timedelta(hours=hours)
    updated = created + timedelta(minutes=30) if kind[1] == "DISMISSED" else created
    return TwinRow(id, 7, "USER", "", f"事实{id}", *kind, created, updated)


def migrated(kept: TwinRow, state: tuple[str, str | None] | None = None) -> dict[int, dict[str, Any]]:
    status, why = state or kept.state
    digest = normalize.dedup_hash(Scope.USER, "", kept.content)
    return {
        kept.id: {
            "content": kept.content,
            "source": kept.source,
            "status": status,
            "dismissed_by": why,
            "dedup_hash": digest,
        }
    }


AUTO, MANUAL = ("AUTO", "ACTIVE", None), ("MANUAL", "ACTIVE", None)
REJECTED, DEMOTED = ("AUTO", "DISMISSED", "USER"), ("AUTO", "DISMISSED", "CAPACITY")


def merges(*rows: TwinRow) -> list[dict[str, Any]]:
    return [{"memory_id": r.id, "action": "merge", "old_content": r.content} for r in rows]


def test_an_upgrade_that_keeps_the_precedence_passes() -> None:
    older, newer = twin(1, AUTO, 0), twin(2, MANUAL, 1)
    assert check_twins([[older, newer]], migrated(newer), merges(older)) == []
    rejected, written_later = twin(3, REJECTED, 0), twin(4, MANUAL, 1)  # the user's newer word wins
    assert check_twins([[rejected, written_later]], migrated(written_later), merges(rejected)) == []
    demoted, active = twin(5, DEMOTED, 0), twin(6, AUTO, 1)
    restored = [{"memory_id": 5, "action": "restore", "old_content": demoted.content}, *merges(active)]
    assert check_twins([[demoted, active]], migrated(demoted, ("ACTIVE", None)), restored) == []


def test_an_upgrade_that_breaks_the_precedence_is_caught() -> None:
    auto, manual = twin(1, AUTO, 0), twin(2, MANUAL, 1)
    [deleted_manual] = check_twins([[auto, manual]], migrated(auto), merges(manual))
    assert "MANUAL [2] deleted" in deleted_manual
    written, rejected = twin(3, MANUAL, 0), twin(4, REJECTED, 1)  # dismissed after the MANUAL row
    [lost_dismissal] = check_twins([[written, rejected]], migrated(written), merges(rejected))
    assert "the precedence says ('DISMISSED', 'USER')" in lost_dismissal
    demoted, active = twin(5, DEMOTED, 0), twin(6, AUTO, 1)
    [lost_active] = check_twins([[demoted, active]], migrated(demoted), merges(active))
    assert "the precedence says ('ACTIVE', None)" in lost_active
    first, second = twin(7, AUTO, 0), twin(8, AUTO, 1)
    assert check_twins([[first, second]], migrated(second), merges(first)) == [
        "twins [7, 8]: 8 survives, not the oldest"
    ]
    assert check_twins([[first, second]], migrated(first), []) == [
        "twins [7, 8]: folding 8 left no merge in the history"
    ]
    both = migrated(first) | migrated(second)
    assert check_twins([[first, second]], both, []) == ["twins [7, 8]: 2 rows survive, not one"]


def test_a_merge_onto_a_row_with_an_invisible_character_keeps_the_fact() -> None:
    """The service folds a merge into the ACTIVE row that already says its text, and identity ignores
    a zero-width space: that row states the fact, whatever characters it hides."""
    texts = {1: wording(7, 3, 0), 2: wording(7, 3, 1), 3: wording(7, 3, 2).replace("的", "\u200b的", 1)}
    group = Group(Scope.USER, "")
    rows = {
        i: MemoryRow(i, Scope.USER, "", t, Source.AUTO, Status.ACTIVE, dedup_hash(Scope.USER, "", t), T0)
        for i, t in texts.items()
    }
    plan = ConsolidationPlan([Merge((1, 2), wording(7, 3, 2))])
    ops = decide(plan, group, {1: rows[1], 2: rows[2]}, GroupState(rows, {rows[3].dedup_hash: rows[3]}))
    assert ops == [MergeAway(1, texts[1], wording(7, 3, 2)), MergeAway(2, texts[2], wording(7, 3, 2))]
    before = {i: row(i, t) for i, t in texts.items()}
    assert lost_facts(before, {3: before[3]}, frozenset()) == []
    assert lost_facts(before, {1: before[1]}, frozenset()) == []


def test_the_quality_ground_truth_counts_each_memory_s_first_rejection_by_its_horizon() -> None:
    now, day = T0 + timedelta(days=200), timedelta(days=1)
    made = [
        Made(1, "a", now - 40 * day),  # dismissed on day 3, deleted on day 5: a dismissal
        Made(2, "a", now - 40 * day),  # edited on day 10: within 30 days only
        Made(3, "a", now - 40 * day),  # deleted on day 31: within no horizon
        Made(4, "a", now - 10 * day),  # deleted on day 2, too young for the 30-day cohort
        Made(5, "a", now - 91 * day),  # before the window
        Made(6, "a", now - 2 * day),  # too young for any cohort
        Made(7, "b", now - 8 * day),
    ]
    rejections = [
        UserRejection(1, Rejection.DISMISSED, now - 37 * day),
        UserRejection(1, Rejection.DELETED, now - 35 * day),
        UserRejection(2, Rejection.EDITED, now - 30 * day),
        UserRejection(3, Rejection.DELETED, now - 9 * day),
        UserRejection(4, Rejection.DELETED, now - 8 * day),
        UserRejection(5, Rejection.DELETED, now - 89 * day),
        UserRejection(99, Rejection.DISMISSED, now - 5 * day),  # a row no extraction made
    ]
    figures = expected_quality(made, rejections, Counter({7: 3, 2: 1}), now)
    zero = dict.fromkeys(["dismissed", "deleted", "edited"], 0)
    a, b = figures["a"], figures["b"]
    assert (a["created"], a["cohort 7d"], a["cohort 30d"]) == (5, 4, 3)
    assert {k: a[f"{k} 7d"] for k in zero} == zero | {"dismissed": 1, "deleted": 1}
    assert {k: a[f"{k} 30d"] for k in zero} == zero | {"dismissed": 1, "edited": 1}
    assert (a["reconfirmed"], a["touches"], b["reconfirmed"], b["touches"]) == (1, 1, 1, 3)
    assert (b["created"], b["cohort 7d"], b["cohort 30d"]) == (1, 1, 0)


def test_the_endpoint_s_answer_is_compared_figure_by_figure() -> None:
    within = [
        {"days": d, "cohort": 4, "rejected": {"dismissed": 1, "deleted": 0, "edited": d // 30, "total": 0}}
        for d in (7, 30)
    ]
    answer = [{"model": "a", "created": 5, "reconfirmed": 1, "touches": 1, "within": within}]
    reported = reported_quality(answer)
    assert reported["a"]["edited 30d"] == 1 and reported["a"]["edited 7d"] == 0
    expected = {"a": reported["a"] | {"deleted 30d": 2}, "b": {"created": 1}}
    assert quality_differences(reported, expected) == [
        "a deleted 30d: 0 reported, 2 expected",
        "b created: None reported, 1 expected",
    ]
    assert quality_differences(reported, reported) == []
