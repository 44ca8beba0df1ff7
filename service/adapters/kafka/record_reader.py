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
from aiokafka.record.default_records import _DefaultRecordBatchPy
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.record.util import decode_varint

UNDECODABLE = "\ud800undecodable-record"
_LOG_OVERHEAD = 12  # base offset (int64) + batch length (int32), the same in every message format
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
    """aiokafka's `MemoryRecords`, whose v2 batches fall back to `_tolerant_records` on a failure."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._records = MemoryRecords(data)
        self._pos = 0

    def size_in_bytes(self) -> int:
        return int(self._records.size_in_bytes())

    def has_next(self) -> bool:
        return bool(self._records.has_next())

    def next_batch(self) -> Any:
        batch = self._records.next_batch()
        if batch is None:
            return None
        start = self._pos
        (length,) = struct.unpack_from(">i", self._data, start + 8)
        self._pos = start + _LOG_OVERHEAD + length
        if batch.magic < _V2:
            return batch  # the legacy formats have no headers; their reader is left as it is
        return _TolerantBatch(batch, self._data[start : self._pos])


class _TolerantBatch:
    """Delegates to aiokafka's batch; iterating it never raises."""

    def __init__(self, batch: Any, raw: bytes) -> None:
        self._batch = batch
        self._raw = raw
        self._iterator: Iterator[Any] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._batch, name)

    def __iter__(self) -> Iterator[Any]:
        return self._read()

    def __next__(self) -> Any:
        if self._iterator is None:
            self._iterator = self._read()
        return next(self._iterator)

    def _read(self) -> Iterator[Any]:
        try:
            yield from self._batch
        except Exception as exc:
            # Records already yielded come again; the fetcher skips offsets below its position.
            yield from _tolerant_records(self._raw, f"{type(exc).__name__}: {exc}")


def _tolerant_records(raw: bytes, failure: str) -> Iterator[TolerantRecord]:
    """The batch's records read leniently; what cannot be read becomes stubs."""
    batch = _DefaultRecordBatchPy(raw)
    first = batch.base_offset
    last = batch.next_offset - 1
    try:
        batch._maybe_uncompress()
    except Exception as exc:
        why = f"batch of offsets {first}-{last} unreadable: {type(exc).__name__}: {exc}"
        yield stub(first, batch.first_timestamp, batch.timestamp_type, why)
        return
    buffer, pos = batch._buffer, batch._pos
    expected = first  # the offset a record has when no compaction removed the ones before it
    for _ in range(batch._num_records):
        try:
            record, pos = _read_record(batch, buffer, pos, expected)
        except _Unreadable as exc:
            yield stub(exc.offset, batch.first_timestamp, batch.timestamp_type, f"{exc.why}; {failure}")
            if exc.next_pos is None:
                return  # its length is unknown, so the rest of the batch cannot be found
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
