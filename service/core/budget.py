"""The per-user extraction budget (`MEMORY_EXTRACTIONS_PER_USER_PER_DAY`): one scripted or runaway
account can neither run up the model bill nor starve everyone else's share of the rate limit.

The window is the last 24 hours, counted over the ledger (one row per extraction the model answered),
so a restart or another replica sees the same count and there is no midnight burst. Events already
in flight when the count is read may pass it by as many as are in flight: the bound is a budget, not
a lock.
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
