"""What one `getmany` holds when many partitions each hold a small compressed batch that inflates to
megabytes: the consumer's inflated bytes are bounded per drain, not per partition, or the partition
count would multiply them (with a budget per partition's record set, 16 partitions gave 128 MiB in
one call from ~200 KB on the wire, and ~90 partitions passed the pod's 768 MiB limit). The service's
consumer and the DLQ replay read through the same fetcher, so both are checked."""

from __future__ import annotations

import time
import tracemalloc
import uuid

from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from service.adapters.kafka import record_reader
from service.adapters.kafka.compressed_batches import MAX_RECORD_BYTES
from service.adapters.kafka.fetch_budget import FETCH_INFLATED_BYTES
from service.adapters.kafka.inflate import GZIP
from service.adapters.kafka.replay import Replay, replay_dead_letters
from tests.support.backends import Broker
from tests.support.raw_records import raw_batch, send_raw_batch

MIB = 1024 * 1024
PARTITIONS = 16
RECORDS = 12  # 12 MiB inflated per partition, about 12 KB on the wire
# What one drain may hold: its budget, overshot by at most the record that spends it.
ONE_DRAIN = FETCH_INFLATED_BYTES + MAX_RECORD_BYTES


async def _inflating_topic(broker: Broker) -> str:
    """A topic whose every partition holds one gzip batch of RECORDS records of 1 MiB each."""
    topic = f"inflation.{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
    finally:
        await admin.close()
    batch = raw_batch([(b"k", b"\x00" * MIB, []) for _ in range(RECORDS)], compression=GZIP)
    for partition in range(PARTITIONS):
        await send_raw_batch(broker.bootstrap, topic, partition, batch)
    return topic


async def test_one_getmany_over_many_partitions_holds_one_fetch_budget(broker: Broker) -> None:
    topic = await _inflating_topic(broker)
    record_reader.install()
    consumer = AIOKafkaConsumer(  # the fetch sizes of service/bootstrap.py
        topic,
        bootstrap_servers=broker.bootstrap,
        group_id=f"g.{topic}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        max_partition_fetch_bytes=8 * MIB,
        fetch_max_bytes=8 * MIB,
    )
    await consumer.start()
    try:
        largest, offsets, deadline = 0, set(), time.monotonic() + 60
        while len(offsets) < PARTITIONS * RECORDS and time.monotonic() < deadline:
            fetched = await consumer.getmany(timeout_ms=1000, max_records=8192)
            records = [r for rs in fetched.values() for r in rs]
            offsets |= {(r.partition, r.offset) for r in records}
            largest = max(largest, sum(len(r.value or b"") for r in records))
    finally:
        await consumer.stop()
    # Every record of every partition came, once the budget of earlier drains let it.
    assert offsets == {(p, o) for p in range(PARTITIONS) for o in range(RECORDS)}
    # A plain fetch holds at most fetch_max_bytes (8 MiB) whatever the partition count.
    assert largest <= ONE_DRAIN, f"{largest / MIB:.0f} MiB in one getmany"


async def test_a_replay_over_many_partitions_holds_one_fetch_budget(broker: Broker) -> None:
    """The replay lets go of each record it has handled before the next drain, so the process's
    peak of traced memory is one drain, plus the copies that inflating one record makes."""
    topic = await _inflating_topic(broker)
    replay = Replay(broker.bootstrap, topic, f"unused.{topic}", f"g.{topic}", dry_run=True)
    tracemalloc.start()
    try:
        report = await replay_dead_letters(replay)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (report.read, report.replayed) == (PARTITIONS * RECORDS, PARTITIONS * RECORDS)
    assert peak <= ONE_DRAIN + 8 * MIB, f"{peak / MIB:.0f} MiB traced during the replay"
