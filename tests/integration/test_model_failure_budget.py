"""An event the model always fails on goes to the DLQ as `model_failed`; an outage sends nothing there.

The real processor, handler and litellm client against the scripted model: sessions whose prompt
always times out or gets an unusable answer while other sessions are answered, alone or many at
once, or every call fails.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from aiokafka import ConsumerRecord

from service.adapters.circuit_breaker import BreakerState, CircuitBreaker
from service.adapters.db.database import Database
from service.adapters.llm_client import LlmClient
from service.adapters.metrics import Metrics
from service.core.outcomes import Outcome
from service.entrypoints.consumer import EventProcessor, Received, decode_record
from tests.conftest import event_payload, said
from tests.integration.conftest import HandlerFactory
from tests.support.dead_letters import RecordingDeadLetters
from tests.support.pool import ledger, set_capture
from tests.support.scripted_llm import Request, ScriptedLlm


def record(payload: dict[str, Any], offset: int) -> ConsumerRecord[bytes, bytes]:
    raw = json.dumps(payload).encode()
    return ConsumerRecord(
        "t", 0, offset, 0, 0, str(payload["sessionId"]).encode(), raw, None, 1, len(raw), []
    )


def received(record: ConsumerRecord[bytes, bytes]) -> Received:
    return Received(record, decode_record(record))


@pytest.fixture
async def client(llm_server: ScriptedLlm) -> AsyncIterator[tuple[LlmClient, CircuitBreaker]]:
    metrics = Metrics()
    breaker = CircuitBreaker(threshold=3, open_s=0.2, max_open_s=1, quiet_s=1.0)
    llm = LlmClient(
        metrics, llm_server.api_base, "k", timeout_s=0.3, max_retries=1, retry_base_s=0.01, breaker=breaker
    )
    yield llm, breaker
    await llm.stop()


def processor_of(
    db: Database, make_handler: HandlerFactory, llm: LlmClient, dead: RecordingDeadLetters, metrics: Metrics
) -> EventProcessor:
    return EventProcessor(
        make_handler(db, llm=llm),
        dead,  # type: ignore[arg-type]
        metrics,
        model_answered_ago=llm.answered_ago,
        event_failures=3,
    )


async def test_an_event_the_model_always_times_out_on_is_dead_lettered_while_others_go_on(
    mysql_db: Database,
    make_handler: HandlerFactory,
    llm: ScriptedLlm,
    client: tuple[LlmClient, CircuitBreaker],
    user_id: int,
) -> None:
    model, breaker = client
    await set_capture(mysql_db, user_id)
    llm.script(f"slow{user_id}", delay_s=2.0)  # beyond the 0.3 s timeout, every time
    llm.script(f"ok{user_id}", [{"type": "user", "content": "其他会话照常记住"}])
    dead, metrics = RecordingDeadLetters(), Metrics()
    processor = processor_of(mysql_db, make_handler, model, dead, metrics)
    poison = event_payload(user_id, 1, lastUserMessage=said(f"slow{user_id}"))

    async def healthy_stream() -> None:  # other sessions answered for as long as the poison is tried
        for n in range(10_000):
            payload = event_payload(user_id, 100 + n, lastUserMessage=said(f"ok{user_id}"))
            await processor(received(record(payload, 100 + n)))
            await asyncio.sleep(0.05)

    stream = asyncio.create_task(healthy_stream())
    await asyncio.wait_for(processor(received(record(poison, 1))), timeout=60)
    stream.cancel()

    assert dead.reasons() == ["model_failed"]
    [(_value, _key, headers)] = dead.published
    assert dict(headers)["x-dlq-error"] == b"timeout"
    assert len(llm.calls(f"slow{user_id}")) == 3  # three counted failures, no retry within a timeout
    assert metrics.events.labels(Outcome.DEAD_LETTERED.value)._value.get() == 1
    assert await ledger(mysql_db, poison["eventId"]) == []
    assert breaker.state is BreakerState.CLOSED


async def test_during_an_outage_nothing_is_dead_lettered_and_the_breaker_opens(
    mysql_db: Database,
    make_handler: HandlerFactory,
    llm: ScriptedLlm,
    client: tuple[LlmClient, CircuitBreaker],
    user_id: int,
) -> None:
    model, breaker = client
    await set_capture(mysql_db, user_id)
    llm.script(f"down{user_id}", status=503)
    dead, metrics = RecordingDeadLetters(), Metrics()
    processor = processor_of(mysql_db, make_handler, model, dead, metrics)
    events = [event_payload(user_id, n, lastUserMessage=said(f"down{user_id}")) for n in range(1, 5)]

    tasks = [asyncio.create_task(processor(received(record(e, n)))) for n, e in enumerate(events)]
    await asyncio.sleep(4)
    opened = metrics.events.labels(Outcome.DEAD_LETTERED.value)._value.get()
    for task in tasks:
        assert not task.done()  # still waiting for the model
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)

    assert dead.published == [] and opened == 0
    assert breaker.state is not BreakerState.CLOSED


async def test_a_rate_limiting_provider_under_load_dead_letters_nothing(
    mysql_db: Database,
    make_handler: HandlerFactory,
    llm: ScriptedLlm,
    client: tuple[LlmClient, CircuitBreaker],
    user_id: int,
) -> None:
    """429 with Retry-After beyond 10 requests/s while 20 events are in flight: some calls are
    answered, the others throttled; the provider is saturated and no event is at fault."""
    model, _breaker = client
    await set_capture(mysql_db, user_id)
    stamps: list[float] = []

    def over_rate(_request: Request) -> bool:  # called under the server's lock
        now = time.monotonic()
        stamps[:] = [t for t in stamps if now - t < 0.2]
        if len(stamps) >= 2:
            return True
        stamps.append(now)
        return False

    llm.script(f"busy{user_id}", status=429, headers={"Retry-After": "0.1"}, only_if=over_rate)
    llm.script(f"busy{user_id}", [{"type": "user", "content": "限流时照样记住"}])
    dead, metrics = RecordingDeadLetters(), Metrics()
    processor = processor_of(mysql_db, make_handler, model, dead, metrics)
    events = [event_payload(user_id, n, lastUserMessage=said(f"busy{user_id}")) for n in range(1, 21)]

    await asyncio.wait_for(
        asyncio.gather(*(processor(received(record(e, n))) for n, e in enumerate(events))), timeout=60
    )

    assert dead.reasons() == []
    assert metrics.events.labels(Outcome.EXTRACTED.value)._value.get() == 20


async def test_a_single_slot_server_queueing_into_timeouts_dead_letters_nothing(
    mysql_db: Database,
    make_handler: HandlerFactory,
    llm: ScriptedLlm,
    client: tuple[LlmClient, CircuitBreaker],
    user_id: int,
) -> None:
    """A local server answering one request at a time, 0.1 s each, with a 0.3 s timeout and 16
    events in flight: the later ones time out in its queue while the first are answered."""
    model, _breaker = client
    await set_capture(mysql_db, user_id)
    llm.single_slot = True
    llm.script(f"queue{user_id}", [{"type": "user", "content": "排队时照样记住"}], delay_s=0.1)
    dead, metrics = RecordingDeadLetters(), Metrics()
    processor = processor_of(mysql_db, make_handler, model, dead, metrics)
    events = [event_payload(user_id, n, lastUserMessage=said(f"queue{user_id}")) for n in range(1, 17)]

    await asyncio.wait_for(
        asyncio.gather(*(processor(received(record(e, n))) for n, e in enumerate(events))), timeout=90
    )

    assert dead.reasons() == []
    assert metrics.events.labels(Outcome.EXTRACTED.value)._value.get() == 16


async def test_a_revoked_key_holds_events_behind_the_breaker_instead_of_dead_lettering_them(
    mysql_db: Database,
    make_handler: HandlerFactory,
    llm: ScriptedLlm,
    client: tuple[LlmClient, CircuitBreaker],
    user_id: int,
) -> None:
    """401 for every call: the first callers' rejections look like their own and are dead-lettered
    (replayable), then the status is the provider's and every later event waits."""
    model, breaker = client
    await set_capture(mysql_db, user_id)
    llm.script(f"revoked{user_id}", status=401)
    dead, metrics = RecordingDeadLetters(), Metrics()
    processor = processor_of(mysql_db, make_handler, model, dead, metrics)
    events = [event_payload(user_id, n, lastUserMessage=said(f"revoked{user_id}")) for n in range(1, 9)]

    tasks = []
    for n, e in enumerate(events):
        tasks.append(asyncio.create_task(processor(received(record(e, n)))))
        await asyncio.sleep(0.1)  # one after another, as a partition delivers them
    await asyncio.sleep(2)
    waiting = [task for task in tasks if not task.done()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)

    assert dead.reasons() == ["model_rejected"] * (breaker.threshold - 1)
    assert len(waiting) == len(events) - (breaker.threshold - 1)
    assert breaker.state is not BreakerState.CLOSED


