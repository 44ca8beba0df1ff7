"""The per-event failure budget: failures of the event's own kind count only while the model answers
other calls and no other call fails."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from service.core.failure_budget import FailureBudget


def test_failures_while_other_calls_succeed_use_the_budget() -> None:
    budget = FailureBudget(limit=3, successes_seen=10, failures_seen=0)
    assert [budget.failed(s, f) for s, f in ((12, 1), (13, 2), (20, 3))] == [False, False, True]


def test_failures_during_an_outage_never_count() -> None:
    budget = FailureBudget(limit=3, successes_seen=10)
    assert not any(budget.failed(10, n) for n in range(1, 1000))
    assert budget.counted == 0


def test_an_outage_in_between_neither_counts_nor_resets_what_was_counted() -> None:
    budget = FailureBudget(limit=2, successes_seen=0)
    assert not budget.failed(1, 1)  # counted: another event was answered meanwhile
    assert not budget.failed(1, 2) and not budget.failed(1, 3)  # the outage: nothing answers
    assert budget.failed(2, 4)


def test_outage_class_failures_never_count_even_while_others_are_answered() -> None:
    budget = FailureBudget(limit=1, successes_seen=0)
    assert not any(budget.failed(n, n, outage=True) for n in range(1, 100))  # 429s, 5xx under load


def test_failures_shared_with_other_callers_do_not_count() -> None:
    # A saturated provider: some calls are answered, others (this one among them) time out.
    budget = FailureBudget(limit=1, successes_seen=0)
    assert not any(budget.failed(2 * n, 3 * n) for n in range(1, 100))
    assert budget.failed(199, 298)  # this window's only failure is the event's own


@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2), st.booleans()), max_size=60), st.integers(1, 5)
)
def test_the_budget_ends_exactly_at_the_limit_th_failure_of_its_own_kind_alone_that_saw_a_success(
    steps: list[tuple[int, int, bool]], limit: int
) -> None:
    budget, successes, failures, counted = FailureBudget(limit, 0), 0, 0, 0
    for gain, others, outage in steps:
        successes += gain
        failures += others + 1
        counted += gain > 0 and others == 0 and not outage
        assert budget.failed(successes, failures, outage) is (counted >= limit)
