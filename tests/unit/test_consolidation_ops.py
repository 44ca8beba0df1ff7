"""What a consolidation plan writes once the model has answered, decided on the group as read under
the lock: every row the plan relies on must be unchanged, and a merge folds where its text lives."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.core.consolidation import ConsolidationPlan, Merge, RunResult
from service.core.consolidation_ops import (
    Abandon,
    Drop,
    GroupState,
    InsertMerged,
    MergeAway,
    Op,
    RestoreMerged,
    decide,
    merged_hashes,
)
from service.core.model import USER_GROUP, DismissedBy, MemoryRow, Scope, Source, Status
from service.core.normalize import dedup_hash

T0 = datetime(2026, 12, 1)


def row(
    id: int,
    content: str,
    source: Source = Source.AUTO,
    status: Status = Status.ACTIVE,
    dismissed_by: DismissedBy | None = None,
) -> MemoryRow:
    return MemoryRow(
        id, Scope.USER, "", content, source, status, dedup_hash(Scope.USER, "", content), T0, dismissed_by
    )


SHOWN = {1: row(1, "报告用中文写"), 2: row(2, "报告请用中文撰写"), 3: row(3, "周末不开会")}


def state(rows: list[MemoryRow], plan: ConsolidationPlan) -> GroupState:
    """The pool as read under the lock: the group's machine-made ACTIVE rows and the merged texts' rows."""
    hashes = merged_hashes(plan, USER_GROUP)
    return GroupState(
        {r.id: r for r in rows if r.machine_active},
        {r.dedup_hash: r for r in rows if r.dedup_hash in hashes},
    )


def decided(plan: ConsolidationPlan, rows: list[MemoryRow]) -> list[Op] | Abandon:
    return decide(plan, USER_GROUP, SHOWN, state(rows, plan))


KEEP_1_DROP_2 = ConsolidationPlan(drops=[2])  # keep [1] named or not: the plan format says the same


def test_a_drop_applies_when_every_row_it_keeps_is_unchanged() -> None:
    assert decided(KEEP_1_DROP_2, list(SHOWN.values())) == [Drop(2, "报告请用中文撰写")]


def test_a_drop_whose_kept_twin_is_gone_or_changed_abandons_the_group() -> None:
    """The user deleted, reworded or dismissed the row the drop relied on while the model answered."""
    deleted = [SHOWN[2], SHOWN[3]]
    reworded = [replace(SHOWN[1], content="报告用英文写"), SHOWN[2], SHOWN[3]]
    dismissed = [
        replace(SHOWN[1], status=Status.DISMISSED, dismissed_by=DismissedBy.USER),
        SHOWN[2],
        SHOWN[3],
    ]
    made_manual = [replace(SHOWN[1], source=Source.MANUAL), SHOWN[2], SHOWN[3]]
    for rows in (deleted, reworded, dismissed, made_manual):
        result = decided(KEEP_1_DROP_2, rows)
        assert isinstance(result, Abandon) and result.result is RunResult.ABANDONED_STALE
        assert "[1]" in result.reason


def test_a_drop_relies_on_every_kept_row_since_it_never_names_the_one_it_repeats() -> None:
    result = decided(KEEP_1_DROP_2, [SHOWN[1], SHOWN[2]])  # row 3, kept unmentioned, is gone
    assert isinstance(result, Abandon) and result.result is RunResult.ABANDONED_STALE


def test_a_plan_that_drops_every_row_and_merges_none_abandons_as_invalid() -> None:
    """Each drop says its row repeats another memory, but that memory goes too: no copy would stay."""
    twins = {10: row(10, "喜欢喝绿茶"), 11: row(11, "用户喜欢喝绿茶")}
    both = ConsolidationPlan(drops=[10, 11])
    result = decide(both, USER_GROUP, twins, state(list(twins.values()), both))
    assert isinstance(result, Abandon) and result.result is RunResult.ABANDONED_INVALID
    every = ConsolidationPlan(drops=[1, 2, 3])
    result = decided(every, list(SHOWN.values()))
    assert isinstance(result, Abandon) and result.result is RunResult.ABANDONED_INVALID


def test_a_merge_only_plan_relies_on_its_sources_alone() -> None:
    plan = ConsolidationPlan(merges=[Merge((1, 2), "报告一律用中文写")])
    result = decided(plan, [SHOWN[1], SHOWN[2]])  # row 3 gone: the merge does not depend on it
    digest = dedup_hash(Scope.USER, "", "报告一律用中文写")
    assert result == [
        InsertMerged(USER_GROUP, "报告一律用中文写", digest),
        MergeAway(1, "报告用中文写", "报告一律用中文写"),
        MergeAway(2, "报告请用中文撰写", "报告一律用中文写"),
    ]
    stale = decided(plan, [SHOWN[1], SHOWN[3]])
    assert isinstance(stale, Abandon) and stale.result is RunResult.ABANDONED_STALE


def test_a_touch_is_no_change() -> None:
    touched = replace(SHOWN[1], updated_at=T0 + timedelta(hours=1))
    assert decided(KEEP_1_DROP_2, [touched, SHOWN[2], SHOWN[3]]) == [Drop(2, "报告请用中文撰写")]


def test_a_merge_folds_into_an_active_row_that_already_says_it() -> None:
    manual = row(9, "报告一律用中文写", Source.MANUAL)
    plan = ConsolidationPlan(merges=[Merge((1, 2), "报告一律用中文写")])
    assert decided(plan, [*SHOWN.values(), manual]) == [
        MergeAway(1, "报告用中文写", "报告一律用中文写"),
        MergeAway(2, "报告请用中文撰写", "报告一律用中文写"),
    ]
    into_source = ConsolidationPlan(merges=[Merge((1, 2), "报告\u200b用中文写")])  # row 1's identity
    assert decided(into_source, list(SHOWN.values())) == [
        MergeAway(2, "报告请用中文撰写", "报告\u200b用中文写")
    ]


def test_a_merge_into_a_demoted_row_restores_it_and_into_a_rejected_one_abandons() -> None:
    plan = ConsolidationPlan(merges=[Merge((1, 2), "报告一律用中文写")])
    demoted = row(9, "报告一律用中文写", status=Status.DISMISSED, dismissed_by=DismissedBy.CAPACITY)
    restored = decided(plan, [*SHOWN.values(), demoted])
    assert isinstance(restored, list) and restored[0] == RestoreMerged(9, "报告一律用中文写")
    for rejected in (
        replace(demoted, dismissed_by=DismissedBy.USER),
        replace(demoted, source=Source.MANUAL),
    ):
        result = decided(plan, [*SHOWN.values(), rejected])
        assert isinstance(result, Abandon) and result.result is RunResult.ABANDONED_INVALID


def test_a_merge_that_restates_a_row_another_operation_removes_abandons() -> None:
    plan = ConsolidationPlan(merges=[Merge((1, 2), "周末不开会")], drops=[3])
    result = decided(plan, list(SHOWN.values()))
    assert isinstance(result, Abandon) and result.result is RunResult.ABANDONED_INVALID


def test_two_merges_of_one_text_make_one_row() -> None:
    shown = [*SHOWN.values(), row(4, "周末从不开会")]
    plan = ConsolidationPlan(merges=[Merge((1, 2), "报告用中文"), Merge((3, 4), "报告用中文")])
    ops = decide(plan, USER_GROUP, {r.id: r for r in shown}, state(shown, plan))
    assert isinstance(ops, list) and sum(isinstance(op, InsertMerged) for op in ops) == 1
    assert sorted(op.row_id for op in ops if isinstance(op, MergeAway)) == [1, 2, 3, 4]


# The property: whatever changed while the model answered, an applied plan never leaves a fact that
# was ACTIVE under the lock without an ACTIVE row stating it. Contents say which facts they state
# ("f1+3/x" states facts 1 and 3), and the model is truthful about the rows it was shown: a merge
# states its sources' facts, and a dropped row's fact is stated by a kept row or a merge. Or it drops
# every row, as a model does that takes each of two copies for the other's repeat.

CHANGES = ["same", "touched", "deleted", "reworded", "demoted", "dismissed", "edited"]


def facts(content: str) -> set[str]:
    return set(content.removeprefix("f").split("/")[0].split("+"))


Scenario = tuple[dict[int, MemoryRow], ConsolidationPlan, list[MemoryRow]]


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    """The rows shown, the model's plan, and the user's pool as read under the lock."""
    n = draw(st.integers(2, 7))
    shown = {i: row(i, f"f{draw(st.integers(0, 3))}/{i}") for i in range(1, n + 1)}
    plan = draw(st.one_of(truthful_plans(shown), st.just(ConsolidationPlan(drops=list(shown)))))
    changes = draw(st.lists(st.sampled_from(CHANGES), min_size=n, max_size=n))
    pool = [_changed(r, c) for r, c in zip(shown.values(), changes, strict=True) if c != "deleted"]
    # Rows outside the group's input that a merged text may restate: demoted, rejected or the user's.
    merged_texts = st.sampled_from([m.content for m in plan.merges] or ["f0/9"])
    for content, kind in draw(st.lists(st.tuples(merged_texts, st.sampled_from(CHANGES[4:])), max_size=2)):
        extra = _changed(row(100 + len(pool), content), kind)
        if extra.dedup_hash not in {r.dedup_hash for r in pool}:
            pool.append(extra)
    return shown, plan, pool


@st.composite
def truthful_plans(draw: st.DrawFn, shown: dict[int, MemoryRow]) -> ConsolidationPlan:
    """Up to two merges stating their sources' facts; drops only of facts a kept row or a merge states."""
    roles = dict(
        zip(
            shown,
            draw(
                st.lists(
                    st.sampled_from(["keep", "drop", "m0", "m1"]), min_size=len(shown), max_size=len(shown)
                )
            ),
            strict=True,
        )
    )
    merges = []
    for group in ("m0", "m1"):
        ids = tuple(i for i, r in roles.items() if r == group)
        if len(ids) >= 2:
            stated = sorted(set().union(*(facts(shown[i].content) for i in ids)))
            merges.append(Merge(ids, f"f{'+'.join(stated)}/{draw(st.sampled_from('123m'))}"))
    kept = [
        i
        for i, r in roles.items()
        if r == "keep" or (r != "drop" and not any(i in m.source_ids for m in merges))
    ]
    said = set().union(*(facts(m.content) for m in merges), *(facts(shown[i].content) for i in kept))
    drops = [i for i, r in roles.items() if r == "drop" and facts(shown[i].content) <= said]
    return ConsolidationPlan(merges, drops)


