"""What the retention job removes from a user's history, decided on rows already read.

A touch records only that an event saw a fact again. A run of consecutive touches of one memory by
one conversation (no other action between them, one session, one model) says no more than its first
row plus how many and until when, so the run is folded into its first row: `repeat_count` the sum,
`last_at` the latest time. The fold forgets the later touches' event ids and the times between the
first and the last; a touch by another session or model starts a new run, so the history still
names every conversation and model that confirmed the fact. Every other action stays as it is. The
history of a memory that no longer exists (deleted by its user, merged away) is removed once its
last row is older than the horizon.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from service.core.records import HistoryAction


@dataclass(frozen=True, slots=True)
class HistoryRow:
    id: int
    memory_id: int
    action: str
    created_at: datetime
    repeat_count: int = 1
    last_at: datetime | None = None
    actor: str = "auto"
    session_id: int | None = None
    model: str | None = None

    @property
    def latest(self) -> datetime:
        return self.last_at or self.created_at

    @property
    def trace(self) -> tuple[str, int | None, str | None]:
        """What the history API shows of who made the row; a fold keeps only its keeper's."""
        return self.actor, self.session_id, self.model


@dataclass(frozen=True, slots=True)
class Fold:
    """Set the keeper's count to `count` (if it is still `keeper_count`), then delete `absorbed`."""

    keeper: int
    keeper_count: int
    count: int
    last_at: datetime
    absorbed: tuple[int, ...]


@dataclass(slots=True)
class OpenRun:
    """A run of touches that may continue on the next page of rows."""

    memory_id: int
    keeper: HistoryRow
    count: int
    last_at: datetime
    absorbed: list[int] = field(default_factory=list)

    def takes(self, row: HistoryRow) -> bool:
        """A touch of the same memory by the same session and model continues the run."""
        return (
            row.memory_id == self.memory_id
            and row.action == HistoryAction.TOUCH
            and row.trace == self.keeper.trace
        )

    def close(self) -> Fold | None:
        if not self.absorbed:
            return None
        return Fold(self.keeper.id, self.keeper.repeat_count, self.count, self.last_at, tuple(self.absorbed))


def fold_touches(rows: Sequence[HistoryRow], carry: OpenRun | None) -> tuple[list[Fold], OpenRun | None]:
    """`rows` ordered by (memory_id, id), continuing where `carry` (the previous page's open run) ended.

    Returns the folds of every run that ended on this page and the run still open at its end.
    """
    folds: list[Fold] = []
    run = carry
    for row in rows:
        if run is not None and run.takes(row):
            run.count += row.repeat_count
            run.last_at = max(run.last_at, row.latest)
            run.absorbed.append(row.id)
            continue
        if run is not None and (fold := run.close()) is not None:
            folds.append(fold)
        run = (
            OpenRun(row.memory_id, row, row.repeat_count, row.latest)
            if row.action == HistoryAction.TOUCH
            else None
        )
    return folds, run


def expired_memories(last_seen: dict[int, datetime], existing: Iterable[int], cutoff: datetime) -> list[int]:
    """Memories gone from `memory_item` whose latest history row is older than `cutoff`."""
    alive = set(existing)
    return sorted(m for m, latest in last_seen.items() if m not in alive and latest < cutoff)
