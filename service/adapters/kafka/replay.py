"""`mao-memory dlq replay`: dead-lettered events back onto the main topic, once the cause is fixed.

The DLQ is read from its beginning to the end offsets seen at the start (a fixed snapshot, no
consumer group, nothing committed). Each selected message goes to the main topic with its key and
headers, minus the dead-letter reason and error, plus `x-replay-count` (`dead_letters.replayed`),
through the consumer's own producer class. A stub (a dead letter the DLQ refused, kept as its
coordinates and a hash) has no payload to replay and is only counted. The ledger still makes a
replayed event that was already applied a duplicate, so replaying twice is harmless. Headers go back
as bytes, in order, null values null; a record without a value is replayed without one.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from service.adapters.kafka import record_reader
from service.adapters.kafka.dead_letters import (
    PLAINTEXT,
    REASON,
    STUB,
    DeadLetterPublisher,
    Headers,
    header,
    replayed,
)
from service.adapters.kafka.security import KafkaSecurity

REPLAY_MAX_REQUEST_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Selection:
    reason: str | None = None
    since: datetime | None = None  # aware; the DLQ message's own timestamp is compared

    def wants(self, headers: Headers, timestamp_ms: int) -> bool:
        if self.reason is not None and header(headers, REASON) != self.reason:
            return False
        return self.since is None or timestamp_ms >= self.since.timestamp() * 1000


@dataclass
class ReplayReport:
    read: int = 0
    replayed: int = 0
    stubs: int = 0  # selected, but only a stub of the payload was kept: found by its coordinates
    by_reason: Counter[str] = field(default_factory=Counter)

    def as_json(self, dry_run: bool) -> str:
        return json.dumps(
            {
                "read": self.read,
                "replayed": self.replayed,
                "stubs": self.stubs,
                "dryRun": dry_run,
                "byReason": dict(self.by_reason),
            }
        )


async def replay_dead_letters(
    bootstrap: str,
    dlq_topic: str,
    topic: str,
    selection: Selection,
    dry_run: bool,
    *,
    security: KafkaSecurity = PLAINTEXT,
    idempotence: bool = False,
) -> ReplayReport:
    report = ReplayReport()
    record_reader.install()
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap.split(","),
        enable_auto_commit=False,
        group_id=None,
        **security.options(),
    )
    # The main topic takes events, not dead letters: Kafka's 1 MiB default request size, as the
    # task service's own producer sends them, not the dead-letter topic's 16 MiB.
    publisher = DeadLetterPublisher(
        bootstrap,
        topic,
        max_request_size=REPLAY_MAX_REQUEST_BYTES,
        security=security,
        idempotence=idempotence,
    )
    await consumer.start()
    await publisher.start()
    try:
        partitions = [
            TopicPartition(dlq_topic, p) for p in sorted(consumer.partitions_for_topic(dlq_topic) or [])
        ]
        if not partitions:
            return report
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        end = await consumer.end_offsets(partitions)
        pending = {tp for tp in partitions if end[tp] > 0}
        widened: set[TopicPartition] = set()
        while pending:
            batch = await consumer.getmany(*pending, timeout_ms=1000)
            for tp in pending - widened:
                # Some brokers (Tansu) answer the latest offset as the last batch's base + 1; the
                # high watermark of the first fetch says where the partition ends.
                high = consumer.highwater(tp)
                if high is not None:
                    end[tp] = max(end[tp], high)
                    widened.add(tp)
            for tp, records in batch.items():
                for record in records:
                    if record.offset < end[tp]:
                        await _replay_one(record, publisher, selection, report, dry_run)
            pending = {tp for tp in pending if await consumer.position(tp) < end[tp]}
    finally:
        await consumer.stop()
        await publisher.stop()
    return report


async def _replay_one(
    record: ConsumerRecord[bytes, bytes],
    publisher: DeadLetterPublisher,
    selection: Selection,
    report: ReplayReport,
    dry_run: bool,
) -> None:
    report.read += 1
    headers = list(record.headers)
    if not selection.wants(headers, record.timestamp):
        return
    if header(headers, STUB):
        report.stubs += 1
        return
    report.by_reason[header(headers, REASON) or ""] += 1
    report.replayed += 1
    if dry_run:
        return
    key, headers = replayed(record.value, record.key, headers)
    await publisher.publish(record.value, key, headers)
