"""The inflated bytes one drain of fetched records may yield, across every partition it drains.

One `getmany` drains the record set of every partition the fetcher holds, so a budget per set would
let the partition count multiply it (16 partitions of small gzip batches gave 128 MiB in one call).
`draining()` opens one `FetchBudget` for one drain (the fetcher's `fetched_records`, which `getmany`
awaits in the caller's task), and every set read during it counts against that budget through a
context variable: another consumer's drain, in another task, has its own. A set read outside any
drain (`getone`) counts against a budget of its own, which bounds it as one drain would.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

# Inflated bytes one drain yields before the rest waits for the next: the size of a fetch of
# uncompressed records (bootstrap.py), so a compressed fetch holds no more than a plain one.
FETCH_INFLATED_BYTES = 8 * 1024 * 1024


class FetchBudget:
    """The inflated bytes one drain may still yield. The first record counted always passes, so
    every drain moves on by at least one record."""

    def __init__(self, limit: int = FETCH_INFLATED_BYTES) -> None:
        self.left = limit
        self.counted = False

    def count(self, record: Any) -> None:
        self.left -= len(record.key or b"") + len(record.value or b"")
        self.left -= sum(len(k) + len(v or b"") for k, v in record.headers)
        self.counted = True

    def exhausted(self) -> bool:
        return self.counted and self.left <= 0


_DRAIN: ContextVar[FetchBudget | None] = ContextVar("fetch_budget", default=None)


@contextmanager
def draining(limit: int = FETCH_INFLATED_BYTES) -> Iterator[FetchBudget]:
    """One budget for every record set read until the block ends."""
    budget = FetchBudget(limit)
    token = _DRAIN.set(budget)
    try:
        yield budget
    finally:
        _DRAIN.reset(token)


def current() -> FetchBudget | None:
    """The budget of the drain under way in this task, if any."""
    return _DRAIN.get()


class SetBudget:
    """One fetched record set's share of the drain reading it."""

    def __init__(self) -> None:
        # The offset the set was fetched from: the fetcher drops the records below it unseen.
        self.fetched_from = 0
        self.spent = False  # the set was cut: it ends, and the fetcher fetches the rest again
        self._own = FetchBudget()  # read outside any drain

    def count(self, record: Any) -> None:
        (current() or self._own).count(record)

    def exhausted(self) -> bool:
        self.spent = self.spent or (current() or self._own).exhausted()
        return self.spent
