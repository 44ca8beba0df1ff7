"""Batches that lie about their offsets: every offset from the first batch's base to the end of what was
fetched is accounted for (a record, or a stub naming it), and nothing lands past the log end.

Each batch is read through aiokafka's own `PartitionRecords`, as `getmany` reads it."""

from __future__ import annotations

import struct

import aiokafka.consumer.fetcher as fetcher
import pytest
from aiokafka.record.default_records import _DefaultRecordBatchBuilderPy
from aiokafka.structs import TopicPartition

from service.adapters.kafka.record_format import STUB_OFFSETS, UNDECODABLE
from service.adapters.kafka.record_reader import TolerantMemoryRecords
from tests.support.raw_records import raw_batch, with_crc

TP = TopicPartition("task.finished", 0)
LAST_DELTA = 23  # v2 header: lastOffsetDelta, inside the CRC
ATTRIBUTES = 21
CONTROL_BIT = 0x20


def read(data: bytes, fetch_offset: int, log_end: int | None = None) -> list[object]:
    records = TolerantMemoryRecords(data)
    records.log_end = log_end
    partition = fetcher.PartitionRecords(
        TP, records, [], fetch_offset, None, None, True, fetcher.READ_UNCOMMITTED
    )
    out = list(partition)
    out.append(partition.next_fetch_offset)  # where the fetcher goes next, i.e. what gets committed
    return out


def batch(base: int, count: int, tag: str = "v") -> bytearray:
    return bytearray(raw_batch([(b"k", f"{tag}{i}".encode(), []) for i in range(count)], base_offset=base))


def lie(data: bytearray, last_delta: int, *, keep_crc: bool) -> bytes:
    """`lastOffsetDelta` rewritten; the CRC made right again (a broken producer) or left (damage)."""
    struct.pack_into(">i", data, LAST_DELTA, last_delta)
    return with_crc(data) if keep_crc else bytes(data)


def first_offset(record: object) -> int:
    span = dict(record.headers).get(STUB_OFFSETS)  # type: ignore[attr-defined]
    return int(span.split(b"-")[0]) if span else record.offset  # type: ignore[attr-defined]


def accounted(read_back: list[object]) -> list[int]:
    """Every offset a record or a stub accounts for, in the order they came."""
    offsets: list[int] = []
    for record in read_back[:-1]:
        offsets.extend(range(first_offset(record), record.offset + 1))  # type: ignore[attr-defined]
    return offsets


def stubs(read_back: list[object]) -> list[tuple[int, bytes]]:
    return [
        (r.offset, dict(r.headers).get(STUB_OFFSETS, b""))  # type: ignore[attr-defined]
        for r in read_back[:-1]
        if r.headers and r.headers[0][0] == UNDECODABLE  # type: ignore[attr-defined]
    ]


def test_a_crc_failure_with_last_offset_delta_damaged_high_hides_no_later_batch() -> None:
    """The 20-record log of issue 40: a damaged delta sent the commit to 1011."""
    data = batch(0, 5) + lie(batch(5, 5), 1000, keep_crc=False) + batch(10, 10)
    read_back = read(bytes(data), 0, log_end=20)
    assert accounted(read_back) == list(range(20))
    assert stubs(read_back) == [(9, b"5-9")]
    assert read_back[-1] == 20


def test_the_last_batch_of_a_fetch_failing_its_crc_ends_at_the_log_end() -> None:
    data = batch(0, 5) + lie(batch(5, 5), 1000, keep_crc=False)
    read_back = read(bytes(data), 0, log_end=10)
    assert accounted(read_back) == list(range(10)) and read_back[-1] == 10
    unknown_end = read(bytes(batch(5, 5, "x")[:0] + lie(batch(5, 5), 1000, keep_crc=False)), 5)
    assert unknown_end[-1] == 6, "with no log end known, only its base offset is accounted for"


@pytest.mark.parametrize("log_end", [10, None])
def test_a_crc_failure_with_last_offset_delta_damaged_low_covers_the_whole_batch(log_end: int | None) -> None:
    data = lie(batch(0, 5), 0, keep_crc=False) + batch(5, 5)
    read_back = read(bytes(data), 0, log_end=log_end)
    assert accounted(read_back) == list(range(10))
    assert stubs(read_back) == [(4, b"0-4")]
    assert read_back[0].value == bytes(data[: len(batch(0, 5))])  # type: ignore[attr-defined]


def test_a_readable_batch_claiming_too_many_offsets_hides_no_later_batch() -> None:
    data = lie(batch(0, 5), 500, keep_crc=True) + batch(5, 3)
    read_back = read(bytes(data), 0, log_end=8)
    assert [r.offset for r in read_back[:-1]] == list(range(8))  # type: ignore[attr-defined]
    assert stubs(read_back) == [] and read_back[-1] == 8
    alone = read(lie(batch(0, 5), 500, keep_crc=True), 0, log_end=5)
    assert accounted(alone) == list(range(5)) and alone[-1] == 5


def test_records_past_a_readable_batchs_low_last_offset_delta_are_dead_lettered() -> None:
    data = lie(batch(0, 5), 1, keep_crc=True) + batch(5, 1)
    read_back = read(bytes(data), 0, log_end=6)
    assert accounted(read_back) == list(range(6))
    assert stubs(read_back) == [(4, b"2-4")]
    assert read_back[2].value == bytes(data[: len(batch(0, 5))])  # type: ignore[attr-defined]


