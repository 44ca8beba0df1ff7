"""The tolerant record reader: any batch the broker sends gives one record (or stub) per offset.

These tests build batches byte for byte and read them through aiokafka's own `PartitionRecords`, the
fetcher code `getmany` runs, with the C extension on. The first tests pin aiokafka's behaviour and
internals that `record_reader` relies on: when an upgrade changes them, they fail here first.
"""

from __future__ import annotations

import inspect
import struct

import aiokafka.consumer.fetcher as fetcher
import pytest
from aiokafka.record.default_records import DefaultRecordBatch, _DefaultRecordBatchPy
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.record.util import calc_crc32c
from aiokafka.structs import TopicPartition
from hypothesis import given, settings
from hypothesis import strategies as st

from service.adapters.kafka import record_reader
from service.adapters.kafka.record_reader import UNDECODABLE, TolerantMemoryRecords, header_key_bytes
from tests.support.raw_records import raw_batch

TP = TopicPartition("task.finished", 3)
BAD_KEY = b"\xff\xfebad"


def read(data: bytes, fetch_offset: int = 0, check_crcs: bool = True) -> list[object]:
    """What the fetcher hands to `getmany` for one partition's fetched bytes."""
    records = fetcher.PartitionRecords(
        TP, TolerantMemoryRecords(data), [], fetch_offset, None, None, check_crcs, fetcher.READ_UNCOMMITTED
    )
    return list(records)


def test_the_c_extension_is_what_the_service_reads_with() -> None:
    assert "_crecords" in MemoryRecords.__module__ and "_crecords" in DefaultRecordBatch.__module__


@pytest.mark.parametrize("reader", [MemoryRecords, fetcher.PartitionRecords])
def test_aiokafka_itself_still_refuses_a_header_key_that_is_not_utf8(reader: object) -> None:
    """If this starts passing, aiokafka fixed its reader and record_reader may be retired."""
    data = raw_batch([(b"k", b"v", [(BAD_KEY, b"x")])])
    with pytest.raises(UnicodeDecodeError):
        if reader is MemoryRecords:
            list(MemoryRecords(data).next_batch())  # type: ignore[arg-type]
        else:
            list(fetcher.PartitionRecords(TP, MemoryRecords(data), [], 0, None, None, True, 0))


def test_the_aiokafka_internals_the_reader_relies_on_are_there() -> None:
    params = list(inspect.signature(fetcher.PartitionRecords.__init__).parameters)
    assert params[1:3] == ["tp", "records"]
    assert hasattr(fetcher.PartitionRecords, "_unpack_records")
    # One drain (`getmany`) is one call, in the caller's task, that reads each set through `getall`.
    drain = fetcher.Fetcher.fetched_records
    assert inspect.iscoroutinefunction(drain) and hasattr(fetcher.FetchResult, "getall")
    assert list(inspect.signature(drain).parameters)[1:] == ["partitions", "timeout", "max_records"]
    batch = _DefaultRecordBatchPy(raw_batch([(b"k", b"v", [])]))
    batch._maybe_uncompress()
    assert (batch._pos, batch._num_records) == (61, 1) and isinstance(batch._buffer, bytearray)


def test_install_swaps_the_fetchers_record_sets_once_and_refuses_unknown_internals(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fetcher, "MemoryRecords", MemoryRecords)
    record_reader.install()
    record_reader.install()
    assert fetcher.MemoryRecords is TolerantMemoryRecords
    monkeypatch.setattr(fetcher, "MemoryRecords", object)
    with pytest.raises(RuntimeError, match="record_reader"):
        record_reader.install()


def test_a_header_key_that_is_not_utf8_reaches_the_service_with_its_bytes() -> None:
    data = raw_batch(
        [(b"a", b"1", [(b"ok", b"x")]), (b"b", b"2", [(BAD_KEY, None), (b"k", b"v")]), (b"c", b"3", [])],
        base_offset=40,
    )
    records = read(data, fetch_offset=40)
    assert [r.offset for r in records] == [40, 41, 42]  # type: ignore[attr-defined]
    assert [r.value for r in records] == [b"1", b"2", b"3"]  # type: ignore[attr-defined]
    headers = records[1].headers  # type: ignore[attr-defined]
    assert [(header_key_bytes(k), v) for k, v in headers] == [(BAD_KEY, None), (b"k", b"v")]


