"""How often the model may fail one event before the event, not the model, is taken to be the problem.

A failure counts against the event only when the model answered some other call since the event's
previous failure (or since its first try): then the model is up and this event is what it cannot
answer (a prompt it always times out on, an answer it always breaks). During an outage nothing
answers, nothing counts, and every event waits for the model instead of going to the dead-letter
topic. Without other traffic an event is therefore retried until some other call succeeds.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class FailureBudget:
    limit: int
    successes_seen: int  # the model's answered calls when the event started or last failed
    counted: int = 0

    def failed(self, successes_now: int) -> bool:
        """Record one failed call of the event; True when the event has used its budget."""
        if successes_now > self.successes_seen:
            self.counted += 1
        self.successes_seen = successes_now
        return self.counted >= self.limit
