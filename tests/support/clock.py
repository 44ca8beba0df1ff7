"""A clock the test moves by hand, installed in a `Database` so every timestamp it writes follows."""

from __future__ import annotations

from datetime import datetime, timedelta


class ManualClock:
    def __init__(self, start: datetime) -> None:
        self._now = start

    def now(self) -> datetime:
        return self._now

    def advance(self, delta: timedelta) -> datetime:
        self._now += delta
        return self._now
