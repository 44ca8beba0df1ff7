"""One circuit breaker for the process's model calls: an outage costs one probe, not one call per event.

Consecutive retryable failures across sessions open it. While it is open no call goes out: callers
that can wait (extractions) wait, the others are told at once (consolidation). After `open_s` one
probe goes through at a time; its success closes the breaker and lets everyone through, its failure
opens it again for twice as long (up to `max_open_s`). The library breakers at hand fail calls
while open instead of holding them, which would turn an outage into lost or dead-lettered events.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from enum import IntEnum


class BreakerState(IntEnum):
    """The gauge's values: 0 closed, 1 half-open (a probe is out), 2 open."""

    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


class CircuitBreaker:
    def __init__(
        self,
        threshold: int,
        open_s: float,
        max_open_s: float,
        on_change: Callable[[BreakerState], None] = lambda _: None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._threshold = threshold
        self._base_open_s = open_s
        self._max_open_s = max_open_s
        self._open_s = open_s
        self._on_change = on_change
        self._monotonic = monotonic
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._opened_at = 0.0
        self._probing = False
        self._changed = asyncio.Condition()

    @property
    def state(self) -> BreakerState:
        return self._state

    async def admit(self, wait: bool = True) -> bool:
        """True when a call may go out now; False (only with `wait=False`) when it may not."""
        while True:
            if self._state is BreakerState.CLOSED:
                return True
            remaining = self._opened_at + self._open_s - self._monotonic()
            if remaining <= 0 and not self._probing:
                self._probing = True
                self._set(BreakerState.HALF_OPEN)
                return True
            if not wait:
                return False
            async with self._changed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), timeout=max(remaining, 0.05))

    def succeeded(self) -> None:
        """The provider answered (an unusable or rejected answer is still an answer)."""
        self._failures = 0
        self._probing = False
        self._open_s = self._base_open_s
        self._set(BreakerState.CLOSED)

    def failed(self) -> None:
        """A retryable failure: a timeout, 429, 5xx or a refused connection."""
        self._failures += 1
        probe_failed = self._probing
        self._probing = False
        if probe_failed:
            self._open_s = min(self._open_s * 2, self._max_open_s)
        if probe_failed or (self._state is BreakerState.CLOSED and self._failures >= self._threshold):
            self._opened_at = self._monotonic()
            self._set(BreakerState.OPEN)

    def abandoned(self) -> None:
        """The call was cancelled before a verdict: free the probe slot, judge nothing."""
        if self._probing:
            self._probing = False
            self._set(BreakerState.OPEN)

    def _set(self, state: BreakerState) -> None:
        if state is self._state:
            return
        self._state = state
        self._on_change(state)
        asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()
