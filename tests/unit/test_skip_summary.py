"""Skipped events are summarised at INFO on a timer, whether or not more events arrive: a skip with
nothing after it is written within the interval, with a count per reason; an interval without skips
writes nothing; the counts pending at shutdown are written as the consumer stops."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any, cast

from structlog.testing import capture_logs

from service.core.outcomes import Outcome
from service.entrypoints.process import Consumption, _consuming
from service.entrypoints.skip_summary import SkipSummary

INTERVAL_S = 0.2


def summaries(logs: list[MutableMapping[str, Any]]) -> list[dict[str, Any]]:
    return [
        {k: v for k, v in e.items() if k.startswith("skipped_")}
        for e in logs
        if e["event"] == "events_skipped"
    ]


async def test_a_skip_with_no_event_after_it_is_written_within_the_interval() -> None:
    skips = SkipSummary()
    await asyncio.sleep(INTERVAL_S * 3)  # built before the service has started
    with capture_logs() as logs:
        timer = asyncio.create_task(skips.every(INTERVAL_S))
        skips.add({Outcome.SKIPPED_CAPTURE_OFF: 2, Outcome.SKIPPED_SHORT: 1})
        await asyncio.sleep(INTERVAL_S * 1.5)
        assert summaries(logs) == [{"skipped_capture_off": 2, "skipped_short": 1}]
        assert (logs[0]["log_level"], logs[0]["seconds"]) == ("info", 0)  # 0.2 s, from the timer's start
        await asyncio.sleep(INTERVAL_S * 2)  # nothing skipped since: nothing written
        assert len(summaries(logs)) == 1
        skips.add({Outcome.SKIPPED_PHASE: 1})
        await asyncio.sleep(INTERVAL_S)
        timer.cancel()
        await asyncio.gather(timer, return_exceptions=True)
    assert summaries(logs) == [{"skipped_capture_off": 2, "skipped_short": 1}, {"skipped_phase": 1}]


async def test_nothing_skipped_writes_nothing_even_at_shutdown() -> None:
    with capture_logs() as logs:
        timer = asyncio.create_task(SkipSummary().every(INTERVAL_S / 4))
        await asyncio.sleep(INTERVAL_S)
        timer.cancel()
        await asyncio.gather(timer, return_exceptions=True)
    assert summaries(logs) == []


class Runner:
    """The consumer's task as the process sees it: runs until stopped, skipping one event on the way."""

    def __init__(self, skips: SkipSummary) -> None:
        self.skips = skips

    async def run(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self.skips.add({Outcome.SKIPPED_CAPTURE_OFF: 1})  # skipped while draining at shutdown


async def test_the_timer_lives_with_the_consumer_and_writes_the_last_counts_at_shutdown() -> None:
    skips = SkipSummary()
    consumption = cast(Consumption, type("C", (), {"runner": Runner(skips), "skips": skips})())
    stop = asyncio.Event()
    with capture_logs() as logs:
        async with _consuming(consumption, stop) as task:
            stop.set()
            await task
            assert summaries(logs) == []  # the interval is a minute: not yet written
        timers = [t for t in asyncio.all_tasks() if "SkipSummary.every" in repr(t.get_coro())]
        assert timers == []  # the timer too has ended
    assert summaries(logs) == [{"skipped_capture_off": 1}]
