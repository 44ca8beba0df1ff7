"""The pool's invariants, checked after every step of the simulation.

`check_step` is pure: the rows before and after one step, the history rows the step appended, who
acted, and what the model offered. `PoolWatch` reads those from the database for one user.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal

import sqlalchemy as sa

from service.adapters.db.database import Database
from service.adapters.db.tables import memory_history, memory_item
from service.core.clock import Clock
from service.core.extraction_answer import ParsedAnswer, parse_extraction_answer
from service.core.model import MACHINE_SOURCES, MAX_ACTIVE_PER_USER, Action, Group, Scope, Source
from service.core.normalize import identity
from service.core.persist_plan import candidate_group

Actor = Literal["user", "extraction", "consolidation"]


@dataclass(frozen=True)
class Row:
    id: int
    scope: str
    project_key: str
    content: str
    source: str
    status: str
    dismissed_by: str | None
    updated_at: datetime

    @property
    def group(self) -> Group:
        return Group(Scope(self.scope), self.project_key)

    @property
    def machine(self) -> bool:
        return Source(self.source) in MACHINE_SOURCES

    @property
    def active(self) -> bool:
        return self.status == "ACTIVE"


@dataclass(frozen=True)
class Replayed:
    """A memory as its history alone describes it."""

    content: str = ""
    status: str = "ACTIVE"
    source: str = "AUTO"
    dismissed_by: str | None = None
    updated_at: datetime | None = None
    deleted: bool = False

    def matches(self, row: Row) -> bool:
        return (self.content, self.status, self.source, self.dismissed_by, self.updated_at, self.deleted) == (
            row.content,
            row.status,
            row.source,
            row.dismissed_by,
            row.updated_at,
            False,
        )


@dataclass(frozen=True)
class Offered:
    """What the model answered to an extraction, and the session's valid project key."""

    answer: str
    project_key: str | None


class Violation(AssertionError):
    pass


def replay(state: Replayed | None, entry: dict[str, Any]) -> Replayed:
    """One history row applied to what the memory's earlier history built."""
    current = state or Replayed()
    at = entry["created_at"]
    action, old, new = entry["action"], entry["old_content"], entry["new_content"]
    if action in {"delete", "drop"} or (action == "merge" and old is not None):
        return replace(current, deleted=True)
    if action in {"insert", "create"} or (action == "merge" and old is None):
        source = {"insert": "AUTO", "create": "MANUAL", "merge": "CONSOLIDATED"}[action]
        return Replayed(new, "ACTIVE", source, None, at)
    if action == "touch":  # a row retention folded stands for a run that ended at `last_at`
        return replace(current, updated_at=entry.get("last_at") or at)
    if action in {"update", "edit"}:
        return replace(
            current, content=new, updated_at=at, source="MANUAL" if action == "edit" else current.source
        )
    if action in {"dismiss", "demote"}:
        reason = "USER" if action == "dismiss" else "CAPACITY"
        return replace(current, status="DISMISSED", dismissed_by=reason, updated_at=at)
    if action == "restore":
        restored = replace(current, status="ACTIVE", dismissed_by=None, updated_at=at)
        return replace(restored, content=new, source="MANUAL") if new is not None else restored
    raise Violation(f"history action {action!r} cannot be replayed")


@functools.lru_cache(maxsize=65_536)
def _identity(content: str) -> str:
    return identity(content)


def identity_key(row: Row) -> tuple[str, str, str]:
    return row.scope, row.project_key, _identity(row.content)


