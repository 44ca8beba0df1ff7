"""The per-event failure budget: failures count only while the model answers other calls."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from service.core.failure_budget import FailureBudget


def test_failures_while_other_calls_succeed_use_the_budget() -> None:
    budget = FailureBudget(limit=3, successes_seen=10)
    assert [budget.failed(s) for s in (12, 13, 20)] == [False, False, True]


def test_failures_during_an_outage_never_count() -> None:
    budget = FailureBudget(limit=3, successes_seen=10)
    assert not any(budget.failed(10) for _ in range(1000))
    assert budget.counted == 0


def test_an_outage_in_between_neither_counts_nor_resets_what_was_counted() -> None:
    budget = FailureBudget(limit=2, successes_seen=0)
    assert not budget.failed(1)  # counted: another event was answered meanwhile
    assert not budget.failed(1) and not budget.failed(1)  # the outage: nothing answers
    assert budget.failed(2)


@given(st.lists(st.integers(0, 3), max_size=60), st.integers(1, 5))
def test_the_budget_ends_exactly_at_the_limit_th_failure_that_saw_another_success(
    gains: list[int], limit: int
) -> None:
    budget, successes, counted = FailureBudget(limit, 0), 0, 0
    for gain in gains:
        successes += gain
        counted += gain > 0
        assert budget.failed(successes) is (counted >= limit)