def test_records_before_the_fetch_position_are_not_repeated_after_the_fallback() -> None:
    data = raw_batch([(b"a", b"1", []), (b"b", b"2", []), (b"c", b"3", [(BAD_KEY, b"")])], base_offset=10)
    assert [r.offset for r in read(data, fetch_offset=11)] == [11, 12]  # type: ignore[attr-defined]


def corrupt_second_record(data: bytes) -> bytes:
    """Claims 5 headers in record 1 where it has none: its structure breaks, its length does not."""
    batch = _DefaultRecordBatchPy(data)
    batch._maybe_uncompress()
    body = bytearray(data)
    first_len = body[61] >> 1  # a one-byte zigzag varint for these short records
    second = 61 + 1 + first_len
    second_len = body[second] >> 1
    body[second + second_len] = 10  # the header count, the record's last byte: zigzag 5
    return bytes(body)


def test_a_record_that_cannot_be_parsed_becomes_a_stub_at_its_offset_and_the_rest_follow() -> None:
    data = corrupt_second_record(raw_batch([(b"a", b"1", []), (b"b", b"2", []), (b"c", b"3", [])], 7))
    records = read(data, fetch_offset=7, check_crcs=False)
    assert [r.offset for r in records] == [7, 8, 9]  # type: ignore[attr-defined]
    stub = records[1]
    assert stub.value is None and stub.key is None  # type: ignore[attr-defined]
    (name, why), (_mark, reason) = stub.headers  # type: ignore[attr-defined]
    assert reason == b"undecodable_record"
    assert name == UNDECODABLE and b"record at offset 8 unreadable" in why
    assert records[2].value == b"3"  # type: ignore[attr-defined]


@pytest.mark.parametrize(("codec", "why"), [(5, b"codec 5 is not one"), (3, b"lz4 stream unreadable")])
def test_a_batch_that_cannot_be_inflated_is_one_stub_carrying_its_raw_bytes(codec: int, why: bytes) -> None:
    data = bytearray(raw_batch([(b"a", b"1", []), (b"b", b"2", [])], base_offset=100))
    attributes = _DefaultRecordBatchPy.ATTRIBUTES_OFFSET
    struct.pack_into(">h", data, attributes, codec)  # an unknown codec, or lz4 over bytes that are not
    records = read(bytes(data), fetch_offset=100, check_crcs=False)
    assert [r.offset for r in records] == [101]  # type: ignore[attr-defined]
    stub = records[0]
    assert stub.value == bytes(data) and stub.key is None  # type: ignore[attr-defined]
    assert b"offsets 100-101" in stub.headers[0][1] and why in stub.headers[0][1]  # type: ignore[attr-defined]
    assert stub.headers[2] == ("x-dlq-offsets", b"100-101")  # type: ignore[attr-defined]


def with_crc(data: bytearray) -> bytes:
    attributes = _DefaultRecordBatchPy.ATTRIBUTES_OFFSET
    struct.pack_into(">I", data, _DefaultRecordBatchPy.CRC_OFFSET, calc_crc32c(bytes(data[attributes:])))
    return bytes(data)


def test_a_batch_whose_crc_is_wrong_is_one_stub_and_the_next_batch_follows() -> None:
    """aiokafka raises a wrong CRC from `getmany` again at every fetch: the partition would never move."""
    bad = bytearray(raw_batch([(b"a", b"1", []), (b"b", b"2", []), (b"c", b"3", [])], base_offset=10))
    bad[-1] ^= 0xFF
    good = raw_batch([(b"d", b"4", [])], base_offset=13)
    records = read(bytes(bad) + good, fetch_offset=11)  # positioned inside the bad batch
    assert [r.offset for r in records] == [12, 13]  # type: ignore[attr-defined]
    assert b"offsets 10-12" in records[0].headers[0][1] and b"CRC" in records[0].headers[0][1]  # type: ignore[attr-defined]
    assert records[1].value == b"4"  # type: ignore[attr-defined]


