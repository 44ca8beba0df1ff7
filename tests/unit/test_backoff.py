"""The retry loops' one back-off policy, without sleeping."""

from __future__ import annotations

from itertools import islice

from service.core.backoff import Backoff


def test_doubles_up_to_the_cap_and_stays_there() -> None:
    waits = list(islice(Backoff(0.5, cap=30.0).delays(), 9))
    assert waits == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]


def test_without_a_cap_it_keeps_growing() -> None:
    assert list(islice(Backoff(0.5).delays(), 4)) == [0.5, 1.0, 2.0, 4.0]


def test_never_overflows_however_long_the_wait() -> None:
    waits = Backoff(0.5, cap=30.0).delays()
    assert list(islice(waits, 5000))[-1] == 30.0


def test_jitter_spreads_each_wait_around_its_value() -> None:
    draws = iter([0.0, 0.5, 0.999])
    waits = list(islice(Backoff(1.0, jitter=1.0).delays(lambda: next(draws)), 3))
    assert waits[0] == 0.5  # 1 × (1 - 1/2)
    assert waits[1] == 2.0  # 2 × 1
    assert 5.99 < waits[2] < 6.0  # 4 × just under 1.5
