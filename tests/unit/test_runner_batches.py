"""How the runner takes fetched records: read ahead within a bound, handed over a buffer at a time,
prepared once, finished at once or queued behind their key, and dropped when a rebalance revoked
their partition meanwhile."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Container
from itertools import pairwise
from typing import Any, NamedTuple, cast

import pytest
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.errors import IllegalStateError

from service.adapters.kafka import runner
from service.adapters.kafka.runner import READ_AHEAD_BYTES, READ_AHEAD_RECORDS, KeyOrderedRunner, Record
from service.adapters.metrics import Metrics

TP = TopicPartition("t", 0)
OTHER = TopicPartition("t", 1)


class OneFetch:
    """A consumer that has fetched these records (by default of one partition) and nothing after
    them; `getmany` hands them over as aiokafka does, at most `max_records` (and `per_call`) at a
    time, none while paused, and writes down when it was called, with what bound, and how many
    records it served."""

    def __init__(
        self, records: list[Record] | dict[TopicPartition, list[Record]], per_call: int | None = None
    ) -> None:
        self._fetched = dict(records) if isinstance(records, dict) else {TP: records}
        self._assigned = set(self._fetched) | {TP}
        self._per_call = per_call
        self._paused = False
        self.committed: dict[TopicPartition, int] = {}
        self.calls: list[tuple[float, int | None]] = []  # (monotonic time, max_records)
        self.paused_calls = 0  # aiokafka drops what it fetched for a paused partition on these
        self.served = 0
        self.served_while_blocked = 0  # by the time a blocked model was released

    def subscribe(self, topics: list[str], listener: Any) -> None:
        pass

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def getmany(
        self, timeout_ms: int, max_records: int | None = None
    ) -> dict[TopicPartition, list[Record]]:
        self.calls.append((time.monotonic(), max_records))
        self.paused_calls += self._paused
        batch: dict[TopicPartition, list[Record]] = {}
        left = max_records if max_records is not None else sum(map(len, self._fetched.values()))
        left = min(left, self._per_call or left, 0 if self._paused else left)
        for tp, records in self._fetched.items():
            if left <= 0:
                break
            batch[tp], self._fetched[tp] = records[:left], records[left:]
            left -= len(batch[tp])
        await asyncio.sleep(0.01 if not any(batch.values()) else 0)
        self.served += sum(map(len, batch.values()))
        return {tp: records for tp, records in batch.items() if records}

    async def commit(self, offsets: dict[TopicPartition, Any]) -> None:
        self.committed.update({tp: meta.offset for tp, meta in offsets.items()})

    def assignment(self) -> set[TopicPartition]:
        return set(self._assigned)

    def pause(self, *partitions: TopicPartition) -> None:
        self._paused = True

    def paused(self) -> set[TopicPartition]:
        return set(self._assigned) if self._paused else set()

    def resume(self, *partitions: TopicPartition) -> None:
        self._paused = False

    def highwater(self, tp: TopicPartition) -> int | None:
        return None


class Item(NamedTuple):
    record: Record
    fast: str | None


class Recorder:
    """Finishes every record as it is taken, except those at `slow` offsets, which need `__call__`
    (and wait there for `release`, when given). `revoke`: the partitions a rebalance revokes while
    the first batch is prepared."""

    def __init__(
        self,
        revoke: set[TopicPartition] | None = None,
        slow: Container[int] = (),
        release: asyncio.Event | None = None,
        prepare_s: float = 0.0,
    ) -> None:
        self.runner: KeyOrderedRunner[Item] | None = None
        self.consumer: OneFetch | None = None
        self.prepare_s = prepare_s
        self.held: list[tuple[int, int]] = []  # (records served, records prepared) at each prepare
        self.revoke = revoke
        self.slow = slow
        self.release = release
        self.prepared: list[list[int]] = []
        self.partitions: list[list[int]] = []  # the partition of each prepared record
        self.taken_batches: list[list[int]] = []  # what each taken batch finished at once
        self.called: list[int] = []

    async def prepare(self, records: list[Record]) -> list[Item]:
        if self.consumer is not None:
            self.held.append((self.consumer.served, sum(map(len, self.prepared))))
        await asyncio.sleep(self.prepare_s)
        self.prepared.append([r.offset for r in records])
        self.partitions.append([r.partition for r in records])
        if self.revoke and self.runner is not None:
            await self.runner.on_revoked(self.revoke)  # the group rebalanced while the batch was prepared
            self.revoke = None
        return [Item(r, None if r.offset in self.slow else "skipped") for r in records]

    def taken(self, finished: list[Item]) -> None:
        self.taken_batches.append([item.record.offset for item in finished])

    async def __call__(self, item: Item) -> None:
        if self.release is not None:
            await self.release.wait()
        self.called.append(item.record.offset)


def record(offset: int, key: bytes, partition: int = 0, value: bytes = b"{}") -> Record:
    return ConsumerRecord("t", partition, offset, 0, 0, key, value, None, len(key), len(value), ())


async def run_briefly(
    recorder: Recorder,
    records: list[Record] | dict[TopicPartition, list[Record]],
    seconds: float = 0.1,
    max_buffered: int = 16,
    per_call: int | None = None,
) -> OneFetch:
    consumer = OneFetch(records, per_call)
    runner = KeyOrderedRunner(
        cast(AIOKafkaConsumer, consumer), "t", recorder, Metrics(), max_buffered=max_buffered, grace_s=0
    )
    recorder.runner, recorder.consumer = runner, consumer
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    await asyncio.sleep(seconds)
    consumer.served_while_blocked = consumer.served
    if recorder.release is not None:
        recorder.release.set()
        await asyncio.sleep(0.1)
    stop.set()
    await task
    return consumer


async def test_a_batch_is_prepared_once_and_each_record_taken_in_order() -> None:
    recorder = Recorder()

    consumer = await run_briefly(recorder, [record(o, b"k%d" % (o % 2)) for o in range(4)])

    assert recorder.prepared == [[0, 1, 2, 3]]
    assert recorder.taken_batches == [[0, 1, 2, 3]]
    assert recorder.called == []
    assert consumer.committed == {TP: 4}


async def test_records_that_need_io_are_queued_and_not_counted_as_finished_at_once() -> None:
    recorder = Recorder(slow=range(4))

    consumer = await run_briefly(recorder, [record(o, b"k%d" % (o % 2)) for o in range(4)])

    assert recorder.taken_batches == [[]]
    assert sorted(recorder.called) == [0, 1, 2, 3]
    assert consumer.committed == {TP: 4}


async def test_a_record_decided_at_once_still_waits_behind_its_key() -> None:
    """Offset 1 needs no I/O, but offset 0 of its key is still pending: finishing 1 first would
    break the key's order, so it is queued behind 0. Offset 2, another key, finishes at once."""
    recorder = Recorder(slow={0})

    consumer = await run_briefly(recorder, [record(0, b"a"), record(1, b"a"), record(2, b"b")])

    assert recorder.taken_batches == [[2]]
    assert recorder.called == [0, 1]
    assert consumer.committed == {TP: 3}


