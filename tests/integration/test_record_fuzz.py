"""Whatever a producer can put in a record, it reaches exactly one end and nothing stops or wedges.

Hypothesis generates whole Kafka records (keys, values, headers and timestamps over the space a
client can send, header keys that are not UTF-8 included) and publishes them to Tansu, where the
service's own runner, processor and handler consume them against MariaDB and the scripted model.
After each generated batch:
- the consumer is still running;
- every record ended exactly once (the runner's view), the dead-letter topic holds exactly the
  records that do not decode, each once with its reason, and the events counter grew by the batch;
- every partition's committed offset reached its end within a bounded time;
- records of one key on one partition ended in offset order.

`MEMORY_FUZZ_EXAMPLES` sets the example count: small in `make test`, larger in `make faults`.
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.adapters.db.database import Database
from service.adapters.kafka.dead_letters import ORIGINAL_OFFSET, ORIGINAL_PARTITION, REASON, header
from service.adapters.kafka.inflate import CODECS
from service.adapters.metrics import Metrics
from service.app.caches import CaptureSwitch
from service.core.events import Undecodable, decode_event
from service.core.outcomes import Outcome
from service.entrypoints.consumer import MAX_EVENT_BYTES
from tests.conftest import said
from tests.integration.conftest import HandlerFactory
from tests.support.backends import Broker
from tests.support.pool import ledger_of_user, set_capture
from tests.support.raw_records import RawKey, raw_batch, raw_key_producers, send_raw_batch, with_crc
from tests.support.record_pipeline import RecordPipeline, produce
from tests.support.scripted_llm import ScriptedLlm

EXAMPLES = int(os.environ.get("MEMORY_FUZZ_EXAMPLES", "12"))
# What the generated batches held and how they ended, summed over the run (the fault report's row).
TALLY: Counter[str] = Counter()
USERS = range(9_100_000_001, 9_100_000_005)  # odd ones have auto-capture on
LAST_DELTA, ATTRIBUTES, CONTROL_BIT = 23, 21, 0x20  # v2 header: lastOffsetDelta, attributes, control

said_enough = st.sampled_from([said("fuzz"), said("模型")])  # long enough to reach the model
texts = st.one_of(
    said_enough, said_enough, st.none(), st.text(max_size=40), st.sampled_from(["短", " " * 30])
)
# A valid event of the user pool, ids as JSON integers or canonical decimal strings.
valid_events = st.fixed_dictionaries(
    {
        "eventId": st.uuids().map(str) | st.text(min_size=1, max_size=20),
        "occurredAt": st.just("2026-12-02T10:00:00Z"),
        "sessionId": st.integers(1, 4) | st.sampled_from(["1", "2"]),
        "userId": st.sampled_from(list(USERS)) | st.sampled_from([str(u) for u in USERS]),
        "phase": st.sampled_from(["COMPLETED"] * 3 + ["FAILED", "RUNNING"]),
        "sessionType": st.sampled_from(["MAIN"] * 3 + ["SUBAGENT", "SIDE_TASK", "WHATEVER"]),
        "lastUserMessage": texts,
        "lastAssistantMessage": texts,
    },
    optional={
        "projectKey": st.none() | st.text(max_size=20),
        "channel": st.none() | st.text(max_size=32),
        "extra": st.text(),
    },
)
junk = st.none() | st.integers(-2, 2**64) | st.floats() | st.text(max_size=8) | st.booleans() | st.just([])
broken_ids = st.sampled_from(["05", " 5", "5.0", "0x5", "9223372036854775808", "", "٥"])
broken_events = st.tuples(
    valid_events,
    st.sampled_from(["eventId", "occurredAt", "sessionId", "userId", "phase", "sessionType"]),
    junk | broken_ids,
).map(lambda t: {**t[0], t[1]: t[2]})


def encoded(event: dict[str, Any]) -> bytes:
    return json.dumps(event, ensure_ascii=False).encode()


values = st.one_of(
    valid_events.map(encoded),
    valid_events.map(encoded),
    broken_events.map(encoded),
    st.binary(max_size=200),
    st.none(),
    st.sampled_from([b"", b"{}", b"[]", b'{"eventId": ', b"\xff\xfe", b"x" * (MAX_EVENT_BYTES + 1)]),
)
headers = st.lists(
    st.tuples(st.binary(max_size=12).map(RawKey), st.none() | st.binary(max_size=24)), max_size=4
)
records = st.lists(
    st.tuples(
        st.none() | st.sampled_from([b"", b"s-1", b"s-2", b"\xff"]),  # few keys: order within each matters
        values,
        headers,
        st.none() | st.integers(0, 2**41),
    ),
    min_size=1,
    max_size=10,
)


@pytest.fixture
async def pipeline(
    broker: Broker, mysql_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm
) -> AsyncIterator[RecordPipeline]:
    for user in USERS:
        await set_capture(mysql_db, user, enabled=user % 2 == 1)
    llm.responder = lambda request: json.dumps([{"type": "user", "content": "报告一律用中文写"}])
    handler = make_handler(mysql_db, capture=CaptureSwitch(mysql_db, 60))
    running = RecordPipeline(broker.bootstrap, handler, Metrics())
    await running.start()
    yield running
    await running.stop()


def outcomes_total(metrics: Metrics) -> dict[str, float]:
    return {o.value: metrics.events.labels(o.value)._value.get() for o in Outcome}


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(batch=records)
async def test_every_record_ends_exactly_once_and_every_partition_moves_on(
    pipeline: RecordPipeline, mysql_db: Database, batch: list[Any]
) -> None:
    before = outcomes_total(pipeline.metrics)
    ledger_before = sum([len(await ledger_of_user(mysql_db, u)) for u in USERS])
    with raw_key_producers():
        placed = await produce(pipeline.bootstrap, pipeline.topic, batch)
    ends: dict[int, int] = {}
    for partition, offset in placed:
        ends[partition] = max(ends.get(partition, 0), offset + 1)

    assert await pipeline.settled(ends), f"committed {[pipeline.committed(p) for p in ends]}, ends {ends}"
    assert pipeline.task is not None and not pipeline.task.done()
    assert all(pipeline.endings.ended[c] == 1 for c in placed), "a record ended twice or never"
    for (_partition, _key), ended in pipeline.endings.order.items():
        assert ended == sorted(ended), "records of one key ended out of order"

    expected = {}
    for (partition, offset), (_key, value, _headers, _ts) in zip(placed, batch, strict=True):
        decoded = decode_event(value, MAX_EVENT_BYTES)
        if isinstance(decoded, Undecodable):
            expected[(partition, offset)] = decoded.reason
    dead = {}
    for letter in await pipeline.dead_letters(at_least=len(expected)):
        where = (
            int(header(letter.headers, ORIGINAL_PARTITION) or -1),
            int(header(letter.headers, ORIGINAL_OFFSET) or -1),
        )
        assert where not in dead, "a record was dead-lettered twice"
        dead[where] = header(letter.headers, REASON)
    assert dead == expected

    after = outcomes_total(pipeline.metrics)
    grown = {k: after[k] - before[k] for k in after}
    assert sum(grown.values()) == len(batch)
    assert grown[Outcome.DEAD_LETTERED.value] == len(expected)
    ledger_after = sum([len(await ledger_of_user(mysql_db, u)) for u in USERS])
    assert ledger_after - ledger_before == grown[Outcome.EXTRACTED.value] + grown[Outcome.FAILED.value]
    TALLY.update(
        batches=1,
        records=len(batch),
        dead_lettered=len(expected),
        undecodable_keys=sum(any(_bad_key(k) for k, _v in h) for _k, _v, h, _t in batch),
        null_header_values=sum(any(v is None for _k, v in h) for _k, _v, h, _t in batch),
        extracted=int(grown[Outcome.EXTRACTED.value]),
    )


def _bad_key(key: RawKey) -> bool:
    try:
        key.raw.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


# Batches that lie about their offsets, as Tansu stores them (a real broker refuses them at produce time,
# a damaged log still serves them): each kind, in every codec.
DAMAGES = ["none", "crc_high", "crc_low", "lie_high", "lie_low", "negative_delta", "control_bit"]
LIES: Counter[str] = Counter()  # damage kind/codec → batches sent (the fault report's row)
lying_batches = st.lists(
    st.tuples(st.sampled_from(DAMAGES), st.sampled_from([0, 1, 2, 3, 4]), st.integers(1, 5)),
    min_size=1,
    max_size=4,
)


def damaged(kind: str, codec: int, count: int, run: str) -> bytes:
    event = encoded({"eventId": run, "userId": 1, "sessionId": 1})
    data = bytearray(raw_batch([(b"s-1", event, [])] * count, compression=codec))
    if kind in ("crc_high", "lie_high"):
        struct.pack_into(">i", data, LAST_DELTA, count + 1000)
    elif kind in ("crc_low", "lie_low"):
        struct.pack_into(">i", data, LAST_DELTA, 0)
    elif kind == "control_bit":
        data[ATTRIBUTES + 1] |= CONTROL_BIT
    elif kind == "negative_delta" and codec == 0:
        data[61 + 3] = 1  # the first record's offset delta, zigzag -1
    return bytes(data) if kind.startswith("crc") else with_crc(data)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=lying_batches)
async def test_every_offset_of_lying_batches_is_accounted_for_up_to_the_log_end(
    pipeline: RecordPipeline, batches: list[tuple[str, int, int]]
) -> None:
    """Tansu's ListOffsets understates the log end, so a plain record sent last marks it: before it is
    sent, the consumer has read the lying batches as the last of its fetches (bounded by the log end)."""
    bases = []
    for n, (kind, codec, count) in enumerate(batches):
        data = damaged(kind, codec, count, f"lie-{n}")
        bases.append(await send_raw_batch(pipeline.bootstrap, pipeline.topic, 0, data))
        LIES.update([f"{kind}/{CODECS.get(codec, 'none')}"])
    await asyncio.sleep(1.5)  # the lying batches read while they are the log's last
    before_sentinel = pipeline.committed(0)
    sentinel = await send_raw_batch(pipeline.bootstrap, pipeline.topic, 0, raw_batch([(b"s-2", b"{}", [])]))
    assert before_sentinel <= sentinel, f"committed {before_sentinel} past the log end {sentinel}: {batches}"

    end = sentinel + 1
    assert await pipeline.settled({0: end}), f"committed {pipeline.committed(0)}, log end {end}: {batches}"
    assert pipeline.committed(0) == end, f"committed past the log end {end}: {batches}"
    missing = set(range(bases[0], end)) - pipeline.endings.covered[0]
    assert not missing, f"offsets neither read nor dead-lettered: {sorted(missing)[:20]}: {batches}"
    TALLY.update(lying_runs=1, lying_batches=len(batches), lying_offsets=end - bases[0])