def check_step(
    actor: Actor,
    before: dict[int, Row],
    after: dict[int, Row],
    entries: list[dict[str, Any]],
    ever_seen: set[int],
    history: dict[int, Replayed],
    offered: Offered | None = None,
) -> list[str]:
    """Every rule the pool must keep across one step; an empty list means it kept them all."""
    problems: list[str] = []
    active = [r for r in after.values() if r.active]
    if len(active) > MAX_ACTIVE_PER_USER:
        problems.append(f"{len(active)} ACTIVE rows, over {MAX_ACTIVE_PER_USER}")
    twins = [k for k, n in Counter(identity_key(r) for r in active).items() if n > 1]
    if twins:
        problems.append(f"two ACTIVE rows of one group with the same identity: {twins}")
    reused = sorted((set(after) - set(before)) & ever_seen)
    if reused:
        problems.append(f"ids reused: {reused}")
    by_memory: dict[int, list[dict[str, Any]]] = {}
    for entry in entries:
        by_memory.setdefault(entry["memory_id"], []).append(entry)
    problems += _vanished(actor, before, after, by_memory)
    if actor != "user":
        problems += _machine_rules(before, after)
    if offered is not None:
        problems += _no_freeze(before, after, offered)
    for entry in entries:
        history[entry["memory_id"]] = replay(history.get(entry["memory_id"]), entry)
    for row in after.values():
        if row.id not in history or not history[row.id].matches(row):
            problems.append(f"history of {row.id} replays to {history.get(row.id)}, the row is {row}")
    ghosts = [i for i, h in history.items() if not h.deleted and i not in after]
    if ghosts:
        problems.append(f"rows {ghosts} gone without a history row saying so")
    return problems


def _vanished(
    actor: Actor, before: dict[int, Row], after: dict[int, Row], by_memory: dict[int, list[dict[str, Any]]]
) -> list[str]:
    """No ACTIVE row is deleted except by the user, a validated merge or a drop."""
    allowed = {"user": {("delete", "user")}, "extraction": set(), "consolidation": set()}[actor]
    allowed |= {("merge", "consolidator"), ("drop", "consolidator")} if actor == "consolidation" else set()
    problems = []
    for row_id in set(before) - set(after):
        said = {(e["action"], e["actor"]) for e in by_memory.get(row_id, [])}
        if not said & allowed:
            problems.append(f"row {row_id} deleted by {actor} with history {said or 'none'}")
    return problems


def _machine_rules(before: dict[int, Row], after: dict[int, Row]) -> list[str]:
    problems = []
    for row in before.values():
        now = after.get(row.id)
        if row.source == "MANUAL" and now is not None and now != row:
            problems.append(f"MANUAL row {row.id} changed by the machine: {row} -> {now}")
        if row.dismissed_by == "USER" and now is not None and now != row:
            problems.append(f"user-dismissed row {row.id} changed by the machine: {row} -> {now}")
        if now is None:
            continue
        if row.active and not now.active and (now.dismissed_by != "CAPACITY" or not row.machine):
            problems.append(f"row {row.id} dismissed by the machine other than by a D14 demotion: {now}")
        if not row.active and now.active and (row.dismissed_by != "CAPACITY" or not row.machine):
            problems.append(f"row {row.id} revived by the machine though not demoted for room: {row}")
    made_manual = [
        r.id for r in after.values() if r.source == "MANUAL" and before.get(r.id, r).source != "MANUAL"
    ]
    new_manual = [r.id for r in after.values() if r.source == "MANUAL" and r.id not in before]
    if made_manual or new_manual:
        problems.append(f"MANUAL rows made by the machine: {made_manual + new_manual}")
    return problems


def _no_freeze(before: dict[int, Row], after: dict[int, Row], offered: Offered) -> list[str]:
    """A new fact offered while its group holds a machine-made ACTIVE row always gets in (D14)."""
    parsed = parse_extraction_answer(offered.answer)
    if not isinstance(parsed, ParsedAnswer):
        return []
    problems = []
    seen_groups: set[Group] = set()
    added = 0
    active = sum(r.active for r in before.values())
    for candidate in parsed.candidates:
        if candidate.action is not Action.INSERT or candidate.content is None:
            continue
        group = candidate_group(candidate, offered.project_key)
        key = (group.scope.value, group.project_key, _identity(candidate.content))
        known = [r for r in before.values() if identity_key(r) == key]
        if known and (known[0].active or known[0].dismissed_by != "CAPACITY" or not known[0].machine):
            continue  # a re-confirmation, or a fact the user owns or rejected
        if group in seen_groups:
            continue
        seen_groups.add(group)
        room = active + added < MAX_ACTIVE_PER_USER or any(
            r.active and r.machine and r.group == group for r in before.values()
        )
        added += 1
        if room and not any(r.active and identity_key(r) == key for r in after.values()):
            problems.append(f"new fact {candidate.content!r} offered with room in {group} did not get in")
    return problems


