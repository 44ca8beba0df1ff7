"""The write decision of seed 5.6 step 5, D3, D13 and D14, over plain data."""

from __future__ import annotations

from datetime import datetime, timedelta

from service.core.comparison_set import ComparisonSet, build_comparison_set
from service.core.model import (
    USER_GROUP,
    Action,
    Candidate,
    DismissedBy,
    Group,
    MemoryRow,
    Scope,
    Source,
    Status,
)
from service.core.normalize import dedup_hash
from service.core.persist_plan import Demote, Insert, PoolState, Restore, Result, Touch, Update, decide

T0 = datetime(2026, 1, 1)
MAO = Group(Scope.PROJECT, "mao")


def row(
    id: int,
    content: str,
    group: Group = USER_GROUP,
    source: Source = Source.AUTO,
    status: Status = Status.ACTIVE,
    age: int = 0,
    dismissed_by: DismissedBy | None = None,
) -> MemoryRow:
    return MemoryRow(
        id=id,
        scope=group.scope,
        project_key=group.project_key,
        content=content,
        source=source,
        status=status,
        dedup_hash=dedup_hash(group.scope, group.project_key, content),
        updated_at=T0 - timedelta(minutes=age),
        dismissed_by=(dismissed_by or DismissedBy.USER) if status is Status.DISMISSED else None,
    )


def state(rows: list[MemoryRow], active_count: int | None = None) -> PoolState:
    return PoolState(
        machine_active={r.id: r for r in rows if r.machine_active},
        by_hash={r.dedup_hash: r for r in rows},
        active_count=sum(r.status is Status.ACTIVE for r in rows) if active_count is None else active_count,
    )


def insert(content: str, type: Scope = Scope.USER) -> Candidate:
    return Candidate(type=type, action=Action.INSERT, content=content)


def ref(action: Action, alias: object, content: str | None = None, type: Scope = Scope.USER) -> Candidate:
    return Candidate(type=type, action=action, content=content, existing_alias=alias)


def comparison(rows: list[MemoryRow], project_key: str | None = None) -> ComparisonSet:
    return build_comparison_set(rows, project_key, [])


def alias_of(existing: ComparisonSet, row_id: int) -> int:
    return next(alias for alias, shown in enumerate(existing.shown, start=1) if shown[0] == row_id)


def test_new_fact_is_inserted() -> None:
    plan = decide([insert("用中文写报告")], comparison([]), None, state([]))
    assert plan.results == [Result.INSERTED]
    assert plan.ops == [Insert(USER_GROUP, "用中文写报告", dedup_hash(Scope.USER, "", "用中文写报告"))]
    assert plan.active_after == 1


def test_exact_hash_hit_on_a_machine_made_row_is_a_touch() -> None:
    for source in (Source.AUTO, Source.CONSOLIDATED):
        existing = row(7, "用中文写报告", source=source)
        plan = decide([insert(" 用中文写报告 ")], comparison([]), None, state([existing]))
        assert plan.results == [Result.TOUCHED] and plan.ops == [Touch(7)]


def test_exact_hash_hit_on_a_manual_row_leaves_it_alone() -> None:
    existing = row(7, "用中文写报告", source=Source.MANUAL)
    plan = decide([insert("用中文写报告")], comparison([]), None, state([existing]))
    assert plan.results == [Result.MATCHED_MANUAL] and plan.ops == [] and plan.added == 0


def test_a_fact_demoted_for_capacity_is_restored_when_it_comes_back() -> None:
    demoted = row(7, "用中文写报告", status=Status.DISMISSED, dismissed_by=DismissedBy.CAPACITY)
    plan = decide([insert("用中文写报告")], comparison([]), None, state([demoted]))
    assert plan.results == [Result.RESTORED] and plan.ops == [Restore(7, "用中文写报告")]
    assert plan.added == 1 and plan.active_after == 1


