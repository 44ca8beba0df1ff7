"""The key-ordered runner on Tansu: per-key order, commits never past unfinished work, restart safety."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import defaultdict
from typing import NamedTuple

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition

from service.adapters.kafka.runner import KeyOrderedRunner
from service.adapters.kafka.topics import ensure_topics
from service.adapters.metrics import Metrics
from tests.support.backends import Broker

KEYS, PER_KEY = 40, 10
Record = ConsumerRecord[bytes, bytes]


async def produce(bootstrap: str, topic: str) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for seq in range(PER_KEY):
            await asyncio.gather(
                *(
                    producer.send(topic, f"{k}:{seq}".encode(), key=f"session-{k}".encode())
                    for k in range(KEYS)
                )
            )
        await producer.flush()
    finally:
        await producer.stop()


class Slow(NamedTuple):
    """A record whose processing always needs I/O."""

    record: Record
    fast: None = None


class Recorder:
    """Processes records with random delays (an LLM answering in random order) and audits commits."""

    def __init__(self, consumer: AIOKafkaConsumer, crash_after: int | None = None) -> None:
        self.seen: dict[str, list[int]] = defaultdict(list)
        self.started: dict[TopicPartition, set[int]] = defaultdict(set)
        self.finished: dict[TopicPartition, set[int]] = defaultdict(set)
        self.violations: list[str] = []
        self.crash_after = crash_after
        self.stop = asyncio.Event()
        original = consumer.commit

        async def audited_commit(offsets: dict[TopicPartition, object]) -> None:
            for tp, meta in offsets.items():
                upto = meta.offset  # type: ignore[attr-defined]
                unfinished = {o for o in self.started[tp] if o < upto} - self.finished[tp]
                if unfinished:
                    self.violations.append(f"{tp} committed {upto} past unfinished {sorted(unfinished)}")
            await original(offsets)

        consumer.commit = audited_commit  # type: ignore[method-assign]

    async def prepare(self, records: list[Record]) -> list[Slow]:
        return [Slow(record) for record in records]

    def taken(self, finished: list[Slow]) -> None:
        assert finished == []  # nothing here is finished without I/O

    async def __call__(self, item: Slow) -> None:
        record = item.record
        tp = TopicPartition(record.topic, record.partition)
        self.started[tp].add(record.offset)
        key, seq = record.value.decode().split(":")
        await asyncio.sleep(random.uniform(0, 0.03))
        self.seen[key].append(int(seq))
        self.finished[tp].add(record.offset)
        if self.crash_after is not None and sum(map(len, self.seen.values())) >= self.crash_after:
            self.stop.set()


def consumer_for(bootstrap: str, group: str) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=6000,
        heartbeat_interval_ms=1000,
    )


async def run_until(recorder: Recorder, runner: KeyOrderedRunner, total: int, timeout_s: float = 30) -> None:
    task = asyncio.create_task(runner.run(recorder.stop))
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not recorder.stop.is_set() and sum(map(len, recorder.seen.values())) < total:
        if asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.05)
    recorder.stop.set()
    await task


async def test_keys_stay_in_order_and_commits_never_pass_unfinished_records(broker: Broker) -> None:
    topic, group = f"order-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    await ensure_topics(broker.bootstrap, [topic], partitions=4)
    await produce(broker.bootstrap, topic)
    consumer = consumer_for(broker.bootstrap, group)
    recorder = Recorder(consumer)
    runner = KeyOrderedRunner(
        consumer, topic, recorder, Metrics(), max_buffered=16, grace_s=5, commit_interval_s=0.01
    )

    await run_until(recorder, runner, KEYS * PER_KEY)

    assert recorder.violations == []
    assert {k: v for k, v in recorder.seen.items()} == {str(k): list(range(PER_KEY)) for k in range(KEYS)}


async def test_a_stop_midway_loses_nothing_and_a_restart_resumes_from_the_commit(broker: Broker) -> None:
    topic, group = f"order-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    await ensure_topics(broker.bootstrap, [topic], partitions=4)
    await produce(broker.bootstrap, topic)

    first_consumer = consumer_for(broker.bootstrap, group)
    first = Recorder(first_consumer, crash_after=KEYS * PER_KEY // 3)
    await run_until(
        first, KeyOrderedRunner(first_consumer, topic, first, Metrics(), 16, 0.0, 0.01), KEYS * PER_KEY
    )
    second_consumer = consumer_for(broker.bootstrap, group)
    second = Recorder(second_consumer)
    processed_first = sum(map(len, first.seen.values()))
    await run_until(
        second,
        KeyOrderedRunner(second_consumer, topic, second, Metrics(), 16, 5, 0.01),
        KEYS * PER_KEY - processed_first,
    )

    assert first.violations == [] and second.violations == []
    for k in range(KEYS):
        a, b = first.seen.get(str(k), []), second.seen.get(str(k), [])
        # Whatever the first run finished but had not committed comes again; nothing is skipped.
        assert sorted(set(a) | set(b)) == list(range(PER_KEY)), (k, a, b)
        assert b == sorted(b) and a == sorted(a)
        assert not b or b[0] <= (a[-1] + 1 if a else 0)


async def test_one_key_on_two_partitions_commits_each_partition_past_its_own_records(
    broker: Broker,
) -> None:
    """After the topic grows, a session's older records sit on one partition and its newer on another."""
    topic, group = f"order-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    await ensure_topics(broker.bootstrap, [topic], partitions=2)
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
    await producer.start()
    try:
        for seq in range(PER_KEY):
            for k in range(4):
                # Each key's first half on partition 0, its second half on partition 1.
                partition = 0 if seq < PER_KEY // 2 else 1
                await producer.send(topic, f"{k}:{seq}".encode(), key=f"s-{k}".encode(), partition=partition)
        await producer.flush()
    finally:
        await producer.stop()
    consumer = consumer_for(broker.bootstrap, group)
    recorder = Recorder(consumer)
    runner = KeyOrderedRunner(consumer, topic, recorder, Metrics(), 64, 5, commit_interval_s=0.01)

    await run_until(recorder, runner, 4 * PER_KEY)

    assert recorder.violations == []
    for k in range(4):
        seen = recorder.seen[str(k)]
        # Kafka orders a key within a partition; each half keeps its order.
        assert [s for s in seen if s < PER_KEY // 2] == list(range(PER_KEY // 2))
        assert [s for s in seen if s >= PER_KEY // 2] == list(range(PER_KEY // 2, PER_KEY))
    check = consumer_for(broker.bootstrap, group)
    await check.start()
    try:
        committed = {p: await check.committed(TopicPartition(topic, p)) for p in (0, 1)}
    finally:
        await check.stop()
    assert committed == {0: 4 * PER_KEY // 2, 1: 4 * PER_KEY // 2}


class BatchRecorder(Recorder):
    def __init__(self, consumer: AIOKafkaConsumer) -> None:
        super().__init__(consumer)
        self.batches: list[int] = []

    async def prepare(self, records: list[Record]) -> list[Slow]:
        self.batches.append(len(records))
        return await super().prepare(records)


async def test_a_full_buffer_fetches_again_only_when_half_of_it_is_free(broker: Broker) -> None:
    """Back-pressure with a low watermark: a finished record does not trigger a fetch of one record
    (and one `prepare`, one capture-switch read) each; fetches come in batches of half the buffer."""
    topic, group = f"batch-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    await ensure_topics(broker.bootstrap, [topic], partitions=4)
    await produce(broker.bootstrap, topic)
    consumer = consumer_for(broker.bootstrap, group)
    recorder = BatchRecorder(consumer)
    runner = KeyOrderedRunner(consumer, topic, recorder, Metrics(), max_buffered=16, grace_s=5)

    await run_until(recorder, runner, KEYS * PER_KEY)

    assert recorder.violations == []
    assert {k: v for k, v in recorder.seen.items()} == {str(k): list(range(PER_KEY)) for k in range(KEYS)}
    assert sum(recorder.batches) >= KEYS * PER_KEY
    assert len(recorder.batches) <= KEYS * PER_KEY // 8 + 10, recorder.batches
