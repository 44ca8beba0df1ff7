"""The record boundary's known breakers, one test each, through the real consumer on Tansu.

A header key that is not UTF-8 used to stop the consumer (and with it the process, exiting
with status 0); a null header value wedged its session; dead letters lost header bytes and turned a
record without a value into one with an empty value.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from service.adapters.db.database import Database
from service.adapters.kafka.dead_letters import REASON, header
from service.adapters.kafka.replay import Replay, Selection, replay_dead_letters
from service.adapters.metrics import Metrics
from service.app.caches import CaptureSwitch
from service.entrypoints.process import ConsumerDied, _until_stopped
from tests.conftest import event_payload, said
from tests.integration.conftest import HandlerFactory
from tests.support.backends import Broker
from tests.support.pool import items, set_capture
from tests.support.raw_records import RawKey, raw_batch, raw_key_producers, send_raw_batch, with_crc
from tests.support.record_pipeline import RecordPipeline, produce
from tests.support.scripted_llm import ScriptedLlm


@pytest.fixture
async def pipeline(
    broker: Broker, mysql_db: Database, make_handler: HandlerFactory
) -> AsyncIterator[RecordPipeline]:
    handler = make_handler(mysql_db, capture=CaptureSwitch(mysql_db, 0))
    running = RecordPipeline(broker.bootstrap, handler, Metrics(), partitions=1)
    await running.start()
    yield running
    await running.stop()


async def test_a_header_key_that_is_not_utf8_neither_stops_the_consumer_nor_loses_the_event(
    pipeline: RecordPipeline, mysql_db: Database, llm: ScriptedLlm, user_id: int
) -> None:
    await set_capture(mysql_db, user_id)
    llm.script(f"m{user_id}", [{"type": "user", "content": "报告要附上摘要"}])
    event = event_payload(user_id, 5, lastUserMessage=said(f"m{user_id}"))
    after = event_payload(user_id, 6)
    with raw_key_producers():
        placed = await produce(
            pipeline.bootstrap,
            pipeline.topic,
            [
                (b"5", json.dumps(event).encode(), [(RawKey(b"\xff\xfebad"), b"x")], None),
                (b"6", json.dumps(after).encode(), [], None),
            ],
        )

    assert await pipeline.settled({0: placed[-1][1] + 1})
    assert pipeline.task is not None and not pipeline.task.done()
    assert [i.content for i in await items(mysql_db, user_id)] == ["报告要附上摘要"]
    assert await pipeline.dead_letters() == []


async def test_a_null_header_value_is_dead_lettered_as_null_and_the_session_goes_on(
    pipeline: RecordPipeline, mysql_db: Database, llm: ScriptedLlm, user_id: int
) -> None:
    await set_capture(mysql_db, user_id)
    llm.script(f"m{user_id}", [{"type": "user", "content": "空头之后的事实"}])
    later = event_payload(user_id, 7, lastUserMessage=said(f"m{user_id}"))
    placed = await produce(
        pipeline.bootstrap,
        pipeline.topic,
        [
            (b"7", b"{broken", [("trace", None), ("raw", b"\xff\x00\xfe")], None),
            (b"7", json.dumps(later).encode(), [], None),
        ],
    )

    assert await pipeline.settled({0: placed[-1][1] + 1}, timeout_s=20)
    [letter] = await pipeline.dead_letters()
    assert letter.value == b"{broken" and letter.key == b"7"
    assert list(letter.headers)[:2] == [("trace", None), ("raw", b"\xff\x00\xfe")]
    assert header(letter.headers, REASON) == "invalid_json"
    assert [i.content for i in await items(mysql_db, user_id)] == ["空头之后的事实"]


async def test_a_record_without_a_value_stays_without_one_through_the_dlq_and_a_replay(
    pipeline: RecordPipeline, broker: Broker
) -> None:
    placed = await produce(pipeline.bootstrap, pipeline.topic, [(b"8", None, [("k", b"\xfe")], None)])
    assert await pipeline.settled({0: placed[0][1] + 1})
    [letter] = await pipeline.dead_letters()
    assert letter.value is None and header(letter.headers, REASON) == "empty"

    report = await replay_dead_letters(
        Replay(broker.bootstrap, pipeline.dlq, pipeline.topic, "g.dlq-replay", Selection("empty"))
    )
    assert report.replayed == 1
    assert await pipeline.settled({0: placed[0][1] + 2})
    [again] = await pipeline.dead_letters()
    assert again.value is None and header(again.headers, REASON) == "empty"
    assert ("k", b"\xfe") in list(again.headers) and header(again.headers, "x-replay-count") == "1"


async def test_a_header_key_that_is_not_utf8_is_kept_by_its_bytes_in_the_dead_letter(
    pipeline: RecordPipeline,
) -> None:
    with raw_key_producers():
        placed = await produce(
            pipeline.bootstrap, pipeline.topic, [(b"9", b"not json", [(RawKey(b"\xff\xfebad"), None)], None)]
        )
    assert await pipeline.settled({0: placed[0][1] + 1})
    [letter] = await pipeline.dead_letters()
    assert letter.headers[0] == ("x-dlq-raw-key:fffe626164", None)


async def test_a_consumer_that_ends_unasked_is_reported_counted_and_turned_into_an_error() -> None:
    metrics, stop = Metrics(), asyncio.Event()

    async def dies() -> None:
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")

    http = asyncio.create_task(asyncio.sleep(3600))
    consumer = asyncio.create_task(dies())
    try:
        died = await asyncio.wait_for(_until_stopped(stop, [http], consumer, metrics), 5)
    finally:
        http.cancel()
    assert isinstance(died, ConsumerDied) and "UnicodeDecodeError" in str(died)
    assert metrics.consumer_crashes._value.get() == 1

    stop.set()  # a requested stop is not a death
    ended = asyncio.create_task(asyncio.sleep(0))
    assert await _until_stopped(stop, [asyncio.create_task(asyncio.sleep(3600))], ended, metrics) is None


async def test_a_record_with_neither_key_nor_value_is_dead_lettered_and_the_partition_moves_on(
    pipeline: RecordPipeline, broker: Broker
) -> None:
    """Kafka clients refuse to publish such a record, so its dead letter carries an empty key."""
    builder = raw_batch([(None, None, [(b"h", b"x")])])
    base = await send_raw_batch(broker.bootstrap, pipeline.topic, 0, builder)
    after = await produce(pipeline.bootstrap, pipeline.topic, [(b"k", b"not json", [], None)])
    assert await pipeline.settled({0: after[0][1] + 1}, timeout_s=20)
    letters = await pipeline.dead_letters()
    assert [header(d.headers, REASON) for d in letters] == ["empty", "invalid_json"]
    assert letters[0].value is None and header(letters[0].headers, "x-dlq-null-key") == "1"
    assert header(letters[0].headers, "x-original-offset") == str(base)


async def test_a_record_the_reader_cannot_parse_is_dead_lettered_as_a_stub(
    pipeline: RecordPipeline, broker: Broker
) -> None:
    broken = bytearray(raw_batch([(b"s", b"stub me", [])]))
    broken[-1] = 10  # the header count, the record's last byte: claims 5 headers it does not have
    await send_raw_batch(broker.bootstrap, pipeline.topic, 0, with_crc(broken))
    after = await produce(pipeline.bootstrap, pipeline.topic, [(b"k", b"not json", [], None)])
    assert await pipeline.settled({0: after[0][1] + 1}, timeout_s=20)
    letters = await pipeline.dead_letters()
    assert [header(d.headers, REASON) for d in letters] == ["undecodable_record", "invalid_json"]
    assert "unreadable" in (header(letters[0].headers, "x-dlq-error") or "")


async def test_a_batch_with_a_wrong_crc_is_one_stub_and_no_partition_loses_a_record(
    broker: Broker, mysql_db: Database, make_handler: HandlerFactory
) -> None:
    """aiokafka raised a wrong CRC from `getmany` at every fetch, dropping what it had drained of the
    other partitions in the same call."""
    running = RecordPipeline(broker.bootstrap, make_handler(mysql_db), Metrics(), partitions=2)
    await running.start()
    try:
        bad = bytearray(raw_batch([(b"a", b"x1", []), (b"b", b"x2", [])]))
        bad[-1] ^= 0x55
        base = await send_raw_batch(broker.bootstrap, running.topic, 1, bytes(bad))
        healthy = [(b"k", b"not json %d" % n, [], None) for n in range(30)]
        placed = await produce(running.bootstrap, running.topic, healthy)
        tail = await produce(running.bootstrap, running.topic, [(b"b", b"after", [], None)])
        ends: dict[int, int] = {1: base + 2}
        for partition, offset in [*placed, *tail]:
            ends[partition] = max(ends.get(partition, 0), offset + 1)
        assert await running.settled(ends, timeout_s=30)
        letters = await running.dead_letters()
        stubs = [d for d in letters if header(d.headers, REASON) == "undecodable_record"]
        assert len(stubs) == 1 and "CRC" in (header(stubs[0].headers, "x-dlq-error") or "")
        assert len(letters) == 1 + len(healthy) + 1  # every healthy record ended once, none lost
    finally:
        await running.stop()


async def test_a_dead_letter_with_many_headers_becomes_a_bounded_stub(
    broker: Broker, mysql_db: Database, make_handler: HandlerFactory
) -> None:
    running = RecordPipeline(broker.bootstrap, make_handler(mysql_db), Metrics(), partitions=1)
    running.dead_letter_limit(256 * 1024)
    await running.start()
    try:
        headers = [(f"h{n}", b"v" * 1000) for n in range(2000)]  # 2 MB of headers
        placed = await produce(running.bootstrap, running.topic, [(b"k", b"not json", headers, None)])
        assert await running.settled({0: placed[0][1] + 1})
        [letter] = await running.dead_letters()
        assert header(letter.headers, REASON) == "payload_too_large"
        assert int(header(letter.headers, "x-dlq-headers-dropped") or 0) > 1900
        assert running.metrics.dead_letters_lost._value.get() == 0
    finally:
        await running.stop()
