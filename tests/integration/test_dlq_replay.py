"""A request the model rejects goes to the DLQ with the provider's message; once the setting is fixed,
`dlq replay` brings it back and it is extracted exactly once. Real Tansu, real litellm path."""

from __future__ import annotations

import dataclasses
import json
import uuid
from datetime import UTC, datetime, timedelta

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition

from service.adapters.db.database import Database
from service.adapters.kafka.dead_letters import DeadLetterPublisher
from service.adapters.kafka.replay import Replay, Selection, replay_dead_letters
from service.adapters.kafka.topics import ensure_topics
from service.adapters.metrics import Metrics
from service.core.events import decode_event
from service.core.outcomes import Outcome
from service.entrypoints.consumer import EventProcessor, Received
from tests.conftest import event_payload, said
from tests.integration.conftest import HandlerFactory
from tests.support.backends import Broker
from tests.support.pool import items, ledger, set_capture
from tests.support.scripted_llm import ScriptedLlm


async def read_all(bootstrap: str, topic: str) -> list[ConsumerRecord[bytes, bytes]]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        records: list[ConsumerRecord[bytes, bytes]] = []
        while len(records) < end:
            records += (await consumer.getmany(tp, timeout_ms=1000)).get(tp, [])
        return records
    finally:
        await consumer.stop()


async def test_a_rejected_event_is_dead_lettered_then_replayed_and_extracted_once(
    broker: Broker, mysql_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int
) -> None:
    topic = f"task.finished.{uuid.uuid4().hex[:8]}"
    dlq = f"{topic}.dlq"
    await ensure_topics(broker.bootstrap, [topic, dlq], partitions=1)
    await set_capture(mysql_db, user_id)
    payload = event_payload(user_id, 7, lastUserMessage=said(f"m{user_id}"))
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, enable_idempotence=False)
    await producer.start()
    await producer.send_and_wait(
        topic, json.dumps(payload).encode(), key=b"7", headers=[("traceparent", b"00-ab")]
    )
    await producer.stop()
    kafka = DeadLetterPublisher(broker.bootstrap, dlq)
    await kafka.start()
    processor = EventProcessor(make_handler(mysql_db), kafka, Metrics())

    async def process(record: ConsumerRecord[bytes, bytes]) -> None:
        await processor(Received(record, decode_event(record.value, 1 << 20)))

    try:
        llm.script(f"m{user_id}", status=400, times=2)  # a model name the provider does not know
        [original] = await read_all(broker.bootstrap, topic)
        await process(original)

        [dead] = await read_all(broker.bootstrap, dlq)
        headers = {k: v.decode() for k, v in dead.headers}
        assert headers["x-dlq-reason"] == "model_rejected" and "HTTP 400" in headers["x-dlq-error"]
        assert headers["traceparent"] == "00-ab" and dead.key == b"7"
        assert await ledger(mysql_db, payload["eventId"]) == []

        since = datetime.now(UTC) - timedelta(minutes=5)
        group = f"g-{uuid.uuid4().hex[:8]}.dlq-replay"
        replay = Replay(broker.bootstrap, dlq, topic, group, Selection("model_rejected", since), dry_run=True)
        dry = await replay_dead_letters(replay)
        assert (dry.read, dry.replayed) == (1, 1) and len(await read_all(broker.bootstrap, topic)) == 1
        other = await replay_dead_letters(
            Replay(broker.bootstrap, dlq, topic, f"{group}.schema", Selection("schema"))
        )
        assert other.replayed == 0

        llm.script(f"m{user_id}", [{"type": "user", "content": "修好设置之后记住的事实"}])  # fixed
        replay = Replay(broker.bootstrap, dlq, topic, group, Selection("model_rejected"))
        assert (await replay_dead_letters(replay)).replayed == 1
        assert (await replay_dead_letters(replay)).replayed == 0  # each letter once
        again = await replay_dead_letters(dataclasses.replace(replay, from_beginning=True))
        assert again.replayed == 1  # replaying twice on purpose is harmless
        _, first, second = await read_all(broker.bootstrap, topic)
        replayed = {k: v.decode() for k, v in first.headers}
        assert first.key == b"7" and first.value == original.value
        assert replayed["traceparent"] == "00-ab" and replayed["x-replay-count"] == "1"
        assert not {"x-dlq-reason", "x-dlq-error"} & set(replayed) and replayed["x-original-topic"] == topic
        await process(first)
        await process(second)
    finally:
        await kafka.stop()

    assert [i.content for i in await items(mysql_db, user_id)] == ["修好设置之后记住的事实"]
    assert [r["outcome"] for r in await ledger(mysql_db, payload["eventId"])] == [Outcome.EXTRACTED.value]
