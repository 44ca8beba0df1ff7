"""Property test of the write decision: whatever the pool and whatever the model says."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.core.comparison_set import build_comparison_set
from service.core.model import (
    MACHINE_SOURCES,
    MAX_ACTIVE_PER_USER,
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
from service.core.persist_plan import Demote, Insert, Plan, PoolState, Restore, Touch, Update, decide

T0 = datetime(2026, 1, 1)
GROUPS = [USER_GROUP, Group(Scope.PROJECT, "mao"), Group(Scope.PROJECT, "other")]
CONTENTS = [f"事实{i}" for i in range(12)]


@st.composite
def pools(draw: st.DrawFn) -> list[MemoryRow]:
    count = draw(st.integers(0, 25))
    rows: dict[str, MemoryRow] = {}
    for i in range(1, count + 1):
        group = draw(st.sampled_from(GROUPS))
        content = draw(st.sampled_from(CONTENTS))
        digest = dedup_hash(group.scope, group.project_key, content)
        rows[digest] = MemoryRow(
            id=i,
            scope=group.scope,
            project_key=group.project_key,
            content=content,
            source=draw(st.sampled_from(list(Source))),
            status=draw(st.sampled_from(list(Status))),
            dedup_hash=digest,
            updated_at=T0 - timedelta(minutes=draw(st.integers(0, 1000))),
        )
        if rows[digest].status is Status.DISMISSED:
            rows[digest] = replace(rows[digest], dismissed_by=draw(st.sampled_from(list(DismissedBy))))
    return list(rows.values())


aliases = st.one_of(
    st.none(), st.integers(-3, 40), st.text(max_size=3), st.booleans(), st.floats(allow_nan=False)
)
candidates = st.builds(
    Candidate,
    type=st.sampled_from(list(Scope)),
    action=st.sampled_from(list(Action)),
    content=st.sampled_from(CONTENTS),
    existing_alias=aliases,
)


@pytest.mark.slow  # hundreds of examples: `make test-fast` leaves it out
@settings(max_examples=400, deadline=None)
@given(
    pool=pools(),
    answer=st.lists(candidates, max_size=3),
    project_key=st.sampled_from([None, "mao"]),
    extra_active=st.sampled_from([0, 170, 190, 200]),
)
def test_no_answer_breaks_the_pool_rules(
    pool: list[MemoryRow], answer: list[Candidate], project_key: str | None, extra_active: int
) -> None:
    active = sum(r.status is Status.ACTIVE for r in pool)
    active_count = max(active, min(extra_active, MAX_ACTIVE_PER_USER))
    existing = build_comparison_set(pool, project_key, [])
    legal = {shown[0] for shown in existing.shown}
    state = PoolState(
        machine_active={r.id: r for r in pool if r.id in legal},
        by_hash={r.dedup_hash: r for r in pool},
        active_count=active_count,
    )
    plan = decide(answer, existing, project_key, state)

    by_id = {r.id: r for r in pool}
    for op in plan.ops:
        if isinstance(op, Update | Demote):
            # Only machine-made ACTIVE rows of the legal groups are ever rewritten or demoted.
            assert op.row_id in legal or restored(plan, op)
        if isinstance(op, Touch):
            assert by_id[op.row_id].machine_active  # never a DISMISSED or MANUAL row
        if isinstance(op, Restore):
            # Only a machine-made row's capacity demotion comes back (one of the pool's, or one this
            # plan made for an earlier insert); a user's dismissal never does.
            demoted_here = any(isinstance(o, Demote) and o.row_id == op.row_id for o in plan.ops)
            assert by_id[op.row_id].dismissed_by is DismissedBy.CAPACITY or demoted_here
            assert by_id[op.row_id].source in MACHINE_SOURCES
    # No MANUAL content ever changes.
    changed = {op.row_id for op in plan.ops if not isinstance(op, Insert)}
    assert all(by_id[i].source in MACHINE_SOURCES for i in changed)
    # The cap: ACTIVE never grows past 200.
    after = active_count + plan.added - plan.demoted
    assert after <= max(active_count, MAX_ACTIVE_PER_USER)
    # Every insert traces to a candidate, with a hash no row of the pool or the plan already has.
    inserted = [op for op in plan.ops if isinstance(op, Insert)]
    contents = {c.content for c in answer}
    assert all(op.content in contents for op in inserted)
    final = {r.id: r.dedup_hash for r in pool}
    for op in plan.ops:
        if isinstance(op, Update):
            final[op.row_id] = op.new_hash
    final_hashes = list(final.values()) + [op.dedup_hash for op in inserted]
    assert len(set(final_hashes)) == len(final_hashes)  # uk_memory_dedup can never be violated
    assert len(plan.results) == len(answer)


def restored(plan: Plan, op: Update | Demote) -> bool:
    """A row restored earlier in the plan is ACTIVE again, so a later insert may demote it."""
    return isinstance(op, Demote) and Restore(op.row_id, op.content) in plan.ops
