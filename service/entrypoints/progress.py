"""Progress lines of the long commands (`dlq replay`, `retention`), on stderr: their stdout carries
one JSON result for scripts, which a progress line would break."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

PROGRESS_EVERY_S = 5.0


class Progress:
    """Writes a line once `every` more items are done, or `every_s` seconds have passed, since the
    last one; silent on a run too short for either."""

    def __init__(
        self,
        write: Callable[[str], None],
        every: int | None = None,
        every_s: float = PROGRESS_EVERY_S,
    ) -> None:
        self._write = write
        self._every = every
        self._every_s = every_s
        self._last_done = 0
        self._last_at = time.monotonic()

    def tick(self, done: int, line: Callable[[], str]) -> None:
        now = time.monotonic()
        counted = self._every is not None and done - self._last_done >= self._every
        if counted or now - self._last_at >= self._every_s:
            self._write(line())
            self._last_done, self._last_at = done, now


def to_stderr(line: str) -> None:
    print(f"mao-memory: {line}", file=sys.stderr, flush=True)