async def test_a_batch_that_a_rebalance_overtook_is_dropped_for_refetching() -> None:
    recorder = Recorder(revoke={TP})

    consumer = await run_briefly(recorder, [record(o, b"k") for o in range(3)])

    assert recorder.prepared == [[0, 1, 2]]
    assert recorder.taken_batches == [[]] and recorder.called == []
    assert consumer.committed == {}  # the new owner fetches the batch again from the last commit


async def test_a_fetch_larger_than_the_buffer_is_taken_a_buffer_at_a_time_in_partition_order() -> None:
    """The fetch is read ahead (so the next one can travel meanwhile) but handed over at most
    `max_buffered` (16) records at a time, each partition's records in their order."""
    recorder = Recorder()
    fetch = {
        TP: [record(o, b"k%d" % (o % 3)) for o in range(20)],
        OTHER: [record(o, b"j", partition=1) for o in range(10)],
    }

    consumer = await run_briefly(recorder, fetch)

    assert recorder.prepared == [list(range(16)), [16, 17, 18, 19, *range(10)]]
    assert recorder.partitions == [[0] * 16, [0] * 4 + [1] * 10]
    assert consumer.committed == {TP: 20, OTHER: 10}


async def test_a_rebalance_drops_the_read_ahead_of_the_revoked_partitions() -> None:
    """Records read ahead but not taken are in no commit: the partition's next owner fetches them."""
    recorder = Recorder(revoke={TP})

    consumer = await run_briefly(recorder, [record(o, b"k") for o in range(40)])

    assert recorder.prepared == [list(range(16))]  # the rest of the fetch was never handed over
    assert recorder.taken_batches == [[]] and recorder.called == []
    assert consumer.committed == {}


async def test_a_partition_kept_through_a_rebalance_loses_none_of_its_records() -> None:
    """A rebalance that revokes one partition while a batch holding two is prepared: the revoked
    one's records are dropped (its next owner fetches them), the kept one's are taken as usual, and
    its commit covers every one of them."""
    recorder = Recorder(revoke={TP})
    fetch = {TP: [record(o, b"k") for o in range(4)], OTHER: [record(o, b"j", 1) for o in range(20)]}

    consumer = await run_briefly(recorder, fetch)

    assert recorder.partitions[0] == [0] * 4 + [1] * 12
    assert [o for batch in recorder.taken_batches for o in batch] == list(range(20))
    assert consumer.committed == {OTHER: 20}


