"""Deciding what an extraction writes (seed 5.6 step 5, D3, D13, D14), as a plan over plain data.

The adapter reads a fresh `PoolState` under the user's lock and applies the returned ops in order in
one transaction; every rule lives here so it can be tested without a database.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from service.core.comparison_set import ComparisonSet
from service.core.model import (
    MACHINE_SOURCES,
    USER_GROUP,
    Action,
    Candidate,
    DismissedBy,
    Group,
    MemoryRow,
    Scope,
    Source,
    Status,
    session_groups,
)
from service.core.normalize import dedup_hash
from service.core.overflow import has_room, oldest_first, overflow_victim, restorable


class Result(StrEnum):
    """What became of one candidate; the values are metric labels."""

    INSERTED = "inserted"
    RESTORED = "restored"
    TOUCHED = "touched"
    MATCHED_MANUAL = "matched_manual"
    UPDATED = "updated"
    UPDATE_COLLIDED_TOUCHED = "update_collided_touched"
    DROPPED_INVALID_REF = "dropped_invalid_ref"
    DROPPED_DISMISSED = "dropped_dismissed"
    DROPPED_NO_ROOM = "dropped_no_room"


@dataclass(frozen=True, slots=True)
class Insert:
    group: Group
    content: str
    dedup_hash: str


@dataclass(frozen=True, slots=True)
class Touch:
    row_id: int


@dataclass(frozen=True, slots=True)
class Update:
    row_id: int
    old_content: str
    new_content: str
    new_hash: str


@dataclass(frozen=True, slots=True)
class Demote:
    row_id: int
    content: str


@dataclass(frozen=True, slots=True)
class Restore:
    """A fact demoted for capacity (D14) came back: the row is ACTIVE again."""

    row_id: int
    content: str


Op = Insert | Touch | Update | Demote | Restore


@dataclass(frozen=True, slots=True)
class PoolState:
    """The part of the user's pool `decide` works on, as read under the lock after the model answered.

    `machine_active`: machine-made ACTIVE rows of the USER group and the session's project group
    that the read found (the referenced rows still in place, the victims, the hash matches).
    `by_hash`: every row (any source or status) whose hash some candidate could produce.
    """

    machine_active: dict[int, MemoryRow]
    by_hash: dict[str, MemoryRow]
    active_count: int

    @classmethod
    def of(
        cls, rows: Iterable[MemoryRow], project_key: str | None, hashes: Collection[str], active_count: int
    ) -> PoolState:
        """From the rows a `PoolQuery` read found, and the user's ACTIVE count."""
        groups = session_groups(project_key)
        machine_active = {r.id: r for r in rows if r.machine_active and r.group in groups}
        by_hash = {r.dedup_hash: r for r in rows if r.dedup_hash in hashes}
        return cls(machine_active, by_hash, active_count)


@dataclass(slots=True)
class Plan:
    ops: list[Op] = field(default_factory=list)
    results: list[Result] = field(default_factory=list)
    active_after: int = 0  # the user's ACTIVE rows once the ops are applied

    @property
    def demoted(self) -> int:
        return sum(isinstance(op, Demote) for op in self.ops)

    @property
    def added(self) -> int:
        """Rows this plan makes ACTIVE that were not: the new information D15 waits for."""
        return sum(isinstance(op, Insert | Restore) for op in self.ops)


def candidate_group(candidate: Candidate, project_key: str | None) -> Group:
    """5.6 step 5: a project fact without a valid projectKey is stored as a USER fact."""
    if candidate.type is Scope.PROJECT and project_key:
        return Group(Scope.PROJECT, project_key)
    return USER_GROUP


def candidate_hashes(candidates: list[Candidate], project_key: str | None) -> set[str]:
    """The hashes `PoolState.by_hash` must cover for `decide` to see every collision."""
    return {
        dedup_hash(
            candidate_group(c, project_key).scope, candidate_group(c, project_key).project_key, c.content
        )
        for c in candidates
        if c.content is not None
    }


@dataclass(slots=True)
class _Slot:
    """A row as the plan sees it so far; `row_id` None is a row this plan inserts."""

    row_id: int | None
    status: Status
    group: Group
    source: Source = Source.AUTO
    dismissed_by: DismissedBy | None = None
    content: str = ""