def test_a_batch_neither_reader_can_open_is_one_stub_and_reading_goes_on() -> None:
    bad = bytearray(raw_batch([(b"a", b"1", []), (b"b", b"2", [])], base_offset=20))
    bad[16] = 1  # says the legacy format, which these bytes are not
    data = bytes(bad) + raw_batch([(b"c", b"3", [])], base_offset=22)
    records = read(data, fetch_offset=20, check_crcs=False)
    assert [r.offset for r in records] == [20, 22]  # type: ignore[attr-defined]
    assert records[0].headers[0][0] == UNDECODABLE and records[1].value == b"3"  # type: ignore[attr-defined]


def test_a_length_too_short_for_a_batch_ends_the_set_with_a_stub() -> None:
    bad = bytearray(raw_batch([(b"a", b"1", [])], base_offset=30))
    struct.pack_into(">i", bad, 8, 13)
    records = read(bytes(bad) + raw_batch([(b"c", b"3", [])], base_offset=31), fetch_offset=30)
    assert [(r.offset, r.headers[0][0]) for r in records] == [(30, UNDECODABLE)]  # type: ignore[attr-defined]


def test_records_claiming_offsets_outside_their_batch_make_no_stub_outside_it() -> None:
    """Offset deltas 0, 2, 1 (a producer's bug a broker may not catch): nothing lands past offset 2."""
    data = bytearray(raw_batch([(b"a", b"0", []), (b"b", b"1", []), (b"c", b"2", [])], base_offset=0))
    batch = _DefaultRecordBatchPy(bytes(data))
    batch._maybe_uncompress()
    pos = batch._pos
    first_len = data[pos] >> 1
    second = pos + 1 + first_len
    data[second + 3], data[second + 1 + (data[second] >> 1) + 3] = 4, 2  # deltas 1 → 2 and 2 → 1
    offsets = [r.offset for r in read(with_crc(data), fetch_offset=0)]  # type: ignore[attr-defined]
    assert offsets == sorted(set(offsets)) and max(offsets) <= 2


def test_no_reserved_name_can_come_off_the_wire() -> None:
    """The stub's header name starts with a high surrogate: no decoding of bytes produces one."""
    with pytest.raises(UnicodeEncodeError):
        header_key_bytes(UNDECODABLE)
    for raw in (b"\xed\xa0\x80undecodable-record", b"\xff" + UNDECODABLE.encode("utf-8", "surrogatepass")):
        assert raw.decode("utf-8", "surrogateescape") != UNDECODABLE


headers = st.lists(st.tuples(st.binary(max_size=12), st.none() | st.binary(max_size=12)), max_size=4)
records = st.lists(
    st.tuples(st.none() | st.binary(max_size=16), st.none() | st.binary(max_size=64), headers),
    min_size=1,
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(records=records, base=st.integers(0, 2**40))
def test_any_batch_of_well_formed_records_is_read_back_exactly(
    records: list[tuple[bytes | None, bytes | None, list[tuple[bytes, bytes | None]]]], base: int
) -> None:
    read_back = read(raw_batch(records, base_offset=base), fetch_offset=base)
    assert [r.offset for r in read_back] == [base + i for i in range(len(records))]  # type: ignore[attr-defined]
    assert [
        (r.key, r.value, [(header_key_bytes(k), v) for k, v in r.headers])  # type: ignore[attr-defined]
        for r in read_back
    ] == records


@settings(max_examples=300, deadline=None)
@given(records=records, position=st.integers(61, 10_000), byte=st.integers(0, 255))
def test_a_damaged_batch_never_raises_and_never_goes_back(
    records: list[tuple[bytes | None, bytes | None, list[tuple[bytes, bytes | None]]]],
    position: int,
    byte: int,
) -> None:
    """Damage past the CRC check (a broker storing what a broken producer sent, CRC and all).

    Damage that aiokafka's reader does not notice may move an offset forwards (a broker validates
    offsets, this test does not); the property is that reading never fails and never goes back."""
    data = bytearray(raw_batch(records, base_offset=500))
    data[61 + position % (len(data) - 61)] = byte
    read_back = read(bytes(data), fetch_offset=500, check_crcs=False)
    offsets = [r.offset for r in read_back]  # type: ignore[attr-defined]
    assert offsets == sorted(set(offsets))
    assert offsets and offsets[0] >= 500
