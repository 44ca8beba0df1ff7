"""Every fetched record reaches the service, whatever its bytes hold.

aiokafka's record reader (the C extension and the pure-Python path alike) decodes header keys as
strict UTF-8 and raises from `getmany` on the first record whose key is not: the partition can never
move past it, and the exception is not a `KafkaError`. The same reader refuses a record whose
structure is broken, and a batch in a codec the client lacks.

`install()` puts `TolerantMemoryRecords` where the fetcher builds its record sets. Batches are still
read by aiokafka's own reader (the C extension, when present); only a batch on which that reader fails
is read again here, record by record, from the bytes the broker sent:
- a header key that is not UTF-8 is decoded with `surrogateescape`, so the original bytes survive
  (`header_key_bytes`) and the record is processed like any other;
- a record (or a batch) that cannot be parsed at all becomes a stub: no key, no value, and a single
  header named `UNDECODABLE` (a name no record on the wire can carry: it starts with a high
  surrogate, which neither strict nor `surrogateescape` decoding produces) whose value says why.
  The stub keeps the record's offset, so the consumer dead-letters it and moves past it.

This reaches into aiokafka's fetcher (`aiokafka.consumer.fetcher.MemoryRecords`): the version range
is pinned in pyproject.toml, `install()` refuses to run when the internals it relies on are missing,
and `tests/unit/test_record_reader.py` fails when an upgrade changes them.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from aiokafka.consumer import fetcher
from aiokafka.record.default_records import DefaultRecordBatch, _DefaultRecordBatchPy
from aiokafka.record.legacy_records import LegacyRecordBatch
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.record.util import decode_varint

UNDECODABLE = "\ud800undecodable-record"
# The framing every message format shares: base offset (int64), length (int32), …, magic at byte 16.
_LOG_OVERHEAD = 12
_MAGIC_OFFSET = 16
_MIN_BATCH = 26  # the smallest legacy message set, aiokafka's own lower bound
_LAST_DELTA_OFFSET = 23  # v2: base offset, length, leader epoch, magic, CRC, attributes, then this
_V2 = 2


def header_key_bytes(key: str) -> bytes:
    """The header key's bytes as they were on the wire."""
    return key.encode("utf-8", "surrogateescape")


@dataclass(frozen=True, slots=True)
class TolerantRecord:
    """The attributes aiokafka's fetcher reads from a record to build a `ConsumerRecord`."""

    offset: int
    timestamp: int
    timestamp_type: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    checksum: None = None


def stub(offset: int, timestamp: int, timestamp_type: int, why: str) -> TolerantRecord:
    return TolerantRecord(offset, timestamp, timestamp_type, None, None, [(UNDECODABLE, why.encode())])


class TolerantMemoryRecords:
    """aiokafka's `MemoryRecords` with the same framing, whose batches never raise: a batch aiokafka
    cannot open, or whose CRC is wrong, becomes one stub; a v2 batch that fails while its records are
    read falls back to `_tolerant_records`."""

    def __init__(self, data: bytes) -> None:
        self._data = memoryview(data)
        self._next: tuple[int, int] | None = None
        self._pos = 0
        self._cache_next()

    def size_in_bytes(self) -> int:
        return len(self._data)

    def has_next(self) -> bool:
        return self._next is not None

    def _cache_next(self) -> None:
        """The next whole batch's (start, end); an incomplete one at the end is left for the next fetch."""
        self._next = None
        if len(self._data) - self._pos < _LOG_OVERHEAD:
            return
        (length,) = struct.unpack_from(">i", self._data, self._pos + 8)
        end = self._pos + _LOG_OVERHEAD + max(length, 0)
        if end <= len(self._data):
            self._next = (self._pos, end)

    def next_batch(self) -> Any:
        if self._next is None:
            return None
        start, end = self._next
        # A length too short for any batch leaves nothing after it to trust: the set ends there.
        self._pos = end if end - start >= _MIN_BATCH else len(self._data)
        self._cache_next()
        raw = self._data[start:end]
        try:
            if len(raw) < _MIN_BATCH:
                raise ValueError(f"{len(raw)} bytes, less than a batch's overhead")
            magic = raw[_MAGIC_OFFSET]
            if magic < _V2:  # no headers to decode, nothing to read leniently: a failure is a stub
                return _TolerantBatch(LegacyRecordBatch(raw, magic), bytes(raw), lenient=False)
            return _TolerantBatch(DefaultRecordBatch(raw), bytes(raw))
        except Exception as exc:
            return _UnreadableBatch(bytes(raw), f"batch unreadable: {type(exc).__name__}: {exc}")