NO_CHOICES = b'{"id": "x", "object": "chat.completion", "choices": []}'


@dataclass
class PoisonRun:
    """What happened to poisons published together among healthy traffic."""

    dead: RecordingDeadLetters
    took_s: float  # from their publication until the last one's dead letter
    opened: list[BreakerState]  # the breaker's changes meanwhile
    healthy_s: list[float]  # each healthy event's time through the processor

    def check(self, poisons: int) -> None:
        assert self.dead.reasons() == ["model_failed"] * poisons
        errors = [b"error" if n % 3 == 1 else b"timeout" for n in range(poisons)]
        assert sorted(dict(h)["x-dlq-error"] for _v, _k, h in self.dead.published) == sorted(errors)
        assert self.took_s < 20, self.took_s  # three tries each, 0.5 s and 1 s apart, 0.3 s timeouts
        assert BreakerState.OPEN not in self.opened
        assert len(self.healthy_s) > 10 and max(self.healthy_s) < 1.0, max(self.healthy_s)


async def poisons_among_healthy(
    db: Database,
    make_handler: HandlerFactory,
    llm: ScriptedLlm,
    client: tuple[LlmClient, CircuitBreaker],
    user_id: int,
    poisons: int,
) -> PoisonRun:
    """Poisons published together, a third timing out, a third answered without choices and a third
    answered 408 at once, among a healthy event every 50 ms."""
    model, breaker = client
    opened: list[BreakerState] = []
    breaker._on_change = opened.append
    users = [user_id + 1 + n for n in range(poisons)]
    for user in [user_id, *users]:
        await set_capture(db, user)
    llm.script(f"ok{user_id}", [{"type": "user", "content": "其他会话照常记住"}])
    for n, user in enumerate(users):
        if n % 3 == 1:
            llm.script(f"bad{user}", raw_body=NO_CHOICES)
        elif n % 3 == 2:
            llm.script(f"bad{user}", status=408)  # the provider's own timeout, answered at once
        else:
            llm.script(f"bad{user}", delay_s=2.0)  # beyond the 0.3 s timeout, every time
    dead, metrics = RecordingDeadLetters(), Metrics()
    processor = processor_of(db, make_handler, model, dead, metrics)
    healthy_s: list[float] = []

    async def healthy_stream() -> None:
        for n in range(10_000):
            payload = event_payload(user_id, 100_000 + n, lastUserMessage=said(f"ok{user_id}"))
            started = time.monotonic()
            await processor(received(record(payload, 100_000 + n)))
            healthy_s.append(time.monotonic() - started)
            await asyncio.sleep(0.05)

    stream = asyncio.create_task(healthy_stream())
    await asyncio.sleep(0.2)
    started = time.monotonic()
    events = [event_payload(user, 1, lastUserMessage=said(f"bad{user}")) for user in users]
    await asyncio.wait_for(
        asyncio.gather(*(processor(received(record(e, n))) for n, e in enumerate(events))), timeout=60
    )
    took = time.monotonic() - started
    stream.cancel()
    await asyncio.gather(stream, return_exceptions=True)
    return PoisonRun(dead, took, opened, healthy_s)


@pytest.mark.parametrize("poisons", [2, 6, 50])
async def test_poison_events_failing_together_are_each_dead_lettered_while_healthy_events_flow(
    mysql_db: Database,
    make_handler: HandlerFactory,
    llm: ScriptedLlm,
    client: tuple[LlmClient, CircuitBreaker],
    user_id: int,
    poisons: int,
) -> None:
    """Each poison ends in the DLQ within seconds, the breaker never opens, and no healthy event
    waits behind them."""
    run = await poisons_among_healthy(mysql_db, make_handler, llm, client, user_id, poisons)
    run.check(poisons)
