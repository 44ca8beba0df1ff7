"""task.finished on a real Kafka-protocol broker → rows in MariaDB, through the running service."""

from __future__ import annotations

import json
import time

from aiokafka import AIOKafkaProducer

from service.adapters.db.database import Database
from service.core.model import Status
from tests.conftest import event_payload, eventually, said
from tests.e2e.conftest import Topics, publish, read_topic
from tests.support.backends import Broker
from tests.support.pool import items, ledger, seed, set_capture
from tests.support.processes import ServiceProcess
from tests.support.scripted_llm import ScriptedLlm


async def test_completed_event_becomes_a_memory_and_a_repeat_touches_it(
    service: ServiceProcess,
    producer: AIOKafkaProducer,
    topics: Topics,
    mysql_db: Database,
    llm: ScriptedLlm,
    user_id: int,
) -> None:
    await set_capture(mysql_db, user_id)
    llm.script(f"m{user_id}", [{"type": "user", "action": "insert", "content": "报告用中文写"}])
    started = time.perf_counter()
    await publish(producer, topics.events, event_payload(user_id, 7001, lastUserMessage=said(f"m{user_id}")))

    rows = await eventually(lambda: items(mysql_db, user_id), lambda r: len(r) == 1)
    first_latency = time.perf_counter() - started
    assert [(r.content, r.source, r.status, r.origin_session_id) for r in rows] == [
        ("报告用中文写", "AUTO", "ACTIVE", 7001)
    ]

    await publish(producer, topics.events, event_payload(user_id, 7001, lastUserMessage=said(f"m{user_id}")))
    touched = await eventually(
        lambda: items(mysql_db, user_id), lambda r: len(r) == 1 and r[0].updated_at > rows[0].updated_at
    )
    assert touched[0].id == rows[0].id and touched[0].updated_at > rows[0].updated_at
    assert first_latency < 20
    print(f"e2e publish→row {first_latency * 1000:.0f} ms")


async def test_dismissed_memory_is_not_revived_by_a_later_event(
    service: ServiceProcess,
    producer: AIOKafkaProducer,
    topics: Topics,
    mysql_db: Database,
    llm: ScriptedLlm,
    user_id: int,
) -> None:
    await set_capture(mysql_db, user_id)
    await seed(mysql_db, user_id, "报告用中文写", status=Status.DISMISSED)
    [before] = await items(mysql_db, user_id)
    llm.script(f"m{user_id}", [{"type": "user", "content": "报告用中文写"}])
    event = event_payload(user_id, 7002, lastUserMessage=said(f"m{user_id}"))
    await publish(producer, topics.events, event)

    await eventually(lambda: ledger(mysql_db, event["eventId"]), lambda r: len(r) == 1)
    [after] = await items(mysql_db, user_id)
    assert (after.status, after.updated_at) == ("DISMISSED", before.updated_at)


async def test_filtered_events_make_no_llm_call(
    service: ServiceProcess,
    producer: AIOKafkaProducer,
    topics: Topics,
    mysql_db: Database,
    llm: ScriptedLlm,
    user_id: int,
) -> None:
    await set_capture(mysql_db, user_id)
    marker = f"m{user_id}"
    session = 8000 + user_id % 1000
    for overrides in (
        {"phase": "FAILED"},
        {"phase": "CANCELLED"},
        {"sessionType": "SUBAGENT"},
        {"sessionType": "SIDE_TASK"},
        {"lastUserMessage": f"好 {marker}"},
        {"userId": user_id + 1},  # capture never turned on for this user
    ):
        await publish(
            producer,
            topics.events,
            event_payload(user_id, session, **{"lastUserMessage": said(marker), **overrides}),
        )
    # Same key, so the sentinel is processed only after every event above.
    llm.script(f"sentinel{user_id}", [{"type": "user", "content": "哨兵事实"}])
    await publish(
        producer, topics.events, event_payload(user_id, session, lastUserMessage=said(f"sentinel{user_id}"))
    )

    await eventually(lambda: items(mysql_db, user_id), lambda r: len(r) == 1)
    assert llm.calls(marker) == [] and len(llm.calls(f"sentinel{user_id}")) == 1


