"""Every fetched record reaches the service, whatever its bytes hold.

aiokafka's record reader (the C extension and the pure-Python path alike) decodes header keys as
strict UTF-8 and raises from `getmany` on the first record whose key is not: the partition can never
move past it, and the exception is not a `KafkaError`. The same reader refuses a record whose
structure is broken, and a batch in a codec the client lacks.

`install()` puts `TolerantMemoryRecords` where the fetcher builds its record sets. A compressed v2
batch is read by `compressed_batches.InflatingBatch`, inflated as a stream in bounded memory, and every
set one `getmany` drains counts against one inflation budget (`fetch_budget`). Other
batches are still read by aiokafka's own reader (the C extension, when present); only a batch on which
that reader fails is read again here, record by record, from the bytes the broker sent:
- a header key that is not UTF-8 is decoded with `surrogateescape`, so the original bytes survive
  (`header_key_bytes`) and the record is processed like any other;
- a record that cannot be parsed at all becomes a stub (`record_format.stub`: no key, no value, its
  first header says why), and a batch that cannot be read at all one stub whose value is the batch's
  raw bytes. A stub keeps the offset it stands for, so the consumer dead-letters it and moves past it.

This reaches into aiokafka's fetcher (`aiokafka.consumer.fetcher.MemoryRecords`): the version range
is pinned in pyproject.toml, `install()` refuses to run when the internals it relies on are missing,
and `tests/unit/test_record_reader.py` fails when an upgrade changes them.
"""

from __future__ import annotations

import functools
import inspect
import struct
from collections.abc import Iterator
from typing import Any

from aiokafka.consumer import fetcher
from aiokafka.record.default_records import DefaultRecordBatch, _DefaultRecordBatchPy
from aiokafka.record.legacy_records import LegacyRecordBatch
from aiokafka.record.memory_records import MemoryRecords

from service.adapters.kafka.batch_extent import AccountedBatch
from service.adapters.kafka.compressed_batches import InflatingBatch
from service.adapters.kafka.fetch_budget import SetBudget, current, draining
from service.adapters.kafka.record_format import (
    UNDECODABLE,
    TolerantRecord,
    Unreadable,
    base_offset,
    batch_stub,
    header_key_bytes,
    read_record,
    stub,
)

__all__ = ["UNDECODABLE", "TolerantMemoryRecords", "TolerantRecord", "header_key_bytes", "install", "stub"]

# The framing every message format shares: base offset (int64), length (int32), …, magic at byte 16.
_LOG_OVERHEAD = 12
_MAGIC_OFFSET = 16
_MIN_BATCH = 26  # the smallest legacy message set, aiokafka's own lower bound
_LAST_DELTA_OFFSET = 23  # v2: base offset, length, leader epoch, magic, CRC, attributes, then this
_V2 = 2
_ATTRIBUTES_OFFSET = 21  # v2: an int16; the codec is in the low bits of its second byte
_CODEC_MASK = 0x07