class _UnreadableBatch:
    """A batch neither reader can open (or whose CRC is wrong): one stub, at its last offset, so the
    fetcher moves past all of it however far into it it was positioned."""

    producer_id = None
    is_control_batch = False
    is_transactional = False

    def __init__(self, raw: bytes, why: str) -> None:
        self.base_offset = struct.unpack_from(">q", raw)[0] if len(raw) >= 8 else 0
        last_delta = -1
        if len(raw) >= _LAST_DELTA_OFFSET + 4 and raw[_MAGIC_OFFSET] >= _V2:
            (last_delta,) = struct.unpack_from(">i", raw, _LAST_DELTA_OFFSET)
        self.next_offset = self.base_offset + max(last_delta, 0) + 1
        self._why = f"offsets {self.base_offset}-{self.next_offset - 1}: {why}"
        self._iterator = iter([stub(self.next_offset - 1, -1, 0, self._why)])

    def validate_crc(self) -> bool:
        return True

    def __iter__(self) -> Iterator[TolerantRecord]:
        return self._iterator

    def __next__(self) -> TolerantRecord:
        return next(self._iterator)


class _TolerantBatch:
    """Delegates to aiokafka's batch; iterating it never raises."""

    def __init__(self, batch: Any, raw: bytes, lenient: bool = True) -> None:
        self._batch = batch
        self._raw = raw
        self._lenient = lenient
        self._iterator: Iterator[Any] | None = None
        self._crc_failed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._batch, name)

    def validate_crc(self) -> bool:
        """A wrong CRC is not raised (the fetcher would fetch the batch again forever): the batch is
        read as one stub instead, its records not trusted."""
        self._crc_failed = not self._batch.validate_crc()
        return True

    def __iter__(self) -> Iterator[Any]:
        return self._read()

    def __next__(self) -> Any:
        if self._iterator is None:
            self._iterator = self._read()
        return next(self._iterator)

    def _read(self) -> Iterator[Any]:
        if self._crc_failed:
            yield from _UnreadableBatch(self._raw, "the batch's CRC does not match its bytes")
            return
        try:
            if not self._lenient:
                yield from self._batch  # legacy: a compressed set's wrapper carries its last offset
                return
            previous, last = self._batch.base_offset - 1, self._batch.next_offset - 1
            for record in self._batch:
                # aiokafka reads an offset delta as it comes; one outside the batch, or going back,
                # would be skipped or repeated by the fetcher, so such a batch is read leniently.
                if not previous < record.offset <= last:
                    raise ValueError(f"record offset {record.offset} outside {previous + 1}-{last}")
                previous = record.offset
                yield record
        except Exception as exc:
            # Records already yielded come again; the fetcher skips offsets below its position.
            failure = f"{type(exc).__name__}: {exc}"
            if self._lenient:
                yield from _tolerant_records(self._raw, failure)
            else:
                yield from _UnreadableBatch(self._raw, failure)


