"""How often the model may fail one event before the event, not the model, is taken to be the problem.

A failure counts against the event only when it is of the event's own kind (a timeout, 408/409/425,
an unusable answer; never a 429, a 5xx or a lost connection, which say the provider is short of
capacity) and the model was seen answering other calls at the time:
- a timeout counts when a call that started after it was answered before it gave up: it was
  overtaken, so the provider was answering and this prompt was the slow one. A provider that
  queues, as a saturated single-slot server does, answers in order, so a call that times out in
  its queue is never overtaken and never counts;
- any other failure counts when the model answered some call within the last `window_s`.

Nothing compares one event's failures with another's, so any number of poison events failing
together each use their own budget. During an outage nothing is answered, nothing counts, and
every event waits for the model instead of going to the dead-letter topic.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Failure:
    """One failed call of an event, with what the model was seen doing meanwhile."""

    outage: bool  # of the provider's kind (429, 5xx, a lost connection, the breaker open)
    timed_out: bool
    overtaken: bool  # a call that started after this one was answered while it was out
    answered_ago_s: float | None  # since the model last answered any call; None: not yet


def counts_against_event(failure: Failure, window_s: float) -> bool:
    if failure.outage:
        return False
    if failure.timed_out:
        return failure.overtaken
    return failure.answered_ago_s is not None and failure.answered_ago_s <= window_s


@dataclass(slots=True)
class FailureBudget:
    limit: int
    window_s: float
    counted: int = 0

    def failed(self, failure: Failure) -> bool:
        """Record one failed call of the event; True when the event has used its budget."""
        if counts_against_event(failure, self.window_s):
            self.counted += 1
        return self.counted >= self.limit
