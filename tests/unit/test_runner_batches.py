"""How the runner hands a fetched batch over: prepared once, and dropped if a rebalance intervened."""

from __future__ import annotations

import asyncio
from collections.abc import Container
from typing import Any, NamedTuple, cast

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from service.adapters.kafka.runner import KeyOrderedRunner, Record
from service.adapters.metrics import Metrics

TP = TopicPartition("t", 0)


class OneBatch:
    """A consumer that serves a single fetch (by default of one partition), then nothing."""

    def __init__(self, records: list[Record] | dict[TopicPartition, list[Record]]) -> None:
        self._batch = records if isinstance(records, dict) else {TP: records}
        self.committed: dict[TopicPartition, int] = {}

    def subscribe(self, topics: list[str], listener: Any) -> None:
        pass

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def getmany(self, timeout_ms: int, max_records: int | None = None) -> dict[TopicPartition, list[Record]]:
        batch, self._batch = self._batch, {}
        await asyncio.sleep(0.01)
        return batch

    async def commit(self, offsets: dict[TopicPartition, Any]) -> None:
        self.committed.update({tp: meta.offset for tp, meta in offsets.items()})

    def assignment(self) -> set[TopicPartition]:
        return set(self._batch) | set(self.committed) | {TP}

    def pause(self, *partitions: TopicPartition) -> None:
        pass

    def highwater(self, tp: TopicPartition) -> int | None:
        return None


class Item(NamedTuple):
    record: Record
    fast: str | None


class Recorder:
    """Finishes every record as it is taken, except those at `slow` offsets, which need `__call__`."""

    def __init__(self, revoke_during_prepare: bool, slow: Container[int] = ()) -> None:
        self.runner: KeyOrderedRunner[Item] | None = None
        self.revoke = revoke_during_prepare
        self.slow = slow
        self.prepared: list[list[int]] = []
        self.partitions: list[list[int]] = []  # the partition of each prepared record
        self.taken_batches: list[list[int]] = []  # what each taken batch finished at once
        self.called: list[int] = []

    async def prepare(self, records: list[Record]) -> list[Item]:
        self.prepared.append([r.offset for r in records])
        self.partitions.append([r.partition for r in records])
        if self.revoke and self.runner is not None:
            await self.runner.on_revoked({TP})  # the group rebalanced while the batch was prepared
        return [Item(r, None if r.offset in self.slow else "skipped") for r in records]

    def taken(self, finished: list[Item]) -> None:
        self.taken_batches.append([item.record.offset for item in finished])

    async def __call__(self, item: Item) -> None:
        self.called.append(item.record.offset)


def record(offset: int, key: bytes, partition: int = 0) -> Record:
    return ConsumerRecord("t", partition, offset, 0, 0, key, b"{}", None, 0, 2, ())


async def run_briefly(
    recorder: Recorder, records: list[Record] | dict[TopicPartition, list[Record]]
) -> OneBatch:
    consumer = OneBatch(records)
    runner = KeyOrderedRunner(
        cast(AIOKafkaConsumer, consumer), "t", recorder, Metrics(), max_buffered=16, grace_s=0
    )
    recorder.runner = runner
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    await asyncio.sleep(0.1)
    stop.set()
    await task
    return consumer


async def test_a_batch_is_prepared_once_and_each_record_taken_in_order() -> None:
    recorder = Recorder(revoke_during_prepare=False)

    consumer = await run_briefly(recorder, [record(o, b"k%d" % (o % 2)) for o in range(4)])

    assert recorder.prepared == [[0, 1, 2, 3]]
    assert recorder.taken_batches == [[0, 1, 2, 3]]
    assert recorder.called == []
    assert consumer.committed == {TP: 4}


async def test_records_that_need_io_are_queued_and_not_counted_as_finished_at_once() -> None:
    recorder = Recorder(revoke_during_prepare=False, slow=range(4))

    consumer = await run_briefly(recorder, [record(o, b"k%d" % (o % 2)) for o in range(4)])

    assert recorder.taken_batches == [[]]
    assert sorted(recorder.called) == [0, 1, 2, 3]
    assert consumer.committed == {TP: 4}


async def test_a_record_decided_at_once_still_waits_behind_its_key() -> None:
    """Offset 1 needs no I/O, but offset 0 of its key is still pending: finishing 1 first would
    break the key's order, so it is queued behind 0. Offset 2, another key, finishes at once."""
    recorder = Recorder(revoke_during_prepare=False, slow={0})

    consumer = await run_briefly(recorder, [record(0, b"a"), record(1, b"a"), record(2, b"b")])

    assert recorder.taken_batches == [[2]]
    assert recorder.called == [0, 1]
    assert consumer.committed == {TP: 3}


async def test_a_batch_that_a_rebalance_overtook_is_dropped_for_refetching() -> None:
    recorder = Recorder(revoke_during_prepare=True)

    consumer = await run_briefly(recorder, [record(o, b"k") for o in range(3)])

    assert recorder.prepared == [[0, 1, 2]]
    assert recorder.taken_batches == [] and recorder.called == []
    assert consumer.committed == {}  # the new owner fetches the batch again from the last commit


async def test_a_fetch_larger_than_the_buffer_is_taken_a_buffer_at_a_time_in_partition_order() -> None:
    """The whole fetch is read ahead (so the next one can travel meanwhile) but handed over at most
    `max_buffered` (16) records at a time, each partition's records in their order."""
    recorder = Recorder(revoke_during_prepare=False)
    other = TopicPartition("t", 1)
    fetch = {
        TP: [record(o, b"k%d" % (o % 3)) for o in range(20)],
        other: [record(o, b"j", partition=1) for o in range(10)],
    }

    consumer = await run_briefly(recorder, fetch)

    assert recorder.prepared == [list(range(16)), [16, 17, 18, 19, *range(10)]]
    assert recorder.partitions == [[0] * 16, [0] * 4 + [1] * 10]
    assert consumer.committed == {TP: 20, other: 10}


async def test_a_rebalance_drops_the_read_ahead_of_the_revoked_partitions() -> None:
    """Records read ahead but not taken are in no commit: the partition's next owner fetches them."""
    recorder = Recorder(revoke_during_prepare=True)

    consumer = await run_briefly(recorder, [record(o, b"k") for o in range(40)])

    assert recorder.prepared == [list(range(16))]  # the rest of the fetch was never handed over
    assert recorder.taken_batches == [] and recorder.called == []
    assert consumer.committed == {}
