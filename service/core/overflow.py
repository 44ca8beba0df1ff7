"""Overflow (D14): at the cap, a new ACTIVE row takes the place of its group's least recently
confirmed machine-made row, which is DISMISSED for `CAPACITY` and may come back."""

from __future__ import annotations

from collections.abc import Iterable

from service.core.model import MACHINE_SOURCES, MAX_ACTIVE_PER_USER, DismissedBy, Group, MemoryRow, Source


def has_room(active_count: int) -> bool:
    """The user's ACTIVE rows are below the cap: a row may be added without a demotion."""
    return active_count < MAX_ACTIVE_PER_USER


def oldest_first(machine_active: Iterable[MemoryRow]) -> dict[Group, list[int]]:
    """Each group's machine-made ACTIVE rows by last confirmation, oldest first: D14's order."""
    order: dict[Group, list[int]] = {}
    for row in sorted(machine_active, key=lambda r: (r.updated_at, r.id)):
        order.setdefault(row.group, []).append(row.id)
    return order


def overflow_victim(order: dict[Group, list[int]], group: Group) -> int | None:
    """D14's choice: the group's least recently confirmed machine-made row, or None when the group
    has none left (the candidate is then dropped). A MANUAL row is never in the order, so never chosen."""
    rows = order.get(group, [])
    return rows[0] if rows else None


def demoted_for_room(dismissed_by: DismissedBy | None) -> bool:
    """The row was DISMISSED by D14 to make room, not by its user."""
    return dismissed_by is DismissedBy.CAPACITY


def restorable(source: Source, dismissed_by: DismissedBy | None) -> bool:
    """A capacity-demoted machine row may be restored by the model's restating it (D14); a user's
    dismissal never is (D3), nor a row the user has edited since (its words are theirs)."""
    return demoted_for_room(dismissed_by) and source in MACHINE_SOURCES