def test_a_restore_at_the_cap_demotes_the_oldest_machine_made_row_first() -> None:
    demoted = row(7, "用中文写报告", status=Status.DISMISSED, dismissed_by=DismissedBy.CAPACITY)
    oldest, newer = row(1, "最旧", source=Source.CONSOLIDATED, age=90), row(2, "较新", age=10)
    rows = [demoted, oldest, newer]
    plan = decide([insert("用中文写报告")], comparison(rows), None, state(rows, active_count=200))
    assert plan.ops == [Demote(1, "最旧"), Restore(7, "用中文写报告")]
    assert plan.active_after == 200


def test_a_restore_at_the_cap_without_a_machine_made_row_is_dropped() -> None:
    demoted = row(7, "用中文写报告", status=Status.DISMISSED, dismissed_by=DismissedBy.CAPACITY)
    rows = [demoted, row(1, "手写", source=Source.MANUAL)]
    plan = decide([insert("用中文写报告")], comparison(rows), None, state(rows, active_count=200))
    assert plan.results == [Result.DROPPED_NO_ROOM] and plan.ops == []


def test_merged_rows_are_matched_updated_and_demoted_like_extracted_ones() -> None:
    merged = row(1, "合并后的事实", source=Source.CONSOLIDATED, age=30)
    existing = comparison([merged])
    assert [shown[0] for shown in existing.shown] == [1]
    plan = decide([ref(Action.UPDATE, 1, "合并后的完整事实")], existing, None, state([merged]))
    assert plan.results == [Result.UPDATED]
    plan = decide([insert("新事实")], existing, None, state([merged], active_count=200))
    assert plan.ops[0] == Demote(1, "合并后的事实") and plan.results == [Result.INSERTED]


def test_exact_hash_hit_on_dismissed_row_is_never_revived() -> None:
    dismissed = row(7, "用中文写报告", status=Status.DISMISSED)
    plan = decide([insert("用中文写报告")], comparison([]), None, state([dismissed]))
    assert plan.results == [Result.DROPPED_DISMISSED] and plan.ops == []


def test_project_fact_without_valid_project_key_is_stored_as_user() -> None:
    plan = decide([insert("仓库用 pnpm", Scope.PROJECT)], comparison([]), None, state([]))
    assert isinstance(plan.ops[0], Insert) and plan.ops[0].group == USER_GROUP


def test_project_fact_with_project_key_goes_to_that_project() -> None:
    plan = decide([insert("仓库用 pnpm", Scope.PROJECT)], comparison([], "mao"), "mao", state([]))
    assert isinstance(plan.ops[0], Insert) and plan.ops[0].group == MAO


def test_touch_refreshes_the_referenced_row_only() -> None:
    rows = [row(1, "a"), row(2, "b")]
    existing = comparison(rows)
    alias = alias_of(existing, 2)
    plan = decide([ref(Action.TOUCH, alias)], existing, None, state(rows))
    assert plan.ops == [Touch(2)] and plan.results == [Result.TOUCHED]


def test_update_rewrites_content_and_rehashes() -> None:
    rows = [row(1, "报告用中文")]
    plan = decide([ref(Action.UPDATE, 1, "报告与邮件都用中文")], comparison(rows), None, state(rows))
    assert plan.ops == [
        Update(1, "报告用中文", "报告与邮件都用中文", dedup_hash(Scope.USER, "", "报告与邮件都用中文"))
    ]


def test_update_colliding_with_another_row_falls_back_to_touch() -> None:
    rows = [row(1, "报告用中文"), row(2, "报告与邮件都用中文", source=Source.MANUAL)]
    plan = decide([ref(Action.UPDATE, 1, "报告与邮件都用中文")], comparison(rows), None, state(rows))
    assert plan.ops == [Touch(1)] and plan.results == [Result.UPDATE_COLLIDED_TOUCHED]


def test_references_outside_the_comparison_set_drop_the_candidate() -> None:
    manual = row(1, "手写", source=Source.MANUAL)
    dismissed = row(2, "忽略", status=Status.DISMISSED)
    other_project = row(3, "别的项目", group=Group(Scope.PROJECT, "other"))
    rows = [manual, dismissed, other_project]
    existing = comparison(rows, "mao")
    assert existing.shown == []
    for alias in (1, 2, 3, 99, -1, "1", 1.0, True, None, {"id": 1}, [1]):
        for action in (Action.TOUCH, Action.UPDATE):
            plan = decide([ref(action, alias, "新内容")], existing, "mao", state(rows))
            assert plan.ops == [] and plan.results == [Result.DROPPED_INVALID_REF], (alias, action)


