"""The consumer as the service runs it (runner, processor, handler, dead-letter producer) on a topic of
its own, with a ledger of how each record ended, for tests that throw arbitrary records at it."""

from __future__ import annotations

import asyncio
import uuid
from collections import defaultdict
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition

from service.adapters.kafka.dead_letters import DeadLetterPublisher
from service.adapters.kafka.record_format import STUB_OFFSETS
from service.adapters.kafka.runner import KeyOrderedRunner
from service.adapters.kafka.topics import ensure_topics
from service.adapters.metrics import Metrics
from service.app.extraction import ExtractionHandler
from service.entrypoints.consumer import EventProcessor, Received

Record = ConsumerRecord[bytes, bytes]
Coordinates = tuple[int, int]  # (partition, offset)


@dataclass
class Endings:
    """Each record's end as the runner saw it, and the order of ends per (partition, key)."""

    ended: dict[Coordinates, int] = field(default_factory=lambda: defaultdict(int))
    order: dict[tuple[int, bytes | None], list[int]] = field(default_factory=lambda: defaultdict(list))
    covered: dict[int, set[int]] = field(default_factory=lambda: defaultdict(set))  # a stub's whole range

    def end(self, record: Record) -> None:
        self.ended[(record.partition, record.offset)] += 1
        self.order[(record.partition, record.key)].append(record.offset)
        span = dict(record.headers).get(STUB_OFFSETS)
        first = int(span.split(b"-")[0]) if span else record.offset
        self.covered[record.partition].update(range(first, record.offset + 1))


class Recording:
    """The service's processor, unchanged, with each record's end written down."""

    def __init__(self, processor: EventProcessor, endings: Endings) -> None:
        self._processor = processor
        self._endings = endings

    async def prepare(self, records: list[Record]) -> list[Received]:
        return await self._processor.prepare(records)

    def taken(self, finished: list[Received]) -> None:
        self._processor.taken(finished)
        for item in finished:
            self._endings.end(item.record)

    async def __call__(self, item: Received) -> None:
        await self._processor(item)
        self._endings.end(item.record)

    async def crashed(self, item: Received, error: BaseException) -> None:
        await self._processor.crashed(item, error)
        self._endings.end(item.record)


class RecordPipeline:
    def __init__(self, bootstrap: str, handler: ExtractionHandler, metrics: Metrics, partitions: int = 3):
        suffix = uuid.uuid4().hex[:8]
        self.bootstrap, self.metrics, self.partitions = bootstrap, metrics, partitions
        self.topic, self.dlq = f"fuzz.{suffix}", f"fuzz.{suffix}.dlq"
        self.endings = Endings()
        self._handler = handler
        self._stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self._dead_letters = DeadLetterPublisher(bootstrap, self.dlq)
        self._dlq_reader = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)

    def dead_letter_limit(self, max_request_size: int) -> None:
        """A dead-letter topic that takes messages up to this size (before `start`)."""
        self._dead_letters = DeadLetterPublisher(self.bootstrap, self.dlq, max_request_size)

    async def start(self) -> None:
        await ensure_topics(self.bootstrap, [self.topic, self.dlq], self.partitions)
        await self._dead_letters.start()
        processor = EventProcessor(self._handler, self._dead_letters, self.metrics, after_commit=None)
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=f"fuzz-{self.topic}",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=6000,
            heartbeat_interval_ms=1000,
        )
        runner = KeyOrderedRunner(
            consumer, self.topic, Recording(processor, self.endings), self.metrics, 64, grace_s=5
        )
        self.task = asyncio.create_task(runner.run(self._stop))
        await self._dlq_reader.start()
        dlq_partitions = [TopicPartition(self.dlq, p) for p in range(self.partitions)]
        self._dlq_reader.assign(dlq_partitions)
        await self._dlq_reader.seek_to_beginning(*dlq_partitions)

    async def stop(self) -> None:
        self._stop.set()
        if self.task is not None:
            await asyncio.wait_for(self.task, 30)
        await self._dlq_reader.stop()
        await self._dead_letters.stop()

    def committed(self, partition: int) -> float:
        return float(self.metrics.committed_offset.labels(str(partition))._value.get())

    async def settled(self, ends: dict[int, int], timeout_s: float = 30.0) -> bool:
        """Every partition's committed offset reached `ends` (partition → next offset) in time."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while asyncio.get_running_loop().time() < deadline:
            if all(self.committed(p) >= end for p, end in ends.items()):
                return True
            assert self.task is not None and not self.task.done(), "the consumer stopped"
            await asyncio.sleep(0.05)
        return False

    async def dead_letters(self, at_least: int = 0, timeout_s: float = 15.0) -> list[Record]:
        """The dead letters published since the last call: at least `at_least` of them (the broker may
        show a just-acknowledged message a fetch late), then up to the topic's end (the high
        watermark, which Tansu's ListOffsets may understate)."""
        partitions = list(self._dlq_reader.assignment())
        end = await self._dlq_reader.end_offsets(partitions)
        deadline = asyncio.get_running_loop().time() + timeout_s
        found: list[Record] = []
        while asyncio.get_running_loop().time() < deadline:
            batch = await self._dlq_reader.getmany(timeout_ms=500)
            found += [r for records in batch.values() for r in records]
            for tp in partitions:
                end[tp] = max(end[tp], self._dlq_reader.highwater(tp) or 0)
            behind = [tp for tp in partitions if await self._dlq_reader.position(tp) < end[tp]]
            if not batch and not behind and len(found) >= at_least:
                return found
        return found


async def produce(
    bootstrap: str,
    topic: str,
    records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int | None]],
) -> list[Coordinates]:
    """Each record's (partition, offset), in the order given. aiokafka's producer refuses a record
    with neither key nor value, so such a record is sent with an empty key."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, enable_idempotence=False, max_request_size=4 * 1024 * 1024
    )
    await producer.start()
    try:
        sent = [
            await producer.send(
                topic,
                value,
                key=b"" if key is None and value is None else key,
                headers=headers,
                timestamp_ms=timestamp,
            )
            for key, value, headers, timestamp in records
        ]
        metadata = await asyncio.gather(*sent)
    finally:
        await producer.stop()
    return [(m.partition, m.offset) for m in metadata]