class _Planner:
    def __init__(self, state: PoolState, project_key: str | None) -> None:
        self.project_key = project_key
        self.active = state.active_count
        self.slots: dict[str, _Slot] = {
            h: _Slot(r.id, r.status, r.group, r.source, r.dismissed_by, r.content)
            for h, r in state.by_hash.items()
        }
        self.hash_of: dict[int, str] = {r.id: r.dedup_hash for r in state.machine_active.values()}
        self.content_of: dict[int, str] = {r.id: r.content for r in state.machine_active.values()}
        self.group_of: dict[int, Group] = {r.id: r.group for r in state.machine_active.values()}
        # Oldest first; a touch or update moves a row to the end, a demotion removes it.
        self.recency = oldest_first(state.machine_active.values())
        self.written: set[int] = set()
        self.plan = Plan()

    def run(self, candidates: list[Candidate], existing: ComparisonSet) -> Plan:
        for candidate in candidates:
            group = candidate_group(candidate, self.project_key)
            if candidate.action is Action.INSERT:
                result = self._insert(group, candidate.content or "")
            else:
                row_id = self._resolve(candidate.existing_alias, group, existing)
                if row_id is None:
                    result = Result.DROPPED_INVALID_REF
                elif candidate.action is Action.TOUCH or candidate.content is None:
                    result = self._touch(row_id, Result.TOUCHED)
                else:
                    result = self._update(row_id, group, candidate.content)
            self.plan.results.append(result)
        self.plan.active_after = self.active
        return self.plan

    def _resolve(self, alias: object, group: Group, existing: ComparisonSet) -> int | None:
        """10.1: only an alias of this call, shown in the candidate's group, and its row still
        machine-made, ACTIVE and in that group under the lock."""
        shown = existing.resolve(alias)
        if shown is None or shown[1] != group:
            return None
        return shown[0] if shown[0] in self.recency.get(group, []) else None

    def _touch(self, row_id: int, result: Result) -> Result:
        if row_id not in self.written:
            self.plan.ops.append(Touch(row_id))
            self.written.add(row_id)
        self._freshen(row_id)
        return result

    def _freshen(self, row_id: int) -> None:
        order = self.recency.get(self.group_of.get(row_id, USER_GROUP), [])
        if row_id in order:
            order.remove(row_id)
            order.append(row_id)

    def _update(self, row_id: int, group: Group, content: str) -> Result:
        new_hash = dedup_hash(group.scope, group.project_key, content)
        old_hash = self.hash_of[row_id]
        if new_hash == old_hash or new_hash in self.slots:
            return self._touch(row_id, Result.UPDATE_COLLIDED_TOUCHED)
        self.plan.ops.append(Update(row_id, self.content_of[row_id], content, new_hash))
        self.written.add(row_id)
        slot = self.slots.pop(old_hash, _Slot(row_id, Status.ACTIVE, group))
        slot.content = content
        self.slots[new_hash] = slot
        self.hash_of[row_id] = new_hash
        self.content_of[row_id] = content
        self._freshen(row_id)
        return Result.UPDATED

    def _insert(self, group: Group, content: str) -> Result:
        digest = dedup_hash(group.scope, group.project_key, content)
        slot = self.slots.get(digest)
        if slot is not None:
            return self._exact_hit(slot, digest)
        if not self._make_room(group):
            return Result.DROPPED_NO_ROOM
        self.plan.ops.append(Insert(group, content, digest))
        self.slots[digest] = _Slot(None, Status.ACTIVE, group)
        self.active += 1
        return Result.INSERTED

    def _exact_hit(self, slot: _Slot, digest: str) -> Result:
        """10.1's exact-hash pre-check. ACTIVE is a re-confirmation, but the user's own words stay as
        they are; a user's dismissal is never revived (D3); a capacity demotion (D14) of a row the user
        has not since edited is undone."""
        if slot.status is Status.ACTIVE:
            if slot.row_id is None:
                return Result.TOUCHED
            if slot.source not in MACHINE_SOURCES:
                return Result.MATCHED_MANUAL
            return self._touch(slot.row_id, Result.TOUCHED)
        if not restorable(slot.source, slot.dismissed_by) or slot.row_id is None:
            return Result.DROPPED_DISMISSED
        return self._restore(slot, digest)

    def _restore(self, slot: _Slot, digest: str) -> Result:
        """The restore obeys the cap like an insert: it may demote the group's oldest row, or fail."""
        assert slot.row_id is not None
        if not self._make_room(slot.group):
            return Result.DROPPED_NO_ROOM
        self.plan.ops.append(Restore(slot.row_id, slot.content))
        slot.status, slot.dismissed_by = Status.ACTIVE, None
        self.active += 1
        self.written.add(slot.row_id)
        self.hash_of[slot.row_id] = digest
        self.content_of[slot.row_id] = slot.content
        self.group_of[slot.row_id] = slot.group
        self.recency.setdefault(slot.group, []).append(slot.row_id)
        return Result.RESTORED

    def _make_room(self, group: Group) -> bool:
        return has_room(self.active) or self._demote_for_room(group)

    def _demote_for_room(self, group: Group) -> bool:
        """D14: the overflow victim makes room, DISMISSED for `CAPACITY`; with none, no room."""
        victim = overflow_victim(self.recency, group)
        if victim is None:
            return False
        self.recency[group].remove(victim)
        self.plan.ops.append(Demote(victim, self.content_of[victim]))
        self.slots[self.hash_of[victim]] = _Slot(
            victim,
            Status.DISMISSED,
            group,
            dismissed_by=DismissedBy.CAPACITY,
            content=self.content_of[victim],
        )
        self.active -= 1
        return True


def decide(
    candidates: list[Candidate], existing: ComparisonSet, project_key: str | None, state: PoolState
) -> Plan:
    """Turn the model's candidates into ops that keep D3, D13 and D14 whatever the model said."""
    # Only machine-made ACTIVE rows may be referenced or demoted, whatever the caller put in the state.
    machine = {i: r for i, r in state.machine_active.items() if r.machine_active}
    clean = PoolState(machine_active=machine, by_hash=state.by_hash, active_count=state.active_count)
    return _Planner(clean, project_key).run(candidates, existing)