def test_reference_to_a_row_of_the_other_group_is_dropped() -> None:
    rows = [row(1, "项目事实", group=MAO)]
    existing = comparison(rows, "mao")
    plan = decide([ref(Action.TOUCH, 1, type=Scope.USER)], existing, "mao", state(rows))
    assert plan.results == [Result.DROPPED_INVALID_REF]


def test_reference_to_a_row_changed_since_the_prompt_is_dropped() -> None:
    shown = [row(1, "a")]
    existing = comparison(shown)
    now_dismissed = [row(1, "a", status=Status.DISMISSED)]
    plan = decide([ref(Action.TOUCH, 1)], existing, None, state(now_dismissed))
    assert plan.results == [Result.DROPPED_INVALID_REF] and plan.ops == []


def test_at_the_cap_the_oldest_auto_row_of_the_group_is_demoted() -> None:
    rows = [row(1, "旧", age=50), row(2, "新", age=1), row(3, "项目旧", group=MAO, age=99)]
    plan = decide([insert("全新事实")], comparison(rows, "mao"), "mao", state(rows, active_count=200))
    assert plan.ops[0] == Demote(1, "旧") and isinstance(plan.ops[1], Insert)
    assert plan.results == [Result.INSERTED]
    assert plan.active_after == 200


def test_at_the_cap_with_only_manual_rows_in_the_group_the_insert_is_dropped() -> None:
    rows = [row(1, "手写", source=Source.MANUAL), row(2, "项目", group=MAO)]
    plan = decide([insert("全新事实")], comparison(rows, "mao"), "mao", state(rows, active_count=200))
    assert plan.ops == [] and plan.results == [Result.DROPPED_NO_ROOM]


def test_one_demotion_per_insert_and_touched_rows_are_kept() -> None:
    rows = [row(i, f"事实{i}", age=100 - i) for i in range(1, 6)]
    existing = comparison(rows)
    oldest_alias = alias_of(existing, 1)
    candidates = [ref(Action.TOUCH, oldest_alias), insert("新一"), insert("新二")]
    plan = decide(candidates, existing, None, state(rows, active_count=200))
    demoted = [op.row_id for op in plan.ops if isinstance(op, Demote)]
    assert demoted == [2, 3]
    assert sum(isinstance(op, Insert) for op in plan.ops) == 2


def test_the_same_new_fact_twice_in_one_answer_is_inserted_once() -> None:
    plan = decide([insert("同一事实"), insert("同一事实 ")], comparison([]), None, state([]))
    assert sum(isinstance(op, Insert) for op in plan.ops) == 1 and plan.results == [
        Result.INSERTED,
        Result.TOUCHED,
    ]


def test_a_row_demoted_earlier_in_the_same_plan_comes_back_only_with_room() -> None:
    rows = [row(1, "旧", age=50)]
    plan = decide([insert("新"), insert("旧")], comparison(rows), None, state(rows, active_count=200))
    assert plan.results == [Result.INSERTED, Result.DROPPED_NO_ROOM]
    rows = [row(1, "旧", age=50), row(2, "更旧", age=90)]
    plan = decide([insert("新"), insert("旧")], comparison(rows), None, state(rows, active_count=200))
    assert plan.results == [Result.INSERTED, Result.TOUCHED]  # "更旧" made room; "旧" stayed ACTIVE


def test_new_wording_of_a_dismissed_fact_can_be_inserted() -> None:
    """10.6: the negative list carries no ids; only an identical content is blocked by the hash."""
    dismissed = row(1, "报告用中文", status=Status.DISMISSED)
    existing = build_comparison_set([dismissed], None, [dismissed.content])
    plan = decide([insert("汇报类输出使用中文")], existing, None, state([dismissed]))
    assert plan.results == [Result.INSERTED]
