"""A dead letter the DLQ refuses for good becomes a stub, or is counted as lost; the partition moves on.

The size refusal is real: a producer whose `max_request_size` is below the message makes
aiokafka raise the same `MessageSizeTooLargeError` a broker answers when the topic's
`max.message.bytes` is exceeded (Tansu does not enforce that topic setting).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import cast

from aiokafka import ConsumerRecord
from aiokafka.errors import KafkaConnectionError, TopicAuthorizationFailedError

from service.adapters.db.database import Database
from service.adapters.kafka.dead_letters import DeadLetterPublisher, Headers, header
from service.adapters.kafka.replay import Replay, replay_dead_letters
from service.adapters.kafka.topics import ensure_topics
from service.adapters.metrics import Metrics
from service.core.events import decode_event
from service.entrypoints.consumer import EventProcessor, Received
from tests.integration.conftest import HandlerFactory
from tests.integration.test_dlq_replay import read_all
from tests.support.backends import Broker


def poison(topic: str, size: int) -> Received:
    """Undecodable bytes of `size`, as a record at offset 41 of partition 0 with a trace header."""
    value = b"{" + b"x" * (size - 1)
    record = ConsumerRecord(
        topic, 0, 41, 0, 0, b"k-1", value, None, 3, len(value), [("traceparent", b"00-ff")]
    )
    return Received(record, decode_event(value, 1 << 20))


async def test_a_dead_letter_too_large_for_the_dlq_is_published_as_a_stub(
    broker: Broker, mysql_db: Database, make_handler: HandlerFactory
) -> None:
    topic = f"task.finished.{uuid.uuid4().hex[:8]}"
    dlq = f"{topic}.dlq"
    await ensure_topics(broker.bootstrap, [topic, dlq], partitions=1)
    kafka = DeadLetterPublisher(broker.bootstrap, dlq, max_request_size=4096)
    await kafka.start()
    metrics = Metrics()
    processor = EventProcessor(make_handler(mysql_db), kafka, metrics)
    received = poison(topic, 20_000)
    try:
        await processor(received)
    finally:
        await kafka.stop()

    [stub] = await read_all(broker.bootstrap, dlq)
    headers = {k: v.decode() for k, v in stub.headers}
    digest = hashlib.sha256(received.record.value).hexdigest()
    assert json.loads(stub.value) == {"stub": True, "payloadSha256": digest, "payloadBytes": 20_000}
    assert headers["x-dlq-reason"] == "payload_too_large" and headers["x-dlq-stub"] == "1"
    assert headers["x-dlq-original-reason"] == "invalid_json"
    assert "MessageSizeTooLarge" in headers["x-dlq-error"]
    assert (headers["x-original-topic"], headers["x-original-partition"], headers["x-original-offset"]) == (
        topic,
        "0",
        "41",
    )
    assert headers["traceparent"] == "00-ff" and stub.key == b"k-1"
    assert metrics.dead_letters.labels("payload_too_large")._value.get() == 1

    report = await replay_dead_letters(Replay(broker.bootstrap, dlq, topic, "g.dlq-replay"))
    assert (report.read, report.replayed, report.stubs) == (1, 0, 1)
    assert await read_all(broker.bootstrap, topic) == []


class RefusingDeadLetters:
    """A DLQ the service may not write to; transient failures first, as a flapping broker would add."""

    def __init__(self, transient_first: int) -> None:
        self.transient_first = transient_first
        self.attempts: list[Headers] = []

    async def publish(self, value: bytes | None, key: bytes | None, headers: Headers) -> None:
        self.attempts.append(headers)
        if len(self.attempts) <= self.transient_first:
            raise KafkaConnectionError("broker unreachable")
        raise TopicAuthorizationFailedError()


async def test_a_dlq_the_service_may_not_write_loses_the_letter_visibly_and_moves_on(
    mysql_db: Database, make_handler: HandlerFactory
) -> None:
    dead_letters = RefusingDeadLetters(transient_first=2)
    metrics = Metrics()
    processor = EventProcessor(
        make_handler(mysql_db), cast(DeadLetterPublisher, dead_letters), metrics, after_commit=None
    )

    await processor(poison("t", 100))

    # Two transient failures retried, the refusal for good, then the stub and the bare verdict with
    # the coordinates alone, both refused as well.
    reasons = [header(h, "x-dlq-reason") for h in dead_letters.attempts]
    assert reasons == ["invalid_json"] * 3 + ["dlq_refused"] * 2
    assert all(k.startswith(("x-dlq-", "x-original-")) for k, _v in dead_letters.attempts[-1])
    assert metrics.dead_letters_lost._value.get() == 1
    assert metrics.dead_letters.labels("invalid_json")._value.get() == 0
