"""The one back-off policy of the retry loops: each wait `factor` times the last, from `base` up to
`cap`, optionally spread by `jitter` so that callers failing together do not retry together."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backoff:
    base: float
    factor: float = 2.0
    cap: float = math.inf
    # 0: exact waits; j: each wait times a factor in [1 - j/2, 1 + j/2), drawn by `draw` from [0, 1).
    jitter: float = 0.0

    def delays(self, draw: Callable[[], float] = lambda: 0.5) -> Iterator[float]:
        """The waits before the second try, the third, …, without end: a loop bounds its own tries.
        Grown by multiplying, so an outage waited out for days never overflows."""
        delay = min(self.base, self.cap)
        while True:
            yield delay * (1 + self.jitter * (draw() - 0.5)) if self.jitter else delay
            delay = min(delay * self.factor, self.cap)
