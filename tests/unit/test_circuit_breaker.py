"""The circuit breaker on a hand-moved clock: it counts different callers, and only the probe's own
result ends the half-open state."""

from __future__ import annotations

import pytest

from service.adapters.circuit_breaker import BreakerState, CircuitBreaker, Ticket


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def breaker(clock: Clock, threshold: int = 3) -> CircuitBreaker:
    return CircuitBreaker(threshold=threshold, open_s=10, max_open_s=300, monotonic=clock)


async def admitted(breaker: CircuitBreaker) -> Ticket:
    ticket = await breaker.admit(wait=False)
    assert ticket is not None
    return ticket


async def test_one_caller_failing_again_and_again_never_opens_it(clock: Clock) -> None:
    b = breaker(clock)
    for _ in range(50):
        b.failed(await admitted(b), "event-1")
    assert b.state is BreakerState.CLOSED


async def test_different_callers_open_it_and_a_success_between_them_starts_the_count_again(
    clock: Clock,
) -> None:
    b = breaker(clock)
    b.failed(await admitted(b), "a")
    b.failed(await admitted(b), "b")
    b.succeeded(await admitted(b))
    b.failed(await admitted(b), "c")
    b.failed(await admitted(b), "d")
    assert b.state is BreakerState.CLOSED
    b.failed(await admitted(b), "e")
    assert b.state is BreakerState.OPEN
    assert await b.admit(wait=False) is None


async def test_calls_without_a_caller_count_as_different_callers(clock: Clock) -> None:
    b = breaker(clock)
    for _ in range(3):
        b.failed(await admitted(b))
    assert b.state is BreakerState.OPEN


async def test_a_late_failure_of_a_call_admitted_before_it_opened_is_not_the_probes(clock: Clock) -> None:
    """The probe is out when a call admitted before the breaker opened fails at last: the open time
    must not double, the breaker must not re-open, and the probe's success still closes it."""
    b = breaker(clock)
    late = await admitted(b)
    for caller in ("a", "b", "c"):
        b.failed(await admitted(b), caller)
    assert b.state is BreakerState.OPEN

    clock.now += 10
    probe = await admitted(b)
    assert probe.probe and b.state is BreakerState.HALF_OPEN
    b.failed(late, "slow")
    assert b.state is BreakerState.HALF_OPEN
    assert await b.admit(wait=False) is None  # one probe at a time

    b.succeeded(probe)
    assert b.state is BreakerState.CLOSED


async def test_a_late_result_while_open_changes_nothing_and_the_wait_stays_as_it_was(clock: Clock) -> None:
    b = breaker(clock, threshold=1)
    late = await admitted(b)
    b.failed(await admitted(b), "a")
    assert b.state is BreakerState.OPEN
    b.failed(late, "slow")
    b.succeeded(late)
    assert b.state is BreakerState.OPEN

    clock.now += 9.9
    assert await b.admit(wait=False) is None  # still the first 10 s, not restarted nor doubled
    clock.now += 0.1
    probe = await admitted(b)
    b.failed(probe, "p")  # the probe's own failure doubles the wait
    clock.now += 19.9
    assert await b.admit(wait=False) is None
    clock.now += 0.1
    assert (await admitted(b)).probe


async def test_results_from_before_the_last_outage_do_not_count_after_it(clock: Clock) -> None:
    b = breaker(clock, threshold=2)
    stale = [await admitted(b) for _ in range(2)]
    b.failed(await admitted(b), "a")
    b.failed(await admitted(b), "b")
    clock.now += 10
    b.succeeded(await admitted(b))  # the probe closes it
    assert b.state is BreakerState.CLOSED
    b.failed(stale[0], "c")
    b.failed(stale[1], "d")
    assert b.state is BreakerState.CLOSED


async def test_an_abandoned_probe_frees_the_slot_without_a_verdict(clock: Clock) -> None:
    b = breaker(clock, threshold=1)
    b.failed(await admitted(b), "a")
    clock.now += 10
    probe = await admitted(b)
    b.abandoned(probe)
    assert b.state is BreakerState.OPEN
    again = await admitted(b)  # at once: the wait was not restarted
    assert again.probe
    b.succeeded(again)
    assert b.state is BreakerState.CLOSED


def quiet_breaker(clock: Clock, quiet_s: float = 5.0) -> CircuitBreaker:
    return CircuitBreaker(threshold=3, open_s=10, max_open_s=300, monotonic=clock, quiet_s=quiet_s)


async def test_poison_callers_failing_together_while_others_are_answered_never_open_it(clock: Clock) -> None:
    """Six events the model always fails on, their failures in one burst every retry, while other
    calls are answered every second: not an outage."""
    b = quiet_breaker(clock)
    for _ in range(30):
        for caller in range(6):
            b.failed(await admitted(b), f"poison-{caller}")
        clock.now += 1
        b.succeeded(await admitted(b))
    assert b.state is BreakerState.CLOSED


async def test_callers_failing_with_nothing_answered_for_the_quiet_time_open_it(clock: Clock) -> None:
    b = quiet_breaker(clock)
    for caller in "abc":
        b.failed(await admitted(b), caller)
    assert b.state is BreakerState.CLOSED  # three callers, but an answer 0 s ago
    clock.now += 4.9
    b.failed(await admitted(b), "d")
    assert b.state is BreakerState.CLOSED
    clock.now += 0.1
    b.failed(await admitted(b), "e")
    assert b.state is BreakerState.OPEN


async def test_a_late_answer_of_an_old_call_still_counts_as_the_model_answering(clock: Clock) -> None:
    b = quiet_breaker(clock)
    late = await admitted(b)
    clock.now += 20
    b.succeeded(late)
    for caller in "abc":
        b.failed(await admitted(b), caller)
    assert b.state is BreakerState.CLOSED
