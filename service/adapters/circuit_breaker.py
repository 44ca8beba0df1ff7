"""One circuit breaker for the process's model calls: an outage costs one probe, not one call per event.

It opens when `threshold` different callers (events, consolidation runs) have failed with no success
in between, and nothing was answered for `quiet_s` either: a real outage fails every caller and
answers none, while events the model always fails on stay a handful of callers, however often they
are retried and however closely their failures fall together, as long as other calls are answered.
While it is open no call goes out: callers that can wait (extractions) wait, the others are told at
once (consolidation). After `open_s` one probe goes
through; its success closes the breaker, its failure opens it again for twice as long (up to
`max_open_s`).

Every admitted call holds a ticket naming the period it was admitted in. Only results of the
current period count: a call admitted before the breaker opened that fails late is not taken for
the probe's failure, and only the probe's own result ends the half-open state. The library breakers
at hand fail calls while open instead of holding them, which would turn an outage into lost or
dead-lettered events.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from enum import IntEnum


class BreakerState(IntEnum):
    """The gauge's values: 0 closed, 1 half-open (a probe is out), 2 open."""

    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


@dataclass(frozen=True, slots=True, eq=False)
class Ticket:
    """One admitted call; compared by identity."""

    period: int
    probe: bool


class CircuitBreaker:
    def __init__(
        self,
        threshold: int,
        open_s: float,
        max_open_s: float,
        on_change: Callable[[BreakerState], None] = lambda _: None,
        monotonic: Callable[[], float] = time.monotonic,
        quiet_s: float = 0.0,
    ) -> None:
        self._threshold = threshold
        self._base_open_s = open_s
        self._max_open_s = max_open_s
        self._open_s = open_s
        self._on_change = on_change
        self._monotonic = monotonic
        self._state = BreakerState.CLOSED
        self._period = 0  # advances whenever the breaker opens or closes
        self._failing: set[Hashable] = set()  # callers failed since the last success
        self._opened_at = 0.0
        self._quiet_s = quiet_s
        self._answered_at = monotonic()  # the last success of any call (start-up counts as one)
        self._probe: Ticket | None = None
        self._changed = asyncio.Condition()

    @property
    def state(self) -> BreakerState:
        return self._state

    @property
    def threshold(self) -> int:
        """How many different callers failing, with no success between, make an outage."""
        return self._threshold

    async def admit(self, wait: bool = True) -> Ticket | None:
        """A ticket when a call may go out now; None (only with `wait=False`) when it may not."""
        while True:
            if self._state is BreakerState.CLOSED:
                return Ticket(self._period, probe=False)
            remaining = self._opened_at + self._open_s - self._monotonic()
            if remaining <= 0 and self._probe is None:
                self._probe = Ticket(self._period, probe=True)
                self._set(BreakerState.HALF_OPEN)
                return self._probe
            if not wait:
                return None
            async with self._changed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), timeout=max(remaining, 0.05))

    def succeeded(self, ticket: Ticket) -> None:
        """The provider answered (a rejected answer is still an answer)."""
        self._answered_at = self._monotonic()
        if ticket is self._probe:
            self._probe = None
            self._open_s = self._base_open_s
            self._close()
        elif self._current(ticket):
            self._failing.clear()

    def failed(self, ticket: Ticket, caller: Hashable | None = None) -> None:
        """A failure that is not a rejection. `caller` names who made the call (None: a caller of
        its own); only different callers add up to an outage."""
        if ticket is self._probe:
            self._probe = None
            self._open_s = min(self._open_s * 2, self._max_open_s)
            self._open()
        elif self._current(ticket):
            self._failing.add(object() if caller is None else caller)
            quiet = self._monotonic() - self._answered_at >= self._quiet_s
            if len(self._failing) >= self._threshold and quiet:
                self._open()

    def abandoned(self, ticket: Ticket) -> None:
        """The call was cancelled before a verdict: free the probe slot, judge nothing."""
        if ticket is self._probe:
            self._probe = None
            self._set(BreakerState.OPEN)

    def _current(self, ticket: Ticket) -> bool:
        return self._state is BreakerState.CLOSED and ticket.period == self._period

    def _open(self) -> None:
        self._period += 1
        self._failing.clear()
        self._opened_at = self._monotonic()
        self._set(BreakerState.OPEN)

    def _close(self) -> None:
        self._period += 1
        self._failing.clear()
        self._set(BreakerState.CLOSED)

    def _set(self, state: BreakerState) -> None:
        if state is self._state:
            return
        self._state = state
        self._on_change(state)
        asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()