def _tolerant_records(raw: bytes, failure: str) -> Iterator[TolerantRecord]:
    """The batch's records read leniently; what cannot be read becomes stubs. A stub standing for a
    range of records sits at the range's last offset, so the fetcher never skips it."""
    batch = _DefaultRecordBatchPy(raw)
    first = batch.base_offset
    last = batch.next_offset - 1
    try:
        batch._maybe_uncompress()
    except Exception as exc:
        why = f"batch of offsets {first}-{last} unreadable: {type(exc).__name__}: {exc}"
        yield stub(last, batch.first_timestamp, batch.timestamp_type, why)
        return
    buffer, pos = batch._buffer, batch._pos
    expected = first  # the offset a record has when no compaction removed the ones before it
    for _ in range(batch._num_records):
        if expected > last:
            return  # every offset of the batch is accounted for: the rest claims offsets it cannot have
        try:
            record, pos = _read_record(batch, buffer, pos, expected)
        except _Unreadable as exc:
            if exc.next_pos is None:
                # Its length is unknown, so the rest of the batch cannot be found: one stub for it all.
                yield stub(last, batch.first_timestamp, batch.timestamp_type, f"{exc.why}; {failure}")
                return
            yield stub(exc.offset, batch.first_timestamp, batch.timestamp_type, f"{exc.why}; {failure}")
            pos, expected = exc.next_pos, exc.offset + 1
            continue
        expected = record.offset + 1
        yield record


class _Unreadable(Exception):
    def __init__(self, offset: int, next_pos: int | None, why: str) -> None:
        super().__init__(why)
        self.offset, self.next_pos, self.why = offset, next_pos, why


def _read_record(batch: Any, buffer: bytearray, pos: int, expected: int) -> tuple[TolerantRecord, int]:
    """One v2 record (Kafka's record format: length, attributes, deltas, key, value, headers)."""
    last = batch.next_offset - 1
    try:
        length, pos = decode_varint(buffer, pos)
    except (IndexError, ValueError) as exc:
        raise _Unreadable(expected, None, f"records {expected}-{last} unreadable") from exc
    end = pos + length
    if length < 0 or end > len(buffer):
        raise _Unreadable(expected, None, f"records {expected}-{last} unreadable: length {length}")
    offset = expected
    try:
        _attributes, pos = decode_varint(buffer, pos)
        ts_delta, pos = decode_varint(buffer, pos)
        offset_delta, pos = decode_varint(buffer, pos)
        if not expected <= batch.base_offset + offset_delta <= last:
            raise ValueError(f"offset delta {offset_delta} outside the batch")
        offset = batch.base_offset + offset_delta
        key, pos = _nullable_bytes(buffer, pos, end)
        value, pos = _nullable_bytes(buffer, pos, end)
        count, pos = decode_varint(buffer, pos)
        headers: list[tuple[str, bytes | None]] = []
        for _ in range(count):
            name, pos = _nullable_bytes(buffer, pos, end)
            if name is None:
                raise ValueError("null header key")
            header_value, pos = _nullable_bytes(buffer, pos, end)
            headers.append((name.decode("utf-8", "surrogateescape"), header_value))
        if pos != end:
            raise ValueError(f"{end - pos} bytes left inside the record")
    except (IndexError, ValueError) as exc:
        raise _Unreadable(offset, end, f"record at offset {offset} unreadable: {exc}") from exc
    if batch.timestamp_type == batch.LOG_APPEND_TIME:
        timestamp = batch.max_timestamp
    else:
        timestamp = batch.first_timestamp + ts_delta
    return TolerantRecord(offset, timestamp, batch.timestamp_type, key, value, headers), end


def _nullable_bytes(buffer: bytearray, pos: int, end: int) -> tuple[bytes | None, int]:
    size, pos = decode_varint(buffer, pos)
    if size < 0:
        return None, pos
    if pos + size > end:
        raise ValueError("field runs past the record")
    return bytes(buffer[pos : pos + size]), pos + size


def install() -> None:
    """Make the fetcher build its record sets with `TolerantMemoryRecords` (idempotent)."""
    current = getattr(fetcher, "MemoryRecords", None)
    if current is TolerantMemoryRecords:
        return
    if current is not MemoryRecords or not hasattr(fetcher.PartitionRecords, "_unpack_records"):
        raise RuntimeError(
            "aiokafka's fetcher no longer builds MemoryRecords as record_reader expects: "
            "check service/adapters/kafka/record_reader.py against the installed aiokafka"
        )
    fetcher.MemoryRecords = TolerantMemoryRecords
