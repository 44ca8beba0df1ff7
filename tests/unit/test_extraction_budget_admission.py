"""The budget's in-process admission: extractions admitted but not yet in the ledger count, and a
ledger row committed while a read round was under way is counted though the round may not show it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from service.core.budget import ExtractionBudget

USER = 7
NOW = datetime(2030, 1, 1, tzinfo=UTC)


def test_admitted_extractions_count_until_they_finish() -> None:
    budget = ExtractionBudget(2)
    marks = [budget.read_started(USER) for _ in range(3)]
    assert [budget.admit(USER, 0, mark) for mark in marks] == [True, True, False]
    for _ in marks:
        budget.read_ended(USER)
    budget.finish(USER, recorded=False)  # its model call failed: no ledger row, the slot is back
    assert budget.admit(USER, 0, budget.read_started(USER))


def test_a_row_committed_during_a_read_round_counts_though_the_round_missed_it() -> None:
    budget = ExtractionBudget(1)
    assert budget.admit(USER, 0, budget.read_started(USER))
    budget.read_ended(USER)
    late = budget.read_started(USER)  # its count was read before the first one's row was committed
    budget.finish(USER, recorded=True)
    assert not budget.admit(USER, 0, late)
    budget.read_ended(USER)
    assert budget.admit(USER, 0, budget.read_started(USER))  # later rounds read it in the ledger


def test_a_refusal_the_ledger_accounts_for_holds_until_its_oldest_row_is_a_day_old() -> None:
    budget = ExtractionBudget(2)
    oldest = NOW - timedelta(hours=20)
    budget.remember_refusal(USER, 1, oldest, NOW)  # refused for rows still in flight: not kept
    assert not budget.refused(USER, NOW)
    budget.remember_refusal(USER, 2, oldest, NOW)
    assert budget.refused(USER, NOW + timedelta(hours=3, minutes=59))
    assert not budget.refused(USER, NOW + timedelta(hours=4))