async def test_a_redelivered_event_id_is_applied_once(
    service: ServiceProcess,
    producer: AIOKafkaProducer,
    topics: Topics,
    mysql_db: Database,
    llm: ScriptedLlm,
    user_id: int,
) -> None:
    await set_capture(mysql_db, user_id)
    llm.script(f"m{user_id}", [{"type": "user", "content": "报告用中文写"}])
    event = event_payload(user_id, 7003, lastUserMessage=said(f"m{user_id}"))
    await publish(producer, topics.events, event)
    await publish(producer, topics.events, event)
    llm.script(f"sentinel{user_id}", [{"type": "user", "content": "哨兵事实"}])
    await publish(
        producer, topics.events, event_payload(user_id, 7003, lastUserMessage=said(f"sentinel{user_id}"))
    )

    rows = await eventually(lambda: items(mysql_db, user_id), lambda r: len(r) == 2)
    assert sorted(r.content for r in rows) == ["哨兵事实", "报告用中文写"]
    assert len(llm.calls(f"m{user_id}")) == 1
    assert len(await ledger(mysql_db, event["eventId"])) == 1


async def test_poison_message_goes_to_the_dlq_and_the_next_event_is_processed(
    service: ServiceProcess,
    producer: AIOKafkaProducer,
    topics: Topics,
    broker: Broker,
    mysql_db: Database,
    llm: ScriptedLlm,
    user_id: int,
) -> None:
    await set_capture(mysql_db, user_id)
    marker = f"poison-{user_id}"
    await producer.send_and_wait(topics.events, b"{not json " + marker.encode(), key=b"7004")
    bad_type = dict(event_payload(user_id, 7004), userId=f"0{user_id}", marker=marker)
    await producer.send_and_wait(topics.events, json.dumps(bad_type).encode(), key=b"7004")
    llm.script(f"m{user_id}", [{"type": "user", "content": "毒消息之后的事实"}])
    await publish(producer, topics.events, event_payload(user_id, 7004, lastUserMessage=said(f"m{user_id}")))

    await eventually(lambda: items(mysql_db, user_id), lambda r: len(r) == 1)
    dead = [r for r in await read_topic(broker.bootstrap, topics.dlq) if marker.encode() in (r.value or b"")]
    reasons = sorted(dict(r.headers)["x-dlq-reason"].decode() for r in dead)
    assert reasons == ["invalid_json", "schema"]
    schema_error = next(dict(r.headers)["x-dlq-error"].decode() for r in dead if b"userId" in r.value)
    assert "userId" in schema_error
    assert all(dict(r.headers)["x-original-topic"].decode() == topics.events for r in dead)


async def test_an_extraction_that_inserts_triggers_consolidation_afterwards(
    service: ServiceProcess,
    producer: AIOKafkaProducer,
    topics: Topics,
    mysql_db: Database,
    llm: ScriptedLlm,
    user_id: int,
) -> None:
    from tests.support.pool import seed_many

    marker = f"c{user_id}"
    await set_capture(mysql_db, user_id)
    await seed_many(mysql_db, user_id, [f"{marker} 旧事实{i}" for i in range(31)])  # USER group over 30
    llm.script(f"m{user_id}", [{"type": "user", "content": f"{marker} 新事实"}])
    llm.script(marker, [{"op": "merge", "sourceIds": list(range(1, 33)), "content": f"{marker} 合并"}])
    await publish(producer, topics.events, event_payload(user_id, 7005, lastUserMessage=said(f"m{user_id}")))

    rows = await eventually(lambda: items(mysql_db, user_id), lambda r: len(r) == 1)
    assert [(r.content, r.source) for r in rows] == [(f"{marker} 合并", "CONSOLIDATED")]
    consolidation_calls = [c for c in llm.calls(marker) if "consolidate" in c.text]
    assert len(consolidation_calls) == 1
