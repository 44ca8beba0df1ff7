"""Compressed batches of every codec Kafka defines, from two independent clients, through the running
service: in ONE batch, each valid event is extracted and each poison one dead-lettered with its own
payload; a batch in a codec no client defines is dead-lettered with its raw bytes."""

from __future__ import annotations

import asyncio
import json
import struct
import uuid

import pytest
from aiokafka import AIOKafkaProducer
from confluent_kafka import Producer

from service.adapters.db.database import Database
from tests.conftest import event_payload, eventually, said
from tests.e2e.conftest import Topics, read_topic
from tests.support.backends import Broker
from tests.support.pool import items, set_capture
from tests.support.processes import ServiceProcess
from tests.support.raw_records import raw_batch, send_raw_batch, with_crc
from tests.support.scripted_llm import ScriptedLlm

CODECS = ["gzip", "snappy", "lz4", "zstd"]
VALID, POISON = 4, 3


def batch_of(user_id: int, run: str) -> list[tuple[bytes, bytes, str | None]]:
    """(key, value, marker): valid events, each with a marker the scripted model answers, among poison."""
    records: list[tuple[bytes, bytes, str | None]] = []
    for n in range(VALID):
        marker = f"{run}-{n}"
        event = event_payload(user_id, 9_100 + n, lastUserMessage=said(marker))
        records.append((str(9_100 + n).encode(), json.dumps(event, ensure_ascii=False).encode(), marker))
        if n < POISON:
            records.append((b"poison", f"not json {run}-{n}".encode(), None))
    return records


async def send_with_aiokafka(
    broker: Broker, topic: str, codec: str, records: list[tuple[bytes, bytes, str | None]]
) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, compression_type=codec)
    await producer.start()
    try:
        batch = producer.create_batch()
        for key, value, _marker in records:
            assert batch.append(key=key, value=value, timestamp=None) is not None
        batch.close()
        await (await producer.send_batch(batch, topic, partition=0))
    finally:
        await producer.stop()


def send_with_librdkafka(
    broker: Broker, topic: str, codec: str, records: list[tuple[bytes, bytes, str | None]]
) -> None:
    producer = Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "compression.codec": codec,
            "linger.ms": 2000,  # everything produced below goes out as one batch
            "enable.idempotence": False,
            "api.version.request": True,
        }
    )
    for key, value, _marker in records:
        producer.produce(topic, value=value, key=key, partition=1)
    assert producer.flush(30) == 0


@pytest.mark.parametrize("client", ["aiokafka", "librdkafka"])
@pytest.mark.parametrize("codec", CODECS)
async def test_one_compressed_batch_of_valid_and_poison_events_ends_each_on_its_own(
    service: ServiceProcess,
    broker: Broker,
    topics: Topics,
    mysql_db: Database,
    llm: ScriptedLlm,
    user_id: int,
    codec: str,
    client: str,
) -> None:
    await set_capture(mysql_db, user_id)
    run = f"{codec}-{client}-{uuid.uuid4().hex[:6]}"
    records = batch_of(user_id, run)
    for _key, _value, marker in records:
        if marker is not None:
            llm.script(marker, [{"type": "user", "content": f"事实 {marker}"}])
    if client == "aiokafka":
        await send_with_aiokafka(broker, topics.events, codec, records)
    else:
        await asyncio.to_thread(send_with_librdkafka, broker, topics.events, codec, records)

    rows = await eventually(lambda: items(mysql_db, user_id), lambda r: len(r) == VALID, timeout_s=30)
    assert sorted(r.content for r in rows) == sorted(f"事实 {m}" for _k, _v, m in records if m)
    poison = {v for _k, v, m in records if m is None}
    letters = await eventually(
        lambda: read_topic(broker.bootstrap, topics.dlq),
        lambda found: poison <= {r.value for r in found},
    )
    mine = [r for r in letters if r.value in poison]
    assert sorted(r.value for r in mine) == sorted(poison)  # each once, with its own payload
    assert {dict(r.headers)["x-dlq-reason"] for r in mine} == {b"invalid_json"}
    print(
        f"codec {codec} via {client}: sent {len(records)}, extracted {len(rows)}, dead-lettered {len(mine)}"
    )


async def test_a_batch_whose_compressed_bytes_cannot_be_inflated_is_dead_lettered_with_its_raw_bytes(
    service: ServiceProcess, broker: Broker, topics: Topics
) -> None:
    """Tansu refuses codec bits Kafka does not define (tests/unit covers those) but stores a batch
    whose LZ4 frame is not one, as a corrupted log would serve it."""
    marker = uuid.uuid4().hex.encode()
    header = bytearray(raw_batch([(b"k", b"one", []), (b"k", b"two", [])])[:61])
    data = header + b"not an lz4 frame " + marker
    struct.pack_into(">i", data, 8, len(data) - 12)
    struct.pack_into(">h", data, 21, 0x03)  # lz4
    raw = with_crc(data)
    base = await send_raw_batch(broker.bootstrap, topics.events, 2, raw)
    letters = await eventually(
        lambda: read_topic(broker.bootstrap, topics.dlq),
        lambda found: any(marker in (r.value or b"") for r in found),
    )
    [letter] = [r for r in letters if marker in (r.value or b"")]
    headers = dict(letter.headers)
    assert letter.value[16:] == raw[16:]  # the batch as stored (the broker sets its offset and epoch)
    assert headers["x-dlq-reason"] == b"undecodable_record"
    assert b"lz4 stream unreadable" in headers["x-dlq-error"]
    assert headers["x-original-partition"] == b"2"
    assert headers["x-dlq-offsets"] == f"{base}-{base + 1}".encode()
