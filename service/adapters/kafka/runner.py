"""Key-ordered concurrent consumption over aiokafka, with our own offset commits.

FastStream's acknowledgement policies either commit past unfinished messages or redeliver a poison
message in a hot loop, so this loop owns the consumer: events of one key (sessionId) on one partition
run strictly in order, different keys run concurrently, and each partition is committed only up to its first
unfinished offset. The loop knows nothing about memories: `process.prepare` turns each batch of
fetched records into items (decoded once, caches warmed in one round trip, each item's outcome
decided there when it needs no I/O), and `process(item)` returns once the item's effects are
committed (or dead-lettered).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Hashable, Iterable
from typing import Any, Generic, Protocol, TypeAlias, TypeVar

import structlog
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import IllegalStateError, KafkaError
from aiokafka.structs import OffsetAndMetadata

from service.adapters.kafka import record_reader
from service.adapters.kafka.offsets import PartitionOffsets
from service.adapters.metrics import Metrics
from service.core.backoff import Backoff

log = structlog.get_logger(__name__)


class Prepared(Protocol):
    """What the runner reads of an item."""

    @property
    def fast(self) -> object | None:
        """Not None when the item is finished as soon as it is taken (a skip that needs no I/O)."""


Item = TypeVar("Item", bound=Prepared)
Record: TypeAlias = ConsumerRecord[bytes, bytes]
# Tries of an item whose processing raised (a bug: `process` handles every failure it expects).
MAX_CRASHES = 3
# Between a crashed record's tries: 0.5 s, then 1 s (MAX_CRASHES bounds them).
CRASH_BACKOFF = Backoff(0.5)
# A failed fetch is tried again this long after, without end: the poll loop runs until it is stopped.
FETCH_RETRY_S = 1.0
# Records read ahead of the buffer: taken from aiokafka early, so that it fetches the next ones while
# these are worked on (it asks a broker for more once what it fetched from it is read out, or after its
# 0.1 s prefetch back-off). Bounded in records, so that one read does not stall the loop decoding
# (about 8 ms for this many, 35 ms when every batch has to be read leniently), and in bytes: no new
# read starts while the read-ahead holds this much of keys and values.
READ_AHEAD_RECORDS = 8192
READ_AHEAD_BYTES = 8 * 1024 * 1024
# Under back-pressure `getmany` is called this often only: it returns nothing while every partition is
# paused, and drops what aiokafka fetched for them (fetched again on resuming), but aiokafka leaves
# the group when it goes uncalled for `max_poll_interval_ms` (300 s by default).
KEEP_ALIVE_S = 30.0


class Process(Protocol[Item]):
    async def prepare(self, records: list[Record], /) -> list[Item]:
        """One item per record, in order; never raise (a failed warm-up leaves work to `__call__`)."""

    def taken(self, finished: list[Item], /) -> None:
        """A prepared batch has been taken; these of its items were finished as they were taken
        (their `fast` outcome stands): count them."""

    async def __call__(self, item: Item, /) -> None:
        """Return once the item's effects are committed; never raise for a bad record."""

    async def crashed(self, item: Item, error: BaseException, /) -> None:
        """`__call__` raised on this item again and again: put it aside (the dead-letter topic)."""


class _Chain(Generic[Item]):
    """The queued records of one key on one partition and the task draining them in order."""

    def __init__(self, partition: TopicPartition) -> None:
        self.partition = partition
        self.queued: deque[tuple[int, Item]] = deque()  # (offset, item)
        self.task: asyncio.Task[None] | None = None


