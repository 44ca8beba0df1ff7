"""Kafka's v2 record read leniently from bytes, and the stubs that stand for what cannot be read.

A stub has no key and keeps the offset of what it stands for, so the consumer dead-letters it and
moves past it; its reason and why travel in headers no record on the wire can carry.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka.record.util import decode_varint

from service.core.labels import DeadLetterReason

# Names no record on the wire can carry: they start with a high surrogate, which neither strict nor
# `surrogateescape` decoding produces. A stub's first header is UNDECODABLE (why), then STUB_REASON.
UNDECODABLE = "\ud800undecodable-record"
STUB_REASON = "\ud800stub-reason"
MARKS = frozenset({UNDECODABLE, STUB_REASON})
# The framing every message format shares: base offset (int64), length (int32), …, magic at byte 16;
# v2 then has the CRC, the attributes and the last offset delta.
_MAGIC_OFFSET = 16
_LAST_DELTA_OFFSET = 23
_V2 = 2
# A stub standing for a range of offsets names it in this header, "first-last".
STUB_OFFSETS = "x-dlq-offsets"
Headers = Sequence[tuple[str, bytes | None]]


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


def stub(
    offset: int,
    timestamp: int,
    timestamp_type: int,
    why: str,
    reason: str = DeadLetterReason.UNDECODABLE_RECORD,
    value: bytes | None = None,
    headers: Headers = (),
) -> TolerantRecord:
    """A record standing for what could not be read: its first header says why, `reason` is the dead
    letter's reason, `value` the raw bytes it stands for when they can be kept."""
    marks: list[tuple[str, bytes | None]] = [(UNDECODABLE, why.encode()), (STUB_REASON, reason.encode())]
    return TolerantRecord(offset, timestamp, timestamp_type, None, value, [*marks, *headers])


def base_offset(raw: bytes) -> int:
    return int(struct.unpack_from(">q", raw)[0]) if len(raw) >= 8 else 0


def batch_stub(
    raw: bytes,
    why: str,
    reason: str = DeadLetterReason.UNDECODABLE_RECORD,
    first: int | None = None,
    last: int | None = None,
) -> TolerantRecord:
    """One stub for a batch's offsets from `first` (its base by default) to `last`, at the last one
    (so the fetcher moves past all of it however far into it it was positioned), carrying the batch's
    raw bytes. Without `last`, the batch's header says where it ends (`batch_extent` bounds it)."""
    base = base_offset(raw)
    last_delta = -1
    if len(raw) >= _LAST_DELTA_OFFSET + 4 and raw[_MAGIC_OFFSET] >= _V2:
        (last_delta,) = struct.unpack_from(">i", raw, _LAST_DELTA_OFFSET)
    start = base if first is None else first
    last = max(base + max(last_delta, 0) if last is None else last, start)
    span = f"{start}-{last}"
    return stub(last, -1, 0, f"offsets {span}: {why}", reason, bytes(raw), [(STUB_OFFSETS, span.encode())])


class Unreadable(Exception):
    def __init__(self, offset: int, next_pos: int | None, why: str) -> None:
        super().__init__(why)
        self.offset, self.next_pos, self.why = offset, next_pos, why


def read_record(batch: Any, buffer: bytearray, pos: int, expected: int) -> tuple[TolerantRecord, int]:
    """One v2 record (Kafka's record format: length, attributes, deltas, key, value, headers)."""
    last = batch.next_offset - 1
    try:
        length, pos = decode_varint(buffer, pos)
    except (IndexError, ValueError) as exc:
        raise Unreadable(expected, None, f"records {expected}-{last} unreadable") from exc
    end = pos + length
    if length < 0 or end > len(buffer):
        raise Unreadable(expected, None, f"records {expected}-{last} unreadable: length {length}")
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
        raise Unreadable(offset, end, f"record at offset {offset} unreadable: {exc}") from exc
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
