"""Compressed batches of every codec, read through aiokafka's fetcher as `getmany` reads them: every
record back exactly, a record past the size limit a stub at its own offset that is never held whole,
and a fetch that inflates past its budget resumed where it stopped."""

from __future__ import annotations

import asyncio
import tracemalloc

import aiokafka.consumer.fetcher as fetcher
import cramjam
import pytest
from aiokafka.consumer.subscription_state import SubscriptionState
from aiokafka.record.default_records import _DefaultRecordBatchPy
from aiokafka.structs import TopicPartition
from hypothesis import given, settings
from hypothesis import strategies as st

from service.adapters.kafka.fetch_budget import FETCH_INFLATED_BYTES, draining
from service.adapters.kafka.inflate import GZIP, LZ4, SNAPPY, ZSTD
from service.adapters.kafka.record_format import STUB_REASON, UNDECODABLE, header_key_bytes
from service.adapters.kafka.record_reader import TolerantMemoryRecords, install
from tests.support.raw_records import raw_batch, with_crc

TP = TopicPartition("task.finished", 0)
CODECS = [GZIP, SNAPPY, LZ4, ZSTD]


def read(data: bytes, fetch_offset: int = 0) -> tuple[list[object], int]:
    """The records the fetcher hands to `getmany`, and the offset it fetches from next."""
    install()  # as the consumer runs it: the fetcher tells each set the offset it fetched from
    records = fetcher.PartitionRecords(
        TP, TolerantMemoryRecords(data), [], fetch_offset, None, None, True, fetcher.READ_UNCOMMITTED
    )
    return list(records), records.next_fetch_offset


headers = st.lists(st.tuples(st.binary(max_size=12), st.none() | st.binary(max_size=12)), max_size=3)
records = st.lists(
    st.tuples(st.none() | st.binary(max_size=16), st.none() | st.binary(max_size=300), headers),
    min_size=1,
    max_size=10,
)


@settings(max_examples=60, deadline=None)
@given(records=records, base=st.integers(0, 2**40), codec=st.sampled_from(CODECS))
def test_any_compressed_batch_is_read_back_exactly(
    records: list[tuple[bytes | None, bytes | None, list[tuple[bytes, bytes | None]]]], base: int, codec: int
) -> None:
    read_back, next_offset = read(raw_batch(records, base_offset=base, compression=codec), base)
    assert [r.offset for r in read_back] == [base + i for i in range(len(records))]  # type: ignore[attr-defined]
    assert [
        (r.key, r.value, [(header_key_bytes(k), v) for k, v in r.headers])  # type: ignore[attr-defined]
        for r in read_back
    ] == records
    assert next_offset == base + len(records)


@pytest.mark.parametrize("codec", CODECS)
def test_a_record_past_the_limit_is_a_stub_at_its_offset_and_never_held_whole(codec: int) -> None:
    bomb = b"\x00" * (20 * 1024 * 1024)
    data = raw_batch([(b"a", b"1", []), (b"b", bomb, []), (b"c", b"3", [])], 40, compression=codec)
    del bomb
    tracemalloc.start()
    try:
        read_back, _ = read(data, 40)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # The 20 MiB value was inflated a piece at a time and dropped: what is held is the batch's
    # compressed bytes and a few pieces, not the record.
    assert peak < len(data) + 2 * 1024 * 1024
    assert [(r.offset, r.value) for r in read_back] == [(40, b"1"), (41, None), (42, b"3")]  # type: ignore[attr-defined]
    marks = dict(read_back[1].headers)  # type: ignore[attr-defined]
    assert marks[STUB_REASON] == b"payload_too_large"
    assert b"record at offset 41 inflates to" in (marks[UNDECODABLE] or b"")


def test_a_raw_snappy_block_stating_too_much_is_one_stub_with_the_batch_bytes() -> None:
    """Snappy without Java's framing is one block, inflated whole: its stated size is checked first."""
    data = bytearray(raw_batch([(b"a", b"x" * (FETCH_INFLATED_BYTES + 1), [])], 7))
    plain = _DefaultRecordBatchPy(bytes(data))
    plain._maybe_uncompress()
    body = bytes(cramjam.snappy.compress_raw(bytes(plain._buffer[plain._pos :])))
    squeezed = bytearray(data[:61] + body)
    squeezed[22] |= SNAPPY  # the codec bits
    squeezed[8:12] = (len(squeezed) - 12).to_bytes(4, "big")
    read_back, next_offset = read(with_crc(squeezed), 7)
    [stub] = read_back
    assert stub.offset == 7 and stub.value == with_crc(squeezed)  # type: ignore[attr-defined]
    assert dict(stub.headers)[STUB_REASON] == b"payload_too_large"  # type: ignore[attr-defined]
    assert next_offset == 8