async def test_the_read_ahead_is_bounded_in_records() -> None:
    """However much aiokafka has fetched, one read takes at most READ_AHEAD_RECORDS of it."""
    recorder = Recorder(slow=range(10**6), release=asyncio.Event())
    fetch = [record(o, b"k%d" % (o % 7)) for o in range(3 * READ_AHEAD_RECORDS)]

    consumer = await run_briefly(recorder, fetch, seconds=0.3)

    asked = [bound for _at, bound in consumer.calls]
    assert asked and all(bound is not None and 1 <= bound <= READ_AHEAD_RECORDS for bound in asked)
    assert consumer.served_while_blocked <= READ_AHEAD_RECORDS


async def test_the_read_ahead_is_bounded_in_bytes() -> None:
    """Records of 64 KiB fetched 50 at a time (3.2 MiB), worked off 16 at a time: reading ahead
    pauses while READ_AHEAD_BYTES are held."""
    recorder = Recorder(prepare_s=0.005)
    big = b"x" * 65536
    fetch = [record(o, b"k%d" % o, value=big) for o in range(1000)]

    consumer = await run_briefly(recorder, fetch, seconds=1.0, max_buffered=16, per_call=50)

    held = [served - prepared for served, prepared in recorder.held]  # at each prepare
    assert max(held) <= READ_AHEAD_BYTES // len(big) + 50  # one read may cross the bound
    assert sum(map(len, recorder.prepared)) == consumer.served == 1000


async def test_a_full_buffer_does_not_make_aiokafka_fetch_again_and_again() -> None:
    """While the buffer waits on the model, every partition is paused: a `getmany` then would drop
    what aiokafka fetched, to be fetched again on resuming."""
    recorder = Recorder(slow=range(10**6), release=asyncio.Event())
    fetch = [record(o, b"k%d" % o) for o in range(100)]

    consumer = await run_briefly(recorder, fetch, seconds=1.0, max_buffered=4)

    assert consumer.paused_calls == 0


async def test_getmany_is_still_called_while_the_buffer_is_full(monkeypatch: pytest.MonkeyPatch) -> None:
    """aiokafka leaves the group when `getmany` goes uncalled for `max_poll_interval_ms`: a buffer
    full of records waiting on a slow model calls it every KEEP_ALIVE_S (0.1 s here)."""
    monkeypatch.setattr(runner, "KEEP_ALIVE_S", 0.1)
    recorder = Recorder(slow=range(10**6), release=asyncio.Event())
    fetch = [record(o, b"k%d" % o) for o in range(100)]

    consumer = await run_briefly(recorder, fetch, seconds=1.5, max_buffered=4)

    # From the first fetch on, the buffer is full until the model is released after 1.5 s.
    times = [at for at, _bound in consumer.calls]
    gaps = [b - a for a, b in pairwise(times)]
    assert consumer.paused_calls >= 5 and max(gaps) < 0.5, gaps


class ReCreatedLog(OneFetch):
    """A consumer standing at offset 20 of partitions whose log now ends at 5 (the topic was
    deleted and created again); `revoke_on_settle`: a rebalance takes them while the runner waits
    for their in-flight work."""

    def __init__(self, partitions: set[TopicPartition]) -> None:
        super().__init__({tp: [] for tp in partitions})
        self.sought: list[TopicPartition] = []

    def highwater(self, tp: TopicPartition) -> int | None:
        return 5

    async def position(self, tp: TopicPartition) -> int:
        if tp not in self._assigned:
            raise IllegalStateError(f"No current assignment for partition {tp}")
        return 20

    async def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        if any(tp not in self._assigned for tp in partitions):
            raise IllegalStateError("No current assignment")
        self.sought.extend(partitions)


async def test_a_re_created_log_is_read_again_from_its_start() -> None:
    consumer = ReCreatedLog({TP})
    kor = KeyOrderedRunner(cast(AIOKafkaConsumer, consumer), "t", Recorder(), Metrics(), 64, grace_s=0.1)
    await kor._watch_log_ends()
    assert consumer.sought == [TP] and kor.catching_up == {TP: 5}


async def test_a_partition_revoked_while_its_log_restart_waits_is_left_to_its_next_owner() -> None:
    """A rebalance during the grace period (or between two partitions' checks) must not raise out
    of the loop and stop the consumer: the next owner checks the partition itself."""
    consumer = ReCreatedLog({TP, OTHER})
    kor = KeyOrderedRunner(cast(AIOKafkaConsumer, consumer), "t", Recorder(), Metrics(), 64, grace_s=0.1)
    settle = kor._settle

    async def revoked_meanwhile(partitions: set[TopicPartition] | None) -> None:
        consumer._assigned.clear()  # both partitions go to another member
        await settle(partitions)

    kor._settle = revoked_meanwhile  # type: ignore[method-assign]
    await kor._watch_log_ends()
    assert consumer.sought == [] and kor.catching_up == {}
