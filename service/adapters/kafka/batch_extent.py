"""A v2 batch's offsets, each accounted for by a record or a stub naming it, within what was read.

A batch's header says where it ends (`lastOffsetDelta`), but that field lies when a broker stores
what a broken producer sent (Tansu validates nothing) or a log is damaged. The fetcher moves its
position to the batch's `next_offset` after reading it and skips every later record below that
position, so a batch claiming too much hides the good batches after it and sends the committed offset
past the log end, and one claiming too little leaves offsets no one names. Here the batch's extent
comes from the bytes around it:
- it ends before the next batch's base offset in the same fetch; the last batch of a fetch ends
  before the partition's log end (its high watermark), and within its own `lastOffsetDelta` when
  its CRC held;
- a batch whose CRC failed is trusted for nothing inside the CRC (records, `lastOffsetDelta`, the
  control bit): one stub covers its whole extent, carrying its raw bytes;
- offsets of the extent no record claims (a gap, a tail past a low `lastOffsetDelta`) become a stub
  naming them; records claiming offsets past the extent are dropped, logged with their count;
- a control batch holding anything but commit and abort markers is not skipped: each ordinary record
  in it is dead-lettered as a stub with its value.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterator
from typing import Any

import structlog

from service.adapters.kafka.record_format import STUB_OFFSETS, TolerantRecord, base_offset, batch_stub, stub

log = structlog.get_logger(__name__)

_CONTROL_KEY = struct.Struct(">hh")  # version 0, then type: 0 abort, 1 commit


def first_offset(record: Any) -> int:
    """The first offset a record accounts for: a stub for a range names it in a header."""
    for name, value in record.headers:
        if name == STUB_OFFSETS and value:
            return int(value.split(b"-")[0])
    return int(record.offset)


class AccountedBatch:
    """A v2 batch read by `inner` (which never raises), bounded to the extent the bytes around it
    allow: the next batch's base offset in the fetch and the partition's log end, when known."""

    def __init__(
        self, inner: Any, raw: bytes, next_base: int | None, log_end: int | None, after: int = -1
    ) -> None:
        """`after`: the last offset the fetch accounted for before this batch."""
        self._inner = inner
        self._raw = raw
        self.base_offset = int(inner.base_offset)
        self._declared = max(int(inner.next_offset) - 1, self.base_offset)
        self._allowed = _last_allowed(self.base_offset, next_base, log_end)
        self._iterator: Iterator[Any] | None = None
        self._records: list[Any] | None = None  # a control batch's, read once to check them
        # The base offset sits outside the CRC: one past the log end, with the next batch below the
        # log end, is damage. The batch then holds only the offsets between its neighbours.
        self._base_lies = (
            next_base is not None and log_end is not None and next_base < log_end <= self.base_offset
        )
        if self._base_lies and next_base is not None:
            self.base_offset = after + 1
            self._allowed = self.end = max(next_base - 1, after)
        elif next_base is not None and self._allowed == next_base - 1:
            self.end = self._allowed  # every offset up to the next batch is this one's
        else:  # the last of a fetch ends where it says, or at the log end
            self.end = self._declared if self._allowed is None else min(self._declared, self._allowed)

    @property
    def crc_failed(self) -> bool:
        return self._base_lies or bool(getattr(self._inner, "crc_failed", True))

    @property
    def producer_id(self) -> int | None:
        """read_committed asks it to skip aborted transactions; a batch failing its CRC names none."""
        return None if self.crc_failed else self._inner.producer_id

    @property
    def is_transactional(self) -> bool:
        return not self.crc_failed and bool(self._inner.is_transactional)

    @property
    def next_offset(self) -> int:
        cut = getattr(self._inner, "cut", None)
        return int(cut) if cut is not None else self.end + 1

    @property
    def is_control_batch(self) -> bool:
        if self.crc_failed or not self._inner.is_control_batch:
            return False
        return all(_is_marker(r) for r in self._control_records())

    def validate_crc(self) -> bool:
        self._inner.validate_crc()
        if self.crc_failed:  # nothing inside the CRC is believed, its length least of all
            self.end = self._allowed if self._allowed is not None else self.base_offset
        return True

    def __iter__(self) -> Iterator[Any]:
        return self._read()

    def __next__(self) -> Any:
        if self._iterator is None:
            self._iterator = self._read()
        return next(self._iterator)

    def _control_records(self) -> list[Any]:
        if self._records is None:
            self._records = list(self._inner)
        return self._records

    def _read(self) -> Iterator[Any]:
        if self.crc_failed:
            if self.end < self.base_offset:
                return  # a batch with a lying base between adjacent batches holds no offset
            why = getattr(self._inner, "why", "the batch's CRC does not match its bytes")
            if self._base_lies:
                why = f"its base offset {base_offset(self._raw)} lies past the log end"
            yield batch_stub(self._raw, why, first=self.base_offset, last=self.end)
            return
        control = bool(self._inner.is_control_batch)
        if control and self.is_control_batch:
            # Only read_committed reads a marker batch (for its abort marker); it is skipped after.
            yield from self._control_records()
            return
        expected, beyond = self.base_offset, 0
        for read in self._control_records() if control else self._inner:
            record = read
            if record.offset > self.end:
                if first_offset(record) > self.end:
                    beyond += 1
                    continue
                record = _ending_at(record, self.end)  # a stub for a range claiming too much
            if record.offset < expected:
                continue  # read again after the inner reader fell back to reading leniently
            if first_offset(record) > expected:
                yield self._gap(expected, first_offset(record) - 1, "no record of the batch claims them")
            expected = record.offset + 1
            if control and _is_marker(record):
                continue
            yield self._ordinary_in_control(record) if control else record
        if beyond:
            log.warning(
                "records_outside_their_batch",
                count=beyond,
                batch=f"{self.base_offset}-{self.end}",
                claimed_last=self._declared,
            )
        if getattr(self._inner, "cut", None) is None and expected <= self.end:
            yield self._gap(expected, self.end, "the batch's records end before its offsets do", raw=True)

    def _gap(self, first: int, last: int, why: str, raw: bool = False) -> TolerantRecord:
        if raw:
            return batch_stub(self._raw, why, first=first, last=last)
        span = f"{first}-{last}"
        return stub(last, -1, 0, f"offsets {span}: {why}", headers=[(STUB_OFFSETS, span.encode())])

    def _ordinary_in_control(self, record: Any) -> TolerantRecord:
        why = f"record at offset {record.offset} is not a transaction marker but sits in a control batch"
        return stub(record.offset, record.timestamp, record.timestamp_type, why, value=record.value)


def _ending_at(record: TolerantRecord, last: int) -> TolerantRecord:
    span = f"{first_offset(record)}-{last}".encode()
    headers = [(k, span if k == STUB_OFFSETS else v) for k, v in record.headers]
    return dataclasses.replace(record, offset=last, headers=headers)


def _last_allowed(base: int, next_base: int | None, log_end: int | None) -> int | None:
    if next_base is not None and next_base > base:
        return next_base - 1
    if log_end is not None and log_end > base:
        return log_end - 1
    return None


def _is_marker(record: Any) -> bool:
    key = record.key
    if key is None or len(key) != _CONTROL_KEY.size:
        return False
    version, kind = _CONTROL_KEY.unpack(key)
    return bool(version == 0 and kind in (0, 1))