def set_delta(data: bytearray, index: int, delta: int) -> bytes:
    """Record `index`'s offset delta (a one-byte zigzag varint for these short records) rewritten."""
    pos = 61
    for _ in range(index):
        pos += 1 + (data[pos] >> 1)
    data[pos + 3] = delta << 1 if delta >= 0 else (-delta << 1) - 1  # zigzag
    return with_crc(data)


@pytest.mark.parametrize("delta", [-1, 0, 1, -40])
def test_a_record_whose_offset_delta_goes_back_is_dead_lettered_at_an_offset_of_its_batch(delta: int) -> None:
    data = set_delta(batch(0, 4), 2, delta) + batch(4, 1)
    read_back = read(data, 0, log_end=5)
    assert accounted(read_back) == list(range(5)) and read_back[-1] == 5
    assert [offset for offset, _ in stubs(read_back)] == [2]


def control(data: bytearray) -> bytes:
    data[ATTRIBUTES + 1] |= CONTROL_BIT
    return with_crc(data)


def test_a_control_batch_holding_an_ordinary_record_is_dead_lettered_not_skipped() -> None:
    marker = b"\x00\x00\x00\x01"  # version 0, commit
    mixed = bytearray(raw_batch([(marker, b"\x00\x00\x00\x00\x00\x00", []), (b"k", b"event", [])], 3))
    data = batch(0, 3) + control(mixed) + batch(5, 1)
    read_back = read(bytes(data), 0, log_end=6)
    assert accounted(read_back) == [0, 1, 2, 4, 5]  # the marker at 3 is Kafka's, skipped as ever
    (ordinary,) = [r for r in read_back[:-1] if r.offset == 4]  # type: ignore[attr-defined]
    assert ordinary.value == b"event" and b"control batch" in ordinary.headers[0][1]  # type: ignore[attr-defined]


def test_a_control_batch_of_markers_is_skipped_as_aiokafka_skips_it() -> None:
    markers = bytearray(raw_batch([(b"\x00\x00\x00\x00", b"\x00" * 6, [])], 3))
    read_back = read(bytes(batch(0, 3) + control(markers) + batch(4, 1)), 0, log_end=5)
    assert [r.offset for r in read_back[:-1]] == [0, 1, 2, 4] and read_back[-1] == 5  # type: ignore[attr-defined]


def test_a_base_offset_damaged_high_never_carries_the_commit_past_the_log_end() -> None:
    """The base offset sits outside the CRC: a damaged one in the next batch passes every check, so
    the extent it suggests is bounded by the log end all the same."""
    data = batch(0, 5) + batch(1000, 5) + batch(10, 5)
    read_back = read(bytes(data), 0, log_end=15)
    assert read_back[-1] == 15, f"the fetcher went to {read_back[-1]}, not the log end"
    assert accounted(read_back) == list(range(15))
    assert stubs(read_back) == [(9, b"5-9")]
    assert read_back[5].value == bytes(batch(1000, 5))  # type: ignore[attr-defined]
    first = read(bytes(batch(1000, 5) + batch(5, 5)), 0, log_end=10)
    assert accounted(first) == list(range(10)) and stubs(first) == [(4, b"0-4")]


def test_a_log_end_lagging_the_fetched_batches_loses_nothing() -> None:
    """A high watermark read before the last batches were appended: a batch at or past it, with none
    below it after, is a real one."""
    data = batch(0, 5) + batch(5, 5) + batch(10, 5)
    for log_end, position in ((3, 15), (5, 15), (10, 15), (12, 12)):  # inside the last: read again
        read_back = read(bytes(data), 0, log_end=log_end)
        assert accounted(read_back) == list(range(position)) and read_back[-1] == position
        assert stubs(read_back) == []


def read_committed(data: bytes, fetch_offset: int, aborted: list[tuple[int, int]]) -> list[object]:
    records = TolerantMemoryRecords(data)
    partition = fetcher.PartitionRecords(
        TP, records, aborted, fetch_offset, None, None, True, fetcher.READ_COMMITTED
    )
    out = list(partition)
    out.append(partition.next_fetch_offset)
    return out


def transactional(base: int, count: int, producer_id: int, tag: str = "t") -> bytearray:
    builder = _DefaultRecordBatchBuilderPy(2, 0, 1, producer_id, 0, 0, 2**30)
    for i in range(count):
        builder.append(i, timestamp=1_700_000_000_000 + i, key=b"k", value=f"{tag}{i}".encode(), headers=[])
    data = builder.build()
    struct.pack_into(">q", data, 0, base)
    return bytearray(data)


def marker(base: int, producer_id: int, kind: int) -> bytes:
    builder = _DefaultRecordBatchBuilderPy(2, 0, 1, producer_id, 0, 0, 2**30)
    builder.append(
        0, timestamp=1_700_000_000_000, key=struct.pack(">hh", 0, kind), value=b"\x00" * 6, headers=[]
    )
    data = builder.build()
    struct.pack_into(">q", data, 0, base)
    data[ATTRIBUTES + 1] |= CONTROL_BIT
    return with_crc(data)


def test_a_read_committed_fetch_skips_an_aborted_transaction_and_its_markers() -> None:
    """aiokafka's read_committed path asks a batch its producer and reads an abort marker itself."""
    data = batch(0, 2) + transactional(2, 2, 7) + marker(4, 7, 0) + transactional(5, 2, 8) + marker(7, 8, 1)
    read_back = read_committed(bytes(data), 0, aborted=[(7, 2)])
    assert [r.value for r in read_back[:-1]] == [b"v0", b"v1", b"t0", b"t1"]  # type: ignore[attr-defined]
    assert read_back[-1] == 8
