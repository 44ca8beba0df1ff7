"""A compressed v2 batch read one record at a time, in bounded memory, whatever it inflates to.

The records section is inflated as a stream (`inflate`), and each record is inflated only once its
length is known to be within `MAX_RECORD_BYTES`: a longer one is inflated a piece at a time and
dropped, and stands as a `payload_too_large` stub at its own offset. The records of every fetched
record set one `getmany` drains are counted against one `fetch_budget.FetchBudget`; once it is spent
the batch ends at the next record, its `next_offset` says so, and the fetcher asks for the rest in its
next fetch. Records below the offset the set was fetched from are skipped by the fetcher at once and
not counted; any it yields are, however often the batch was fetched and cut before. A batch whose
records section cannot be inflated (an unknown codec, corrupt compressed bytes) becomes one stub for
its unread offsets carrying the batch's raw bytes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from aiokafka.record.default_records import _DefaultRecordBatchPy
from aiokafka.record.util import calc_crc32c, decode_varint

from service.adapters.kafka.fetch_budget import FETCH_INFLATED_BYTES, SetBudget
from service.adapters.kafka.inflate import CODECS, Inflated, TooLarge, inflate
from service.adapters.kafka.record_format import (
    TolerantRecord,
    Unreadable,
    batch_stub,
    read_record,
    stub,
)
from service.core.events import MAX_EVENT_BYTES
from service.core.labels import DeadLetterReason

# A record's key and headers may add this much to the largest event the consumer takes.
RECORD_OVERHEAD_BYTES = 256 * 1024
MAX_RECORD_BYTES = MAX_EVENT_BYTES + RECORD_OVERHEAD_BYTES
# A snappy block is inflated whole, so one stating more is refused unread. Java writes 32 KiB blocks;
# librdkafka writes a batch as one block (its batches are 1 MB by default).
MAX_SNAPPY_BLOCK = FETCH_INFLATED_BYTES
_RECORDS_OFFSET = 61  # the v2 batch header's size: the records section starts here
_MAX_VARINT = 5  # a record's length is an int32, at most 5 bytes as a varint
_RECORD_PREFIX = 3 * 10  # attributes, timestamp delta, offset delta: three varints at most


class InflatingBatch:
    """What aiokafka's fetcher reads of a batch (header attributes, CRC check, records); iterating it
    never raises."""

    def __init__(self, raw: bytes, budget: SetBudget) -> None:
        self._header = _DefaultRecordBatchPy(raw[:_RECORDS_OFFSET])  # the header, not a copy of it all
        self._raw = raw
        self._budget = budget
        self.crc_failed = False
        self.cut: int | None = None  # where the drain's budget ended the batch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._header, name)

    @property
    def next_offset(self) -> int:
        return self.cut if self.cut is not None else int(self._header.next_offset)

    def validate_crc(self) -> bool:
        """A wrong CRC is not raised (the fetcher would fetch the batch again forever): the batch
        becomes one stub with its raw bytes."""
        crc = calc_crc32c(memoryview(self._raw)[_DefaultRecordBatchPy.ATTRIBUTES_OFFSET :])
        self.crc_failed = crc != self._header.crc
        return True

    def __iter__(self) -> Iterator[TolerantRecord]:
        if self.crc_failed:
            return iter([batch_stub(self._raw, "the batch's CRC does not match its bytes")])
        return self._read()

    def _read(self) -> Iterator[TolerantRecord]:
        batch = self._header
        last = batch.next_offset - 1
        counted_from = max(batch.base_offset, self._budget.fetched_from)
        try:
            records = memoryview(self._raw)[_RECORDS_OFFSET:]
            stream = inflate(batch.compression_type, records, MAX_SNAPPY_BLOCK)
        except ValueError as exc:
            yield batch_stub(self._raw, f"batch unreadable: {exc}")
            return
        expected = batch.base_offset
        for _ in range(batch._num_records):
            if expected > last:
                return  # every offset is accounted for: the rest claims offsets it cannot have
            if expected >= counted_from and self._budget.exhausted():
                self.cut = expected
                return
            record, ends = self._next(stream, expected)
            if ends:
                yield record
                return
            if record.offset >= counted_from:
                self._budget.count(record)
            expected = record.offset + 1
            yield record

    def _next(self, stream: Inflated, expected: int) -> tuple[TolerantRecord, bool]:
        """The next record or a stub for it; or, with True, one stub for the rest of the batch (whose
        value is the batch's raw bytes) when the stream cannot go on."""
        batch = self._header
        try:
            return _next_record(batch, stream, expected), False
        except Unreadable as exc:
            if exc.next_pos is None:
                return batch_stub(self._raw, exc.why, first=expected), True
            return stub(exc.offset, batch.first_timestamp, batch.timestamp_type, exc.why), False
        except TooLarge as exc:
            return batch_stub(self._raw, str(exc), DeadLetterReason.PAYLOAD_TOO_LARGE, first=expected), True
        except Exception as exc:  # the codec's own errors (corrupt compressed bytes)
            codec = CODECS.get(batch.compression_type)
            return batch_stub(self._raw, f"{codec} stream unreadable: {exc!r}", first=expected), True


def _next_record(batch: Any, stream: Inflated, expected: int) -> TolerantRecord:
    """The next record, read whole only when its length is within MAX_RECORD_BYTES."""
    last = batch.next_offset - 1
    head = bytearray()
    while len(head) < _MAX_VARINT and (not head or head[-1] & 0x80):
        byte = stream.read(1)
        if not byte:
            raise Unreadable(expected, None, f"records {expected}-{last} missing from the batch")
        head += byte
    length, _ = decode_varint(head, 0)
    if length < 0:
        raise Unreadable(expected, None, f"records {expected}-{last} unreadable: length {length}")
    if length > MAX_RECORD_BYTES:
        return _too_large(batch, stream, length, expected)
    body = stream.read(length)
    if len(body) < length:
        raise Unreadable(expected, None, f"records {expected}-{last} cut short")
    record, _ = read_record(batch, bytearray(head + body), 0, expected)
    return record


def _too_large(batch: Any, stream: Inflated, length: int, expected: int) -> TolerantRecord:
    """A stub at the record's own offset (read from its first bytes); the rest is inflated and dropped."""
    prefix = stream.read(min(length, _RECORD_PREFIX))
    offset = expected
    try:
        _attributes, pos = decode_varint(prefix, 0)
        _timestamp, pos = decode_varint(prefix, pos)
        delta, _ = decode_varint(prefix, pos)
        if expected <= batch.base_offset + delta < batch.next_offset:
            offset = batch.base_offset + delta
    except (IndexError, ValueError):
        pass  # the record's offset is the one it would have without compaction
    if stream.skip(length - len(prefix)) < length - len(prefix):
        raise Unreadable(offset, None, f"record at offset {offset} cut short")
    why = f"record at offset {offset} inflates to {length} bytes, more than {MAX_RECORD_BYTES}"
    return stub(offset, batch.first_timestamp, batch.timestamp_type, why, DeadLetterReason.PAYLOAD_TOO_LARGE)
