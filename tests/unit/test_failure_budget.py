"""The per-event failure budget: a failure of the event's own kind counts while the model is seen
answering other calls, whatever other events do."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from service.core.failure_budget import Failure, FailureBudget, counts_against_event

WINDOW = 60.0


def error(answered_ago_s: float | None = 1.0) -> Failure:
    return Failure(outage=False, timed_out=False, overtaken=False, answered_ago_s=answered_ago_s)


def timeout(overtaken: bool) -> Failure:
    return Failure(outage=False, timed_out=True, overtaken=overtaken, answered_ago_s=0.1)


def test_failures_while_the_model_answers_use_the_budget() -> None:
    budget = FailureBudget(limit=3, window_s=WINDOW)
    assert [budget.failed(error()) for _ in range(3)] == [False, False, True]


def test_failures_with_no_answer_in_the_window_never_count() -> None:
    budget = FailureBudget(limit=1, window_s=WINDOW)
    assert not any(budget.failed(error(ago)) for ago in (None, 60.5, 3600.0))
    assert budget.counted == 0


def test_an_outage_in_between_neither_counts_nor_resets_what_was_counted() -> None:
    budget = FailureBudget(limit=2, window_s=WINDOW)
    assert not budget.failed(error(1.0))
    assert not budget.failed(error(None)) and not budget.failed(error(90.0))
    assert budget.failed(error(2.0))


def test_outage_class_failures_never_count_even_while_others_are_answered() -> None:
    outage = Failure(outage=True, timed_out=False, overtaken=True, answered_ago_s=0.0)
    budget = FailureBudget(limit=1, window_s=WINDOW)
    assert not any(budget.failed(outage) for _ in range(100))


def test_a_timeout_counts_only_when_a_later_call_was_answered_first() -> None:
    """A queue that answers in order never overtakes: a saturated server's timeouts never count."""
    budget = FailureBudget(limit=2, window_s=WINDOW)
    assert not any(budget.failed(timeout(overtaken=False)) for _ in range(50))
    assert not budget.failed(timeout(overtaken=True))
    assert budget.failed(timeout(overtaken=True))


failures = st.builds(
    Failure,
    outage=st.booleans(),
    timed_out=st.booleans(),
    overtaken=st.booleans(),
    answered_ago_s=st.none() | st.floats(0, 200, allow_nan=False),
)


@given(st.lists(failures, max_size=60), st.integers(1, 5))
def test_the_budget_ends_at_the_limit_th_failure_that_counts(steps: list[Failure], limit: int) -> None:
    budget, counted = FailureBudget(limit, WINDOW), 0
    for failure in steps:
        own = not failure.outage and (
            failure.overtaken
            if failure.timed_out
            else failure.answered_ago_s is not None and failure.answered_ago_s <= WINDOW
        )
        counted += own
        assert counts_against_event(failure, WINDOW) is own
        assert budget.failed(failure) is (counted >= limit)