def _changed(r: MemoryRow, change: str) -> MemoryRow:
    if change == "touched":
        return replace(r, updated_at=T0 + timedelta(hours=1))
    if change == "reworded":
        content = f"f{r.id + 10}/r"
        return replace(r, content=content, dedup_hash=dedup_hash(Scope.USER, "", content))
    if change in ("demoted", "dismissed"):
        why = DismissedBy.CAPACITY if change == "demoted" else DismissedBy.USER
        return replace(r, status=Status.DISMISSED, dismissed_by=why)
    if change == "edited":
        return replace(r, source=Source.MANUAL)
    return r


def applied(pool: list[MemoryRow], ops: list[Op]) -> list[MemoryRow]:
    rows = {r.id: r for r in pool}
    for new_id, op in enumerate(ops, start=1000):
        if isinstance(op, InsertMerged):
            assert op.dedup_hash not in {r.dedup_hash for r in rows.values()}  # unique per user
            rows[new_id] = row(new_id, op.content)
        elif isinstance(op, RestoreMerged):
            rows[op.row_id] = replace(rows[op.row_id], status=Status.ACTIVE, dismissed_by=None)
        else:
            assert rows.pop(op.row_id).machine_active  # never a MANUAL or dismissed row
    return list(rows.values())


def active_facts(rows: list[MemoryRow]) -> set[str]:
    return set().union(set(), *(facts(r.content) for r in rows if r.status is Status.ACTIVE))


@pytest.mark.slow  # hundreds of examples: `make test-fast` leaves it out
@settings(max_examples=1000, deadline=None)
@given(scenario=scenarios())
def test_an_applied_plan_never_loses_a_fact_whatever_changed_meanwhile(
    scenario: Scenario,
) -> None:
    shown, plan, pool = scenario
    result = decide(plan, USER_GROUP, shown, state(pool, plan))
    if isinstance(result, Abandon):
        unchanged = all(
            any(p.id == i and p.content == r.content and p.machine_active for p in pool)
            for i, r in shown.items()
        )
        assert not (unchanged and result.result is RunResult.ABANDONED_STALE)  # only a change is stale
        return
    assert active_facts(pool) <= active_facts(applied(pool, result))