class TolerantMemoryRecords:
    """aiokafka's `MemoryRecords` with the same framing, whose batches never raise: a batch aiokafka
    cannot open, or whose CRC is wrong, becomes one stub; a v2 batch that fails while its records are
    read falls back to `_tolerant_records`."""

    def __init__(self, data: bytes) -> None:
        self._data = memoryview(data)
        self._next: tuple[int, int] | None = None
        self._pos = 0
        self._budget = SetBudget()
        self.log_end: int | None = None  # the partition's high watermark, when the fetcher says it
        self._previous: Any = None  # the last batch handed out: where the next one's offsets begin
        self._cache_next()

    def fetched_from(self, offset: int) -> None:
        """The offset this set was fetched from (told by the fetcher's `PartitionRecords`)."""
        self._budget.fetched_from = offset

    def size_in_bytes(self) -> int:
        return len(self._data)

    def has_next(self) -> bool:
        """A set the drain's inflation budget cut ends: the fetcher fetches the rest again."""
        return self._next is not None and not self._budget.spent

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
        # The next batch's base offset (a partial batch's too) bounds this one's extent, unless it
        # lies (`AccountedBatch`): then the one after it does, and this batch ends where it says.
        next_base, log_end = self._base_at(self._pos), self.log_end
        beyond = self._base_after(self._pos)
        if (
            next_base is not None
            and beyond is not None
            and log_end is not None
            and beyond < log_end <= next_base
        ):
            next_base, log_end = None, beyond
        after = self._budget.fetched_from - 1 if self._previous is None else self._previous.next_offset - 1
        if len(raw) >= _MIN_BATCH and raw[_MAGIC_OFFSET] < _V2:
            self._previous = self._legacy(raw)
        else:
            self._previous = AccountedBatch(self._v2(raw), bytes(raw), next_base, log_end, after)
        return self._previous

    def _base_at(self, pos: int) -> int | None:
        head = self._data[pos : pos + 8]
        return base_offset(bytes(head)) if len(head) == 8 else None

    def _base_after(self, pos: int) -> int | None:
        """The base offset of the batch after the one at `pos`, when the fetch holds it."""
        if len(self._data) - pos < _LOG_OVERHEAD:
            return None
        (length,) = struct.unpack_from(">i", self._data, pos + 8)
        return self._base_at(pos + _LOG_OVERHEAD + max(length, 0))

    def _legacy(self, raw: memoryview) -> Any:
        """No headers to decode, nothing to read leniently: a failure is a stub."""
        try:
            return _TolerantBatch(LegacyRecordBatch(raw, raw[_MAGIC_OFFSET]), bytes(raw), lenient=False)
        except Exception as exc:
            return _UnreadableBatch(bytes(raw), f"batch unreadable: {type(exc).__name__}: {exc}")

    def _v2(self, raw: memoryview) -> Any:
        try:
            if len(raw) < _MIN_BATCH:
                raise ValueError(f"{len(raw)} bytes, less than a batch's overhead")
            if raw[_ATTRIBUTES_OFFSET + 1] & _CODEC_MASK:
                return InflatingBatch(bytes(raw), self._budget)
            return _TolerantBatch(DefaultRecordBatch(raw), bytes(raw))
        except Exception as exc:
            return _UnreadableBatch(bytes(raw), f"batch unreadable: {type(exc).__name__}: {exc}")


class _UnreadableBatch:
    """A batch neither reader can open (or whose CRC is wrong): one stub, at its last offset, so the
    fetcher moves past all of it however far into it it was positioned."""

    producer_id = None
    is_control_batch = False
    is_transactional = False
    crc_failed = True  # nothing it says was checked

    def __init__(self, raw: bytes, why: str) -> None:
        self.why = why
        record = batch_stub(raw, why)
        self.base_offset = base_offset(raw)
        self.next_offset = record.offset + 1
        self._iterator = iter([record])

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
        self.crc_failed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._batch, name)

    def validate_crc(self) -> bool:
        """A wrong CRC is not raised (the fetcher would fetch the batch again forever): the batch is
        read as one stub instead, its records not trusted."""
        self.crc_failed = not self._batch.validate_crc()
        return True

    def __iter__(self) -> Iterator[Any]:
        return self._read()

    def __next__(self) -> Any:
        if self._iterator is None:
            self._iterator = self._read()
        return next(self._iterator)

    def _read(self) -> Iterator[Any]:
        if self.crc_failed:
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
    batch = _DefaultRecordBatchPy(raw)  # uncompressed: compressed batches are read by InflatingBatch
    first = batch.base_offset
    last = batch.next_offset - 1
    buffer, pos = batch._buffer, batch._pos
    expected = first  # the offset a record has when no compaction removed the ones before it
    for _ in range(batch._num_records):
        if expected > last:
            return  # every offset of the batch is accounted for: the rest claims offsets it cannot have
        try:
            record, pos = read_record(batch, buffer, pos, expected)
        except Unreadable as exc:
            if exc.next_pos is None:
                # Its length is unknown, so the rest of the batch cannot be found: one stub for it all.
                yield stub(last, batch.first_timestamp, batch.timestamp_type, f"{exc.why}; {failure}")
                return
            yield stub(exc.offset, batch.first_timestamp, batch.timestamp_type, f"{exc.why}; {failure}")
            pos, expected = exc.next_pos, exc.offset + 1
            continue
        expected = record.offset + 1
        yield record


