"""How often the model may fail one event before the event, not the model, is taken to be the problem.

A failure counts against the event only when it is of the event's own kind (a timeout, 408/409/425,
an unusable answer; never a 429, a 5xx or a lost connection, which say the provider is short of
capacity), when the model answered some other call since the event's previous failure (or since
its first try), and when no other call failed in that time. Then the model is up and this event is
what it cannot answer (a prompt it always times out on, an answer it always breaks). During an
outage, and under saturation, where some calls are answered while others queue into timeouts or
are throttled, other calls fail too: nothing counts, and every event waits for the model instead
of going to the dead-letter topic. Without other traffic an event is retried until some other call
succeeds.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class FailureBudget:
    limit: int
    successes_seen: int  # the model's answered calls when the event started or last failed
    failures_seen: int = 0  # the model's failed calls (every caller's) at that time
    counted: int = 0

    def failed(self, successes_now: int, failures_now: int, outage: bool = False) -> bool:
        """Record one failed call of the event (`failures_now` includes it); True when the event
        has used its budget. `outage`: the failure is of the provider's kind, never counted."""
        alone = failures_now - self.failures_seen <= 1
        if not outage and alone and successes_now > self.successes_seen:
            self.counted += 1
        self.successes_seen, self.failures_seen = successes_now, failures_now
        return self.counted >= self.limit
