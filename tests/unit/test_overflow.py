"""D14's victim choice and the restorable-row rule, without I/O."""

from __future__ import annotations

from datetime import datetime, timedelta

from service.core.model import (
    MAX_ACTIVE_PER_USER,
    USER_GROUP,
    DismissedBy,
    Group,
    MemoryRow,
    Scope,
    Source,
    Status,
)
from service.core.overflow import demoted_for_room, has_room, oldest_first, overflow_victim, restorable

T0 = datetime(2026, 1, 1)
MAO = Group(Scope.PROJECT, "mao")


def _row(id: int, group: Group, minutes: int) -> MemoryRow:
    return MemoryRow(
        id=id,
        scope=group.scope,
        project_key=group.project_key,
        content=f"fact {id}",
        source=Source.AUTO,
        status=Status.ACTIVE,
        dedup_hash=f"h{id}",
        updated_at=T0 + timedelta(minutes=minutes),
    )


def test_the_victim_is_the_groups_least_recently_confirmed_row() -> None:
    order = oldest_first([_row(1, USER_GROUP, 5), _row(2, USER_GROUP, 1), _row(3, MAO, 0), _row(4, MAO, 0)])
    assert order == {USER_GROUP: [2, 1], MAO: [3, 4]}  # ties broken by id
    assert overflow_victim(order, USER_GROUP) == 2
    assert overflow_victim(order, MAO) == 3
    assert overflow_victim(order, Group(Scope.PROJECT, "other")) is None


def test_room_below_the_cap_only() -> None:
    assert has_room(MAX_ACTIVE_PER_USER - 1)
    assert not has_room(MAX_ACTIVE_PER_USER)


def test_only_a_capacity_demoted_machine_row_is_restorable() -> None:
    assert restorable(Source.AUTO, DismissedBy.CAPACITY)
    assert restorable(Source.CONSOLIDATED, DismissedBy.CAPACITY)
    assert not restorable(Source.MANUAL, DismissedBy.CAPACITY)  # edited by its user since
    assert not restorable(Source.AUTO, DismissedBy.USER)
    assert not restorable(Source.AUTO, None)
    assert demoted_for_room(DismissedBy.CAPACITY)
    assert not demoted_for_room(DismissedBy.USER)
