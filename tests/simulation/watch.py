"""One user's pool as the checker last saw it, read from the database after every step."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from service.adapters.db.database import Database
from service.adapters.db.tables import memory_history, memory_item
from service.core.clock import Clock
from tests.simulation.checker import (
    Actor,
    Offered,
    Replayed,
    Row,
    Violation,
    check_after_retention,
    check_step,
    fact_key,
    lost_facts,
)

FULL_EVERY = 100


@dataclass
class PoolWatch:
    """A step reads only the rows it could have changed: those written at the clock's current time
    (the simulation moves the clock between steps, never within one) and those its history rows
    name. A full read replaces that every `FULL_EVERY` steps and at the end, so a change that
    bypassed both (no history, no new `updated_at`) is still caught.

    `start` takes the pool as it is before the first step (empty, or as a migration left it): its
    rows are the baseline the history is replayed from, and it must already keep every invariant.
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
    baseline: dict[int, Replayed] = field(default_factory=dict)
    baseline_id: int = 0
    facts_checked: int = 0  # ACTIVE facts that had to be stated still after a consolidation
    facts_lost: int = 0  # of those, stated by no ACTIVE row after it (a violation: the run stops)

    async def start(self) -> None:
        entries, rows = await self._read(full=True)
        self.baseline = {r.id: Replayed.of(r) for r in rows.values()}
        self.baseline_id = max((e["id"] for e in entries), default=0)
        self.history = dict(self.baseline)
        self.last_history_id = self.baseline_id
        problems = check_step("migration", {}, rows, [], set(), self.history)  # no id is new yet
        if problems:
            raise Violation(f"user {self.user_id} at the start: " + "; ".join(problems))
        self.ever_seen |= set(rows)
        self.rows = rows

    async def step(
        self,
        actor: Actor,
        offered: Offered | None = None,
        full: bool = False,
        user_deleted: frozenset[int] = frozenset(),
    ) -> dict[int, Row]:
        """Read the pool, check the step that led to it, and remember it; raises on a broken rule."""
        full = full or self.steps % FULL_EVERY == 0
        self.steps += 1
        entries, found = await self._read(full)
        named = {e["memory_id"] for e in entries}
        after = found if full else {i: r for i, r in self.rows.items() if i not in named} | found
        if actor == "consolidation":
            self.facts_checked += len({fact_key(r) for r in self.rows.values() if r.active})
            self.facts_lost += len(lost_facts(self.rows, after, user_deleted))
        self._check(actor, self.rows, after, entries, offered, user_deleted)
        self.rows = after
        self.touches.update(e["memory_id"] for e in entries if e["action"] == "touch")
        if entries:
            self.last_history_id = entries[-1]["id"]
        return after

    def _check(
        self,
        actor: Actor,
        before: dict[int, Row],
        after: dict[int, Row],
        entries: list[dict[str, Any]],
        offered: Offered | None,
        user_deleted: frozenset[int],
    ) -> None:
        problems = check_step(
            actor, before, after, entries, self.ever_seen, self.history, offered, user_deleted
        )
        if problems:
            raise Violation(f"user {self.user_id} after {actor}: " + "; ".join(problems))
        self.ever_seen |= set(after)

    async def _read(self, full: bool) -> tuple[list[dict[str, Any]], dict[int, Row]]:
        """History rows since the last step, and the rows a step could have changed (or all)."""
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
            query = sa.select(t).where(t.c.user_id == self.user_id)
            if not full:
                named = sorted({e["memory_id"] for e in entries})
                query = query.where(sa.or_(t.c.updated_at >= self.clock.now(), t.c.id.in_(named)))
            found = {
                r.id: Row(
                    r.id, r.scope, r.project_key, r.content, r.source, r.status, r.dismissed_by, r.updated_at
                )
                for r in await uow.conn.execute(query)
            }
        return entries, found

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
        problems = check_after_retention(self.rows, entries, self.touches, self.baseline, self.baseline_id)
        if problems:
            raise Violation(f"user {self.user_id} after retention: " + "; ".join(problems))
