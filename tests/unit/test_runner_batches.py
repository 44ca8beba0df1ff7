"""How the runner hands a fetched batch over: prepared once, and dropped if a rebalance intervened."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from service.adapters.kafka.runner import KeyOrderedRunner, Record
from service.adapters.metrics import Metrics

TP = TopicPartition("t", 0)


class OneBatch:
    """A consumer owning one partition that serves a single batch, then nothing."""

    def __init__(self, records: list[Record]) -> None:
        self._batch: dict[TopicPartition, list[Record]] = {TP: records}
        self.committed: dict[TopicPartition, int] = {}

    def subscribe(self, topics: list[str], listener: Any) -> None:
        pass

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def getmany(self, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[Record]]:
        batch, self._batch = self._batch, {}
        await asyncio.sleep(0.01)
        return batch

    async def commit(self, offsets: dict[TopicPartition, Any]) -> None:
        self.committed.update({tp: meta.offset for tp, meta in offsets.items()})

    def assignment(self) -> set[TopicPartition]:
        return {TP}

    def pause(self, *partitions: TopicPartition) -> None:
        pass

    def highwater(self, tp: TopicPartition) -> int | None:
        return None


class Recorder:
    def __init__(self, revoke_during_prepare: bool) -> None:
        self.runner: KeyOrderedRunner[Record] | None = None
        self.revoke = revoke_during_prepare
        self.prepared: list[list[int]] = []
        self.tried: list[int] = []
        self.taken_after: list[list[int]] = []  # what had been tried each time a batch was taken

    async def prepare(self, records: list[Record]) -> list[Record]:
        self.prepared.append([r.offset for r in records])
        if self.revoke and self.runner is not None:
            await self.runner.on_revoked({TP})  # the group rebalanced while the batch was prepared
        return records

    def try_fast(self, record: Record) -> bool:
        self.tried.append(record.offset)
        return True

    def taken(self) -> None:
        self.taken_after.append(list(self.tried))

    async def __call__(self, record: Record) -> None:
        raise AssertionError("every record here is finished on the fast path")


def record(offset: int, key: bytes) -> Record:
    return ConsumerRecord("t", 0, offset, 0, 0, key, b"{}", None, 0, 2, ())


async def run_briefly(recorder: Recorder, records: list[Record]) -> OneBatch:
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
    assert recorder.tried == [0, 1, 2, 3]
    assert recorder.taken_after == [[0, 1, 2, 3]]
    assert consumer.committed == {TP: 4}


async def test_a_batch_that_a_rebalance_overtook_is_dropped_for_refetching() -> None:
    recorder = Recorder(revoke_during_prepare=True)

    consumer = await run_briefly(recorder, [record(o, b"k") for o in range(3)])

    assert recorder.prepared == [[0, 1, 2]]
    assert recorder.tried == [] and recorder.taken_after == []
    assert consumer.committed == {}  # the new owner fetches the batch again from the last commit
