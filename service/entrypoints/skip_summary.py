"""The INFO summary of skipped events: counts per reason, written on a timer.

The skip path is too hot for a line per event (DEBUG has one), and capture being off is the first thing
a newcomer meets, so the counts are written every `SKIP_SUMMARY_S` by a task of the consumer's
lifetime: a skip with no event after it is still reported within the interval, and the counts left at
shutdown are written as the task ends. An interval without skips writes nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Mapping

import structlog

from service.core.outcomes import Outcome

log = structlog.get_logger(__name__)

SKIP_SUMMARY_S = 60.0


class SkipSummary:
    def __init__(self) -> None:
        self._counts: Counter[Outcome] = Counter()
        self._since = time.monotonic()

    def add(self, counts: Mapping[Outcome, int]) -> None:
        self._counts.update(counts)

    def flush(self) -> None:
        """One `events_skipped` line with the counts since the last flush, if there are any."""
        now = time.monotonic()
        if self._counts:
            counts = {outcome.value: n for outcome, n in self._counts.items() if n}
            log.info("events_skipped", seconds=round(now - self._since), **counts)
            self._counts.clear()
        self._since = now

    async def every(self, interval_s: float = SKIP_SUMMARY_S) -> None:
        """Flush every `interval_s` until cancelled, and once more then."""
        self._since = time.monotonic()  # `seconds` counts from here: the service's start-up is not in it
        try:
            while True:
                await asyncio.sleep(interval_s)
                self.flush()
        finally:
            self.flush()