class _TolerantFetchResult(fetcher.FetchResult):  # type: ignore[misc]
    """aiokafka's fetch result, which hands the partition's high watermark (set from the same fetch
    response, before the records are read) to the record set: the log end bounds its last batch. Once
    the drain's inflation budget is spent, its set is left unread for the next drain, which takes it
    first (the fetcher drains in the order its results arrived)."""

    def __init__(self, tp: Any, *, assignment: Any, partition_records: Any, backoff: Any) -> None:
        super().__init__(tp, assignment=assignment, partition_records=partition_records, backoff=backoff)
        records = getattr(partition_records, "_records", None)
        if isinstance(records, TolerantMemoryRecords):
            highwater = assignment.state_value(tp).highwater
            records.log_end = highwater if isinstance(highwater, int) and highwater >= 0 else None

    def getall(self, max_records: int | None = None) -> list[Any]:
        budget = current()
        if budget is not None and budget.exhausted():
            return []
        records: list[Any] = super().getall(max_records)
        return records


def _aiokafka_as_expected() -> bool:
    result = getattr(fetcher, "FetchResult", None)
    drain = getattr(getattr(fetcher, "Fetcher", None), "fetched_records", None)
    return (
        getattr(fetcher, "MemoryRecords", None) is MemoryRecords
        and hasattr(fetcher.PartitionRecords, "_unpack_records")
        and result is not None
        and list(inspect.signature(result.__init__).parameters)[1:]
        == ["tp", "assignment", "partition_records", "backoff"]
        and hasattr(result, "getall")
        and drain is not None
        and inspect.iscoroutinefunction(drain)
        and list(inspect.signature(drain).parameters)[1:] == ["partitions", "timeout", "max_records"]
    )


def install() -> None:
    """Make the fetcher build its record sets with `TolerantMemoryRecords`, tell them the log end,
    and count every set one drain (`getmany`) reads against one inflation budget (idempotent)."""
    if fetcher.MemoryRecords is TolerantMemoryRecords:
        return
    if not _aiokafka_as_expected():
        raise RuntimeError(
            "aiokafka's fetcher no longer builds MemoryRecords as record_reader expects: "
            "check service/adapters/kafka/record_reader.py against the installed aiokafka"
        )
    unpack = getattr(
        fetcher.PartitionRecords._unpack_records, "__wrapped__", fetcher.PartitionRecords._unpack_records
    )
    drain = getattr(fetcher.Fetcher.fetched_records, "__wrapped__", fetcher.Fetcher.fetched_records)

    @functools.wraps(unpack)
    def unpack_counted(self: Any) -> Any:
        # Before the first batch is read: the set counts inflated bytes from the fetched offset on.
        if isinstance(self._records, TolerantMemoryRecords):
            self._records.fetched_from(self.next_fetch_offset)
        return unpack(self)

    @functools.wraps(drain)
    async def drain_budgeted(self: Any, *args: Any, **kwargs: Any) -> Any:
        with draining():
            return await drain(self, *args, **kwargs)

    fetcher.PartitionRecords._unpack_records = unpack_counted
    fetcher.Fetcher.fetched_records = drain_budgeted
    fetcher.MemoryRecords = TolerantMemoryRecords
    fetcher.FetchResult = _TolerantFetchResult