class KeyOrderedRunner(Generic[Item]):
    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        topic: str,
        process: Process[Item],
        metrics: Metrics,
        max_buffered: int,
        grace_s: float,
        commit_interval_s: float = 0.5,
    ) -> None:
        self._consumer = consumer
        self._topic = topic
        self._process = process
        self._metrics = metrics
        self._max_buffered = max_buffered
        # Once full, fetching resumes only when half the buffer is free: a fetch then brings a
        # batch, not the one record a finished event made room for, so its decode and its one
        # capture-switch read are shared by many events.
        self._resume_at = max_buffered // 2
        self._grace_s = grace_s
        self._commit_interval_s = commit_interval_s
        self._chains: dict[Hashable, _Chain[Item]] = {}
        self._offsets: dict[TopicPartition, PartitionOffsets] = {}
        self._committed: dict[TopicPartition, int] = {}
        self._buffered = 0
        self._room = asyncio.Event()
        self._paused = False
        self._last_commit = 0.0
        self._revoked_meanwhile: set[TopicPartition] = set()  # while a batch is prepared
        # Fetched records not yet taken, per partition in fetch order (see READ_AHEAD_RECORDS).
        self._ahead: deque[tuple[TopicPartition, deque[Record]]] = deque()
        self._ahead_bytes = 0
        self._polled_at = time.monotonic()  # the last call of `getmany`
        self.alive = False
        # Partitions read again from the start after their log ended below the position, with the
        # log end to reach: readiness reports them until their commits get there.
        self.catching_up: dict[TopicPartition, int] = {}

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until `stop` is set. Any other end is an error that escapes: the caller must not
        take it for a stop (records behind it would wait unseen)."""
        record_reader.install()  # a record aiokafka cannot parse would otherwise raise from getmany
        self._consumer.subscribe([self._topic], listener=_Listener(self))
        await self._consumer.start()
        self.alive = True
        try:
            while not stop.is_set():
                await self._poll_once()
                if await self._commit(force=False):
                    await self._watch_log_ends()
        finally:
            self.alive = False
            await self._drain_all()
            await self._consumer.stop()

    async def close(self) -> None:
        """Release the consumer when `run` never started (a start-up that failed before it); after
        `run`, which stops the consumer itself, this does nothing."""
        await self._consumer.stop()

    async def _poll_once(self) -> None:
        room = self._max_buffered - self._buffered
        if room <= 0 or (self._paused and self._buffered > self._resume_at):
            # Back-pressure: fetching stops, and `getmany` is called only to stay in the group.
            self._pause()
            if time.monotonic() - self._polled_at >= KEEP_ALIVE_S:
                await self._read_ahead(timeout_ms=0)
            self._room.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._room.wait(), timeout=0.2)
            return
        self._resume()
        if self._ahead_records() < READ_AHEAD_RECORDS and self._ahead_bytes < READ_AHEAD_BYTES:
            await self._read_ahead(timeout_ms=0 if self._ahead else 200)
        # One batch per turn of the loop: the fetcher and the HTTP side run between batches.
        await asyncio.sleep(0)
        batch = self._next_batch(room)
        if not batch:
            return
        records = [record for records in batch.values() for record in records]
        self._revoked_meanwhile.clear()
        items = await self._process.prepare(records)
        # Records of a partition revoked meanwhile are not taken: its next owner fetches them again
        # from the commit point, and taking them would track offsets of a partition not held.
        self._process.taken(self._take(batch, items, skip=self._revoked_meanwhile))

    async def _read_ahead(self, timeout_ms: int) -> None:
        """Take what the consumer has fetched, up to the read-ahead's bound."""
        limit = READ_AHEAD_RECORDS - self._ahead_records()
        self._polled_at = time.monotonic()
        try:
            fetched = await self._consumer.getmany(timeout_ms=timeout_ms, max_records=max(limit, 1))
        except KafkaError as exc:
            log.warning("kafka_fetch_failed", error=str(exc))
            await asyncio.sleep(FETCH_RETRY_S)
            return
        for tp, records in fetched.items():
            if records:
                self._ahead.append((tp, deque(records)))
                self._ahead_bytes += _size(records)

    def _ahead_records(self) -> int:
        return sum(len(records) for _tp, records in self._ahead)  # a few entries per read

    def _next_batch(self, room: int) -> dict[TopicPartition, list[Record]]:
        """Up to `room` records of the read-ahead, each partition's in its order."""
        batch: dict[TopicPartition, list[Record]] = {}
        while self._ahead and room > 0:
            tp, records = self._ahead[0]
            if len(records) <= room:
                self._ahead.popleft()
                taken = list(records)
            else:
                taken = [records.popleft() for _ in range(room)]
            batch.setdefault(tp, []).extend(taken)
            room -= len(taken)
            self._ahead_bytes -= _size(taken)
        return batch

    def _take(
        self, batch: dict[TopicPartition, list[Record]], items: list[Item], skip: set[TopicPartition]
    ) -> list[Item]:
        """Queue each record behind its key, or finish it at once; returns the ones finished.
        `skip`: partitions whose records are dropped."""
        finished: list[Item] = []
        chains = self._chains
        start = 0
        for tp, records in batch.items():
            end = start + len(records)
            if tp in skip:
                start = end
                continue
            offsets = self._offsets.get(tp)
            if offsets is None:
                offsets = self._offsets[tp] = PartitionOffsets()
            for record, item in zip(records, items[start:end], strict=True):
                # Chains are per (partition, key): after the topic grows, one session has records on
                # two partitions, and each record must finish on (and hold back the commits of) its
                # own one. Kafka orders a key only within a partition, so nothing stricter is lost. No
                # key means no session to order by; the partition's own order is kept instead.
                key: Hashable = (tp.partition, record.key)
                if item.fast is not None and key not in chains:
                    # Nothing of this key is pending, so finishing now keeps the key's order; skips
                    # never wait behind model calls of other sessions, nor take a task.
                    offsets.pass_over(record.offset)
                    finished.append(item)
                else:
                    self._queue(tp, offsets, key, record.offset, item)
            start = end
        return finished

    def _queue(
        self, tp: TopicPartition, offsets: PartitionOffsets, key: Hashable, offset: int, item: Item
    ) -> None:
        offsets.take(offset)
        self._buffered += 1
        self._metrics.in_flight.set(self._buffered)
        chain = self._chains.get(key)
        if chain is None:
            chain = self._chains[key] = _Chain(tp)
        chain.queued.append((offset, item))
        if chain.task is None:
            chain.task = asyncio.create_task(self._drain(key, chain))

    async def _drain(self, key: Hashable, chain: _Chain[Item]) -> None:
        try:
            while chain.queued:
                offset, item = chain.queued[0]
                await self._process_until_done(chain.partition, offset, item)
                chain.queued.popleft()
                self._finish(chain.partition, offset)
        finally:
            if self._chains.get(key) is chain:
                del self._chains[key]

    async def _process_until_done(self, tp: TopicPartition, offset: int, item: Item) -> None:
        """`process` handles the failures it expects; one that escapes is a bug, tried MAX_CRASHES
        times and then handed to `process.crashed`, so one record never holds its key forever."""
        waits = CRASH_BACKOFF.delays()
        for attempt in range(1, MAX_CRASHES + 1):
            try:
                await self._process(item)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.exception(
                    "record_processing_crashed", partition=tp.partition, offset=offset, attempt=attempt
                )
                error: Exception = exc
            if attempt < MAX_CRASHES:
                await asyncio.sleep(next(waits))
        try:
            await self._process.crashed(item, error)
        except asyncio.CancelledError:
            raise
        except Exception:
            self._metrics.dead_letters_lost.inc()
            log.exception("record_abandoned", partition=tp.partition, offset=offset)

    def _finish(self, tp: TopicPartition, offset: int) -> None:
        offsets = self._offsets.get(tp)
        if offsets is not None:
            offsets.finish(offset)
        self._buffered -= 1
        self._metrics.in_flight.set(self._buffered)
        if self._buffered <= self._resume_at:
            self._room.set()

    def _pause(self) -> None:
        if not self._paused:
            self._consumer.pause(*self._consumer.assignment())
            self._paused = True

    def _resume(self) -> None:
        if self._paused:
            self._consumer.resume(*self._consumer.paused())
            self._paused = False

    async def _commit(self, force: bool, only: set[TopicPartition] | None = None) -> bool:
        """Commit what is done, at most once per commit interval unless forced; True when it ran."""
        now = time.monotonic()
        if not force and now - self._last_commit < self._commit_interval_s:
            return False
        self._last_commit = now
        offsets: dict[TopicPartition, OffsetAndMetadata] = {}
        for tp, tracker in self._offsets.items():
            point = tracker.commit_point
            if point is None or (only is not None and tp not in only):
                continue
            if self._committed.get(tp, -1) < point:
                offsets[tp] = OffsetAndMetadata(point, "")
        if offsets:
            try:
                await self._consumer.commit(offsets)
            except KafkaError as exc:
                # The records stay uncommitted and come back after the rebalance; the ledger dedups them.
                log.warning("kafka_commit_failed", error=str(exc))
                return True
            for tp, meta in offsets.items():
                self._committed[tp] = meta.offset
                self._metrics.committed_offset.labels(str(tp.partition)).set(meta.offset)
        self._update_lag()
        return True

    async def _watch_log_ends(self) -> None:
        """A partition whose log ends below where this consumer stands was deleted and created
        again, or truncated. Brokers answer a fetch beyond the end with nothing (Tansu) or an
        out-of-range error that the reset policy settles quietly (Kafka), and aiokafka keeps its
        position either way, so the new log's records up to the old position would be skipped in
        silence. The partition is read again from its start instead, as a new group would read it.
        A partition revoked meanwhile is left to its next owner, which checks it the same way."""
        for tp in self._consumer.assignment():
            end = self._consumer.highwater(tp)
            if end is None:
                continue
            try:
                position = await self._consumer.position(tp)
            except IllegalStateError:  # revoked while an earlier partition was restarted
                continue
            stands = max(position, self._committed.get(tp, 0))
            if stands > end:
                await self._restart_partition(tp, stands, end)
            elif tp in self.catching_up and self._committed.get(tp, -1) >= self.catching_up[tp]:
                del self.catching_up[tp]
                log.info("partition_log_caught_up", partition=tp.partition, offset=self._committed[tp])

    async def _restart_partition(self, tp: TopicPartition, stood: int, end: int) -> None:
        log.warning(
            "partition_log_reset", topic=tp.topic, partition=tp.partition, position=stood, log_end=end
        )
        self._metrics.log_resets.labels(str(tp.partition)).inc()
        # Whatever of the old log is still in flight finishes (or is abandoned) first; the tracking
        # of offsets starts again, so that commits below the old position are made.
        self._ahead = deque((p, records) for p, records in self._ahead if p != tp)
        self._ahead_bytes = sum(_size(records) for _p, records in self._ahead)
        await self._settle({tp})
        if tp not in self._consumer.assignment():
            return  # revoked during the grace period
        try:
            await self._consumer.seek_to_beginning(tp)
        except IllegalStateError:
            return
        self.catching_up[tp] = end

    def _update_lag(self) -> None:
        for tp in self._consumer.assignment():
            high = self._consumer.highwater(tp)
            if high is None:
                continue
            done = self._committed.get(tp)
            if done is None:
                continue
            self._metrics.consumer_lag.labels(str(tp.partition)).set(max(0, high - done))

    async def _settle(self, partitions: set[TopicPartition] | None) -> None:
        """Let in-flight work of these partitions finish within the grace period, then abandon the rest.

        Abandoned records are not committed, so whoever owns the partition next processes them again
        and the ledger turns a repeat of committed work into a skip.
        """
        chains = [c for c in self._chains.values() if partitions is None or c.partition in partitions]
        tasks = [c.task for c in chains if c.task is not None]
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=self._grace_s)
            for task in pending:
                task.cancel()
            if pending:
                log.warning("in_flight_abandoned", records=sum(len(c.queued) for c in chains))
                await asyncio.gather(*pending, return_exceptions=True)
        await self._commit(force=True, only=partitions)
        for chain in chains:
            self._buffered -= len(chain.queued)
        self._metrics.in_flight.set(self._buffered)
        for tp in list(self._offsets) if partitions is None else partitions:
            self._offsets.pop(tp, None)
            self._committed.pop(tp, None)

    async def _drain_all(self) -> None:
        self._pause()
        await self._settle(None)

    async def on_revoked(self, revoked: set[TopicPartition]) -> None:
        self._revoked_meanwhile |= revoked
        for tp in revoked:
            self.catching_up.pop(tp, None)
        # Not taken, so not counted in any commit: the partition's next owner fetches them again.
        self._ahead = deque((tp, records) for tp, records in self._ahead if tp not in revoked)
        self._ahead_bytes = sum(_size(records) for _tp, records in self._ahead)
        self._metrics.partitions_assigned.set(0)
        await self._settle(revoked)

    def on_assigned(self, assigned: set[TopicPartition]) -> None:
        if self._paused and assigned:
            self._consumer.pause(*assigned)
        self._metrics.partitions_assigned.set(len(self._consumer.assignment()))
        self._metrics.rebalances.inc()


def _size(records: Iterable[Record]) -> int:
    """The bytes of the records' keys and values."""
    return sum(max(r.serialized_key_size, 0) + max(r.serialized_value_size, 0) for r in records)


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, runner: KeyOrderedRunner[Any]) -> None:
        self._runner = runner

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self._runner.on_revoked(set(revoked))

    async def on_partitions_assigned(self, assigned: Any) -> None:
        self._runner.on_assigned(set(assigned))