@dataclass
class PoolWatch:
    """One user's pool as the checker last saw it.

    A step reads only the rows it could have changed: those written at the clock's current time
    (the simulation moves the clock between steps, never within one) and those its history rows
    name. A full read replaces that every `FULL_EVERY` steps and at the end, so a change that
    bypassed both (no history, no new `updated_at`) is still caught.
    """

    db: Database
    user_id: int
    ever_seen: set[int]
    clock: Clock
    rows: dict[int, Row] = field(default_factory=dict)
    history: dict[int, Replayed] = field(default_factory=dict)
    touches: Counter[int] = field(default_factory=Counter)
    last_history_id: int = 0
    steps: int = 0

    async def step(self, actor: Actor, offered: Offered | None = None, full: bool = False) -> dict[int, Row]:
        """Read the pool, check the step that led to it, and remember it; raises on a broken rule."""
        full = full or self.steps % FULL_EVERY == 0
        self.steps += 1
        h, t = memory_history, memory_item
        async with self.db.read() as uow:
            entries = [
                dict(r._mapping)
                for r in await uow.conn.execute(
                    sa.select(h)
                    .where(h.c.user_id == self.user_id, h.c.id > self.last_history_id)
                    .order_by(h.c.id)
                )
            ]
            named = sorted({e["memory_id"] for e in entries})
            query = sa.select(t).where(t.c.user_id == self.user_id)
            if not full:
                query = query.where(sa.or_(t.c.updated_at >= self.clock.now(), t.c.id.in_(named)))
            found = {
                r.id: Row(
                    r.id, r.scope, r.project_key, r.content, r.source, r.status, r.dismissed_by, r.updated_at
                )
                for r in await uow.conn.execute(query)
            }
        after = found if full else {i: r for i, r in self.rows.items() if i not in named} | found
        problems = check_step(actor, self.rows, after, entries, self.ever_seen, self.history, offered)
        if problems:
            raise Violation(f"user {self.user_id} after {actor}: " + "; ".join(problems))
        self.ever_seen |= set(after)
        self.rows = after
        self.touches.update(e["memory_id"] for e in entries if e["action"] == "touch")
        if entries:
            self.last_history_id = entries[-1]["id"]
        return after

    async def after_retention(self) -> None:
        """Re-read the whole pool and history after a retention run; raises on a broken rule."""
        h = memory_history
        async with self.db.read() as uow:
            entries = [
                dict(r._mapping)
                for r in await uow.conn.execute(
                    sa.select(h).where(h.c.user_id == self.user_id).order_by(h.c.id)
                )
            ]
        problems = check_after_retention(self.rows, entries, self.touches)
        if problems:
            raise Violation(f"user {self.user_id} after retention: " + "; ".join(problems))


def check_after_retention(
    rows: dict[int, Row], entries: list[dict[str, Any]], touches_seen: Counter[int]
) -> list[str]:
    """Retention folded touch runs and removed old trails: the history left, replayed from nothing,
    must still give every row exactly, and each memory's touches must still add up."""
    replayed: dict[int, Replayed] = {}
    folded: Counter[int] = Counter()
    for entry in entries:
        replayed[entry["memory_id"]] = replay(replayed.get(entry["memory_id"]), entry)
        if entry["action"] == "touch":
            folded[entry["memory_id"]] += entry["repeat_count"]
    problems = [
        f"after retention the history of {row.id} replays to {replayed.get(row.id)}, the row is {row}"
        for row in rows.values()
        if row.id not in replayed or not replayed[row.id].matches(row)
    ]
    problems += [
        f"after retention {folded[m]} touches of {m} are left of {touches_seen[m]}"
        for m in rows
        if folded[m] != touches_seen[m]
    ]
    return problems


FULL_EVERY = 100
