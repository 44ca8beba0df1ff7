"""The narrowed pool read loses nothing `decide` needs: over the rows a `PoolQuery` fetches, every
answer gets the plan it got over the whole pool."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.core.comparison_set import build_comparison_set
from service.core.model import (
    MAX_ACTIVE_PER_USER,
    USER_GROUP,
    Action,
    Candidate,
    Group,
    MemoryRow,
    Scope,
    Source,
    Status,
)
from service.core.normalize import dedup_hash
from service.core.persist_plan import Demote, PoolState, decide
from service.core.pool_read import PoolQuery, pool_query
from tests.unit.test_persist_plan_properties import candidates, pools

MAO = Group(Scope.PROJECT, "mao")


def fetched(pool: list[MemoryRow], query: PoolQuery) -> list[MemoryRow]:
    """What the pool read returns, as its SQL selects it."""
    rows = {r.id: r for r in pool if r.id in query.references or r.dedup_hash in query.hashes}
    for group, limit in query.victims.items():
        oldest = sorted(
            (r for r in pool if r.machine_active and r.group == group), key=lambda r: (r.updated_at, r.id)
        )
        rows.update({r.id: r for r in oldest[:limit]})
    return list(rows.values())


@pytest.mark.slow  # hundreds of examples: `make test-fast` leaves it out
@settings(max_examples=500, deadline=None)
@given(
    pool=pools(),
    answer=st.lists(candidates, max_size=3),
    project_key=st.sampled_from([None, "mao"]),
    extra_active=st.sampled_from([0, 190, 199, 200]),
)
def test_the_narrowed_read_plans_as_the_whole_pool_did(
    pool: list[MemoryRow], answer: list[Candidate], project_key: str | None, extra_active: int
) -> None:
    active = sum(r.status is Status.ACTIVE for r in pool)
    active_count = max(active, min(extra_active, MAX_ACTIVE_PER_USER))
    existing = build_comparison_set(pool, project_key, [])
    query = pool_query(answer, existing, project_key)

    whole = PoolState.of(pool, project_key, query.hashes, active_count)
    narrowed = PoolState.of(fetched(pool, query), project_key, query.hashes, active_count)

    assert decide(answer, existing, project_key, narrowed) == decide(answer, existing, project_key, whole)


def test_a_touched_oldest_row_is_not_the_victim_of_the_insert_after_it() -> None:
    """The read holds one more old row for each candidate, not only for each insert: the touch moves
    the oldest row to the newest end, and the insert then demotes the next one."""
    pool = [row(i, f"事实{i}", age=100 - i) for i in (1, 2, 3)]
    existing = build_comparison_set(pool, None, [])
    answer = [
        Candidate(Scope.USER, Action.TOUCH, None, existing_alias=1),
        Candidate(Scope.USER, Action.INSERT, "新"),
    ]
    query = pool_query(answer, existing, None)

    plan = decide(answer, existing, None, PoolState.of(fetched(pool, query), None, query.hashes, 200))

    assert [op for op in plan.ops if isinstance(op, Demote)] == [Demote(2, "事实2")]


def row(row_id: int, content: str, group: Group = USER_GROUP, age: int = 0) -> MemoryRow:
    digest = dedup_hash(group.scope, group.project_key, content)
    when = datetime(2027, 1, 1) - timedelta(minutes=age)
    return MemoryRow(
        row_id, group.scope, group.project_key, content, Source.AUTO, Status.ACTIVE, digest, when
    )


def test_the_query_names_referenced_rows_candidate_hashes_and_victims_per_group() -> None:
    rows = [row(10, "用户事实"), row(20, "项目事实", MAO)]
    existing = build_comparison_set(rows, "mao", [])
    answer = [
        Candidate(Scope.USER, Action.TOUCH, None, existing_alias=1),
        Candidate(Scope.PROJECT, Action.UPDATE, "项目事实更完整", existing_alias=2),
        Candidate(Scope.PROJECT, Action.INSERT, "新项目事实"),
        Candidate(Scope.USER, Action.TOUCH, None, existing_alias=99),  # not shown: nothing to read
    ]

    query = pool_query(answer, existing, "mao")

    assert query.references == {10, 20}
    assert query.hashes == {dedup_hash(Scope.PROJECT, "mao", c) for c in ("项目事实更完整", "新项目事实")}
    assert query.victims == {USER_GROUP: 2, MAO: 2}
    assert pool_query(answer, existing, None).victims == {USER_GROUP: 4}  # no project: all USER facts
