"""How an event ended: the `outcome` label of the events counter."""

from __future__ import annotations

from enum import StrEnum

from service.core.filters import Skip


class Outcome(StrEnum):
    """How an event ended; the values are the `outcome` label of the events counter."""

    SKIPPED_PHASE = Skip.PHASE.value
    SKIPPED_SESSION_TYPE = Skip.SESSION_TYPE.value
    SKIPPED_CAPTURE_OFF = Skip.CAPTURE_OFF.value
    SKIPPED_SHORT = Skip.SHORT.value
    SKIPPED_DUPLICATE_EVENT = "skipped_duplicate_event"
    SKIPPED_BUDGET = "skipped_budget"  # the user's extractions of the last 24 h reached the budget
    EXTRACTED = "extracted"
    FAILED = "failed"
    DEAD_LETTERED = "dead_lettered"


# Looked up, not constructed: `Outcome(skip.value)` costs the skip path an enum call per event.
SKIP_OUTCOMES = {skip: Outcome(skip.value) for skip in Skip}
