"""`mao-memory dlq replay`: dead-lettered events back onto the main topic, once the cause is fixed.

Each dead letter is replayed once. The replay reads the DLQ as a consumer group of its own
(`replay_group`) from the offsets that group committed (from the beginning with `from_beginning`, or
when it has none) up to the end offsets seen at the start. The offset past a republished message is
committed only once the broker has acknowledged it, so a replay that dies between the two repeats that
one message and loses none. A dry run reads from the same place and commits nothing.

Each selected message goes to the main topic with its key and headers, minus the dead-letter reason
and error, plus `x-replay-count` (`dead_letters.replayed`), through the consumer's own producer class.
A stub (a dead letter the DLQ refused, kept as its coordinates and a hash) has no payload to replay and
is only counted. Headers go back as bytes, in order, null values null; a record without a value is
replayed without one. The ledger still makes a replayed event that was already applied a duplicate.
"""

from __future__ import annotations

import contextlib
from collections import Counter, deque
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from datetime import datetime

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError

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
# Why a message read was not replayed.
OTHER_REASON, BEFORE_SINCE, STUB_ONLY = "other_reason", "before_since", "stub"


def replay_group(group_id: str, reason: str | None) -> str:
    """The consumer group that remembers how far replays of this selection have read. A `--reason`
    run has its own, so it neither moves past nor repeats the letters of other reasons' runs."""
    group = f"{group_id}.dlq-replay"
    return group if reason is None else f"{group}.{reason}"


@dataclass(frozen=True, slots=True)
class Selection:
    reason: str | None = None
    since: datetime | None = None  # aware; the DLQ message's own timestamp is compared

    def skipped(self, headers: Headers, timestamp_ms: int) -> str | None:
        """Why this dead letter is not replayed, or None when it is."""
        if self.reason is not None and header(headers, REASON) != self.reason:
            return OTHER_REASON
        if self.since is not None and timestamp_ms < self.since.timestamp() * 1000:
            return BEFORE_SINCE
        return STUB_ONLY if header(headers, STUB) else None


@dataclass
class ReplayReport:
    group: str
    dry_run: bool
    read: int = 0
    replayed: int = 0  # in a dry run, the messages a real run would replay
    skipped: Counter[str] = field(default_factory=Counter)
    by_reason: Counter[str] = field(default_factory=Counter)

    @property
    def stubs(self) -> int:
        return self.skipped[STUB_ONLY]

    def as_dict(self) -> dict[str, object]:
        done = "wouldReplay" if self.dry_run else "replayed"
        return {
            "group": self.group,
            "dryRun": self.dry_run,
            "read": self.read,
            done: self.replayed,
            "skipped": dict(self.skipped),
            "byReason": dict(self.by_reason),
        }

    def line(self) -> str:
        done = "would replay" if self.dry_run else "replayed"
        return f"read {self.read}, {done} {self.replayed}, skipped {sum(self.skipped.values())}"


class ReplayStopped(Exception):
    """The broker failed a publish or a commit: what was replayed before it is committed, except at
    most the message in flight, which the next run replays again."""

    def __init__(self, report: ReplayReport, error: BaseException) -> None:
        # One line: some of aiokafka's messages are paragraphs.
        super().__init__(f"{type(error).__name__}: {' '.join(str(error).split())}"[:300])
        self.report = report


@dataclass(frozen=True, slots=True)
class Replay:
    """What one `dlq replay` run does."""

    bootstrap: str
    dlq_topic: str
    topic: str
    group: str
    selection: Selection = Selection()
    dry_run: bool = False
    from_beginning: bool = False
    security: KafkaSecurity = PLAINTEXT
    idempotence: bool = False


async def replay_dead_letters(
    replay: Replay, progress: Callable[[ReplayReport], None] | None = None
) -> ReplayReport:
    """`progress` is called after each message read. Raises `ReplayStopped` (carrying the report so
    far) when the broker fails a publish or a commit."""
    report = ReplayReport(replay.group, replay.dry_run)
    record_reader.install()
    consumer = AIOKafkaConsumer(
        bootstrap_servers=replay.bootstrap.split(","),
        enable_auto_commit=False,
        group_id=replay.group,
        # A committed offset the DLQ's retention has since deleted: the oldest letter left.
        auto_offset_reset="earliest",
        **replay.security.options(),
    )
    # The main topic takes events, not dead letters: Kafka's 1 MiB default request size, as the
    # task service's own producer sends them, not the dead-letter topic's 16 MiB.
    publisher = DeadLetterPublisher(
        replay.bootstrap,
        replay.topic,
        max_request_size=REPLAY_MAX_REQUEST_BYTES,
        security=replay.security,
        idempotence=replay.idempotence,
    )
    await consumer.start()
    try:
        await publisher.start()
    except KafkaError as exc:  # refused idempotence (InitProducerId), authentication, …: one line
        await consumer.stop()
        raise ReplayStopped(report, exc) from exc
    try:
        done: dict[TopicPartition, int] = {}
        async with contextlib.aclosing(_until_end(consumer, replay)) as records:
            async for tp, record in records:
                if await _replay_one(record, publisher, replay, report):
                    await consumer.commit({tp: record.offset + 1})
                done[tp] = record.offset + 1
                if progress is not None:
                    progress(report)
        if done and not replay.dry_run:
            await consumer.commit(done)  # past the letters skipped since the last replayed one
    except KafkaError as exc:
        raise ReplayStopped(report, exc) from exc
    finally:
        await consumer.stop()
        await publisher.stop()
    return report


async def _until_end(
    consumer: AIOKafkaConsumer, replay: Replay
) -> AsyncGenerator[tuple[TopicPartition, ConsumerRecord[bytes, bytes]]]:
    """The DLQ's messages from the group's position to the end offsets seen at the start."""
    topic = replay.dlq_topic
    partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
    if not partitions:
        return
    consumer.assign(partitions)
    for tp in partitions:
        committed = None if replay.from_beginning else await consumer.committed(tp)
        if committed is None:
            await consumer.seek_to_beginning(tp)
        else:
            consumer.seek(tp, committed)
    end = await consumer.end_offsets(partitions)
    pending = {tp for tp in partitions if end[tp] > 0}
    widened: set[TopicPartition] = set()
    while pending:
        # Taken out as they are yielded: the next drain's records never arrive while these are held.
        fetched = await consumer.getmany(*pending, timeout_ms=1000)
        batch = deque((tp, record) for tp, records in fetched.items() for record in records)
        del fetched
        for tp in pending - widened:
            # Some brokers (Tansu) answer the latest offset as the last batch's base + 1; the
            # high watermark of the first fetch says where the partition ends.
            high = consumer.highwater(tp)
            if high is not None:
                end[tp] = max(end[tp], high)
                widened.add(tp)
        while batch:
            tp, record = batch.popleft()
            if record.offset < end[tp]:
                yield tp, record
        pending = {tp for tp in pending if await consumer.position(tp) < end[tp]}


async def _replay_one(
    record: ConsumerRecord[bytes, bytes], publisher: DeadLetterPublisher, replay: Replay, report: ReplayReport
) -> bool:
    """True once the message is republished and acknowledged (never in a dry run)."""
    report.read += 1
    headers = list(record.headers)
    skipped = replay.selection.skipped(headers, record.timestamp)
    if skipped is not None:
        report.skipped[skipped] += 1
        return False
    reason = header(headers, REASON) or ""
    if not replay.dry_run:
        key, republished = replayed(record.value, record.key, headers)
        await publisher.publish(record.value, key, republished)
    report.replayed += 1
    report.by_reason[reason] += 1
    return not replay.dry_run
