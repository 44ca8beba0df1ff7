"""The per-user extraction budget (`MEMORY_EXTRACTIONS_PER_USER_PER_DAY`): one scripted or runaway
account can neither run up the model bill nor starve everyone else's share of the rate limit.

The window is the last 24 hours, counted over the ledger (one row per extraction the model answered),
so a restart or another replica sees the same count and there is no midnight burst. Within a
process, the extractions admitted but not yet in the ledger count too (`admit` reserves one, `finish`
gives it back once its ledger row is committed or it failed): the read round runs before an event
waits for a model slot, so a count read alone would let every queued event pass a spent budget.
Replicas see each other's extractions only through the ledger, so together they may pass it by as
many as are in flight elsewhere. Those two in-process counts are an upper bound: a row committed
during the round may be in its count too, and an extraction in flight may fail. A refusal they
alone make is therefore no verdict: the caller waits for one to finish and counts again, and only
a refusal the ledger's count makes skips the event.
"""

from __future__ import annotations

from datetime import datetime, timedelta

WINDOW = timedelta(hours=24)
# Users remembered as told about at once; beyond it, the ones told about over a window ago are let go.
_REMEMBERED = 10_000


class ExtractionBudget:
    def __init__(self, per_day: int) -> None:
        self.per_day = per_day
        self._told: dict[int, datetime] = {}
        self._running: dict[int, int] = {}  # admitted, ledger row not yet committed
        self._reading: dict[int, int] = {}  # read rounds under way
        self._recorded: dict[int, int] = {}  # ledger rows committed while a read round was under way
        self._refused_until: dict[int, datetime] = {}

    def refused(self, user_id: int, now: datetime) -> bool:
        """Whether a refusal seen in the ledger still holds: the user's events are then skipped
        without the read round's cost."""
        until = self._refused_until.get(user_id)
        if until is None:
            return False
        if now < until:
            return True
        del self._refused_until[user_id]
        return False

    def remember_refusal(self, user_id: int, recent: int, oldest: datetime | None, now: datetime) -> None:
        """After a refusal the ledger alone accounts for (`recent` rows, the oldest at `oldest`), no
        extraction fits before the oldest leaves the window; a refusal owed to extractions still in
        flight is not remembered, as they may fail and never reach the ledger."""
        if oldest is None or self.allows(recent):
            return
        if len(self._refused_until) >= _REMEMBERED:
            self._refused_until = {u: at for u, at in self._refused_until.items() if now < at}
        self._refused_until[user_id] = oldest + WINDOW

    def read_started(self, user_id: int) -> int:
        """Before the read round: a mark for `admit`, which then counts the ledger rows committed
        during the round, which the round's count may or may not hold (counted twice at worst)."""
        self._reading[user_id] = self._reading.get(user_id, 0) + 1
        return self._recorded.get(user_id, 0)

    def read_ended(self, user_id: int) -> None:
        left = self._reading[user_id] - 1
        if left:
            self._reading[user_id] = left
        else:
            del self._reading[user_id]
            self._recorded.pop(user_id, None)

    def admit(self, user_id: int, recent: int, mark: int) -> bool:
        """Reserve one extraction if it fits: the round's ledger count, the admitted ones still
        running and the ones recorded since `mark` (from `read_started`)."""
        running = self._running.get(user_id, 0)
        if not self.allows(recent + running + self._recorded.get(user_id, 0) - mark):
            return False
        self._running[user_id] = running + 1
        return True

    def running(self, user_id: int) -> int:
        """The user's admitted extractions not yet finished."""
        return self._running.get(user_id, 0)

    def finish(self, user_id: int, recorded: bool) -> None:
        """An admitted extraction is over; `recorded`: its ledger row is committed."""
        left = self._running[user_id] - 1
        if left:
            self._running[user_id] = left
        else:
            del self._running[user_id]
        if recorded and user_id in self._reading:
            self._recorded[user_id] = self._recorded.get(user_id, 0) + 1

    @staticmethod
    def window_start(now: datetime) -> datetime:
        return now - WINDOW

    def allows(self, recent: int) -> bool:
        """Whether one more extraction fits, given the user's extractions in the window."""
        return recent < self.per_day

    def first_refusal(self, user_id: int, now: datetime) -> bool:
        """True for the first refusal of a user in a window: the one that is logged."""
        told = self._told.get(user_id)
        if told is not None and now - told < WINDOW:
            return False
        if len(self._told) >= _REMEMBERED:
            self._told = {u: at for u, at in self._told.items() if now - at < WINDOW}
        self._told[user_id] = now
        return True