@pytest.mark.parametrize("codec", [GZIP, ZSTD])
def test_a_fetch_that_inflates_past_its_budget_stops_and_the_next_fetch_resumes(codec: int) -> None:
    value = b"v" * (1024 * 1024)
    count = 2 * FETCH_INFLATED_BYTES // len(value) + 3
    data = raw_batch([(b"k", value, []) for _ in range(count)], 100, compression=codec)
    first, resume = read(data, 100)
    assert 0 < len(first) < count and resume == 100 + len(first)
    assert sum(len(r.value) for r in first) <= FETCH_INFLATED_BYTES + len(value)  # type: ignore[attr-defined]
    offsets = [r.offset for r in first]  # type: ignore[attr-defined]
    while resume < 100 + count:  # the broker sends the same batch again; the fetcher skips what it read
        more, after = read(data, resume)
        assert more and after > resume
        offsets += [r.offset for r in more]  # type: ignore[attr-defined]
        resume = after
    assert offsets == list(range(100, 100 + count))


def test_a_batch_fetched_again_from_before_its_cut_is_counted_again() -> None:
    """After a rebalance (or a restart of the partition) the fetcher reads from the committed
    offset, below where an earlier fetch cut the batch. The records it yields again are held
    again; counted from the remembered cut instead, they slipped past the budget whole."""
    value = b"v" * (1024 * 1024)
    count = 3 * FETCH_INFLATED_BYTES // len(value)
    data = raw_batch([(b"k", value, []) for _ in range(count)], 500, compression=GZIP)
    resume = 500
    for _ in range(2):  # two fetches, each cut where its budget ended
        _read, resume = read(data, resume)
    again, _ = read(data, 500)  # the partition is fetched again from its committed offset
    assert sum(len(r.value) for r in again) <= FETCH_INFLATED_BYTES + len(value)  # type: ignore[attr-defined]
    assert [r.offset for r in again] == list(range(500, 500 + len(again)))  # type: ignore[attr-defined]


def test_the_record_sets_of_one_drain_share_its_budget() -> None:
    """`getmany` drains every partition's set: once the first spends the drain's budget, the next
    yields nothing and is fetched again from where it stood."""
    value = b"v" * (1024 * 1024)
    count = FETCH_INFLATED_BYTES // len(value) + 3
    data = raw_batch([(b"k", value, []) for _ in range(count)], 0, compression=GZIP)
    with draining():
        first, cut = read(data, 0)
        second, resume = read(data, 0)
    assert 0 < len(first) < count and cut == len(first)
    assert (second, resume) == ([], 0)
    with draining():  # the next drain has a budget of its own
        again, _ = read(data, 0)
    assert len(again) == len(first)


async def test_drains_in_two_tasks_each_have_their_own_budget() -> None:
    """Two consumers in one process (the service's and a replay's) drain in their own tasks: one
    drain opened before another and read after it is spent still has its whole budget."""
    value = b"v" * (1024 * 1024)
    data = raw_batch([(b"k", value, []) for _ in range(FETCH_INFLATED_BYTES // len(value) + 3)], 0, GZIP)
    opened, spent, done = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def earlier() -> int:
        with draining():
            opened.set()
            await spent.wait()
            read_back, _ = read(data, 0)
        done.set()
        return len(read_back)

    async def later() -> int:
        await opened.wait()
        with draining() as budget:
            read_back, _ = read(data, 0)
            spent.set()
            await done.wait()
            assert budget.exhausted()
        return len(read_back)

    first, second = await asyncio.gather(earlier(), later())
    assert first == second > 0


async def test_a_set_the_drain_has_no_budget_left_for_waits_unread_for_the_next_drain() -> None:
    """Left in the fetcher instead of cut at its first record, it is not fetched again, and the next
    drain takes it first: a partition drained after a busy one is not always the one cut."""
    install()
    other = TopicPartition("task.finished", 1)
    subscriptions = SubscriptionState()
    subscriptions.assign_from_user({TP, other})
    assignment = subscriptions.subscription.assignment  # type: ignore[union-attr]
    value = b"v" * (1024 * 1024)
    data = raw_batch([(b"k", value, []) for _ in range(FETCH_INFLATED_BYTES // len(value) + 3)], 0, GZIP)
    results = []
    for tp in (TP, other):
        subscriptions.seek(tp, 0)
        records = fetcher.PartitionRecords(
            tp, TolerantMemoryRecords(data), [], 0, None, None, True, fetcher.READ_UNCOMMITTED
        )
        results.append(fetcher.FetchResult(tp, assignment=assignment, partition_records=records, backoff=0))
    busy, waiting = results
    with draining():
        taken = busy.getall()
        assert waiting.getall() == [] and waiting.has_more()
    assert taken and not busy.has_more()  # cut: the fetcher fetches its rest again
    with draining():
        assert [r.offset for r in waiting.getall()] == list(range(len(taken)))
