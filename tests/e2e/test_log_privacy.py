"""No log line carries memory content or conversation text (issue 38): the end-to-end scenarios of
`test_pipeline.py`, each with a marker in every conversation and in every fact the scripted model
answers, plus a model whose errors quote the conversation, through a service logging at DEBUG; then
every line the service process wrote is searched for the marker."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import httpx
import pytest
from aiokafka import AIOKafkaProducer

from service.adapters.db.database import Database
from service.core.model import Status
from tests.conftest import event_payload, eventually, said
from tests.e2e.conftest import INTERNAL_TOKEN, JWT_SECRET, Topics, publish, service_env
from tests.support.backends import Broker
from tests.support.pool import items, ledger, seed, seed_many, set_capture
from tests.support.processes import MariaDbDatabase, ServiceProcess
from tests.support.scripted_llm import ScriptedLlm
from tests.support.tokens import bearer, token

MARK = f"PRIVATE{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def private_topics() -> Topics:
    return Topics()


@pytest.fixture(scope="module")
def debug_service(
    mariadb: MariaDbDatabase, broker: Broker, llm_server: ScriptedLlm, private_topics: Topics
) -> Iterator[ServiceProcess]:
    env = {
        **service_env(mariadb, broker, llm_server, private_topics),
        "MEMORY_LOG_LEVEL": "DEBUG",
        "MEMORY_LLM_MAX_RETRIES": "1",
    }
    process = ServiceProcess("run", env, name=f"log-privacy-{uuid.uuid4().hex[:6]}")
    if process.log_path.exists():
        process.log_path.unlink()
    process.start()
    yield process
    process.stop()


def spoken(marker: str) -> dict[str, str]:
    """A conversation carrying the scripted model's `marker` and the secret in both messages."""
    return {
        "lastUserMessage": f"{said(marker)} 我的秘密是 {MARK}-conversation",
        "lastAssistantMessage": f"好的,我记住了 {MARK}-assistant",
    }


def fact(text: str) -> str:
    return f"{text} {MARK}"


def quoting(status: int) -> bytes:
    """A provider's error body that quotes the conversation back, as real providers do."""
    message = f"Invalid request: the message '{MARK}-conversation' was refused by the content filter"
    return json.dumps({"error": {"message": message, "type": "invalid_request_error"}}).encode()


async def scenarios(
    producer: AIOKafkaProducer, topics: Topics, db: Database, llm: ScriptedLlm, user_id: int
) -> None:
    """The scenarios of `test_pipeline.py`, in one run, each with the secret in its words."""
    events = topics.events
    # 1. An event becomes a memory; its repeat touches it.
    await set_capture(db, user_id)
    llm.script(f"m{user_id}", [{"type": "user", "action": "insert", "content": fact("报告用中文写")}])
    for _ in range(2):
        await publish(producer, events, event_payload(user_id, 7001, **spoken(f"m{user_id}")))
    await eventually(lambda: items(db, user_id), lambda r: len(r) == 1)
    # 2. A dismissed memory is not revived.
    second = user_id + 1
    await set_capture(db, second)
    await seed(db, second, fact("已拒绝的事实"), status=Status.DISMISSED)
    llm.script(f"m{second}", [{"type": "user", "content": fact("已拒绝的事实")}])
    dismissed = event_payload(second, 7002, **spoken(f"m{second}"))
    await publish(producer, events, dismissed)
    await eventually(lambda: ledger(db, dismissed["eventId"]), lambda r: len(r) == 1)
    # 3. Filtered events (logged one by one at DEBUG), and 4. a redelivered event id.
    third = user_id + 2
    await set_capture(db, third)
    for overrides in (
        {"phase": "FAILED"},
        {"sessionType": "SUBAGENT"},
        {"lastUserMessage": f"好 {MARK}"},
        {"userId": third + 1000},
    ):
        await publish(producer, events, event_payload(third, 8000, **{**spoken(f"f{third}"), **overrides}))
    llm.script(f"m{third}", [{"type": "user", "content": fact("重复投递的事实")}])
    again = event_payload(third, 8000, **spoken(f"m{third}"))
    await publish(producer, events, again)
    await publish(producer, events, again)
    await eventually(lambda: items(db, third), lambda r: len(r) == 1)
    # 5. Poison messages go to the dead-letter topic.
    await producer.send_and_wait(events, f"{{not json {MARK}".encode(), key=b"7004")
    bad = dict(event_payload(third, 7004, **spoken("x")), userId=f"0{third}")
    await producer.send_and_wait(events, json.dumps(bad).encode(), key=b"7004")
    # 6. An extraction that inserts triggers consolidation.
    fourth = user_id + 3
    marker = f"c{fourth}"
    await set_capture(db, fourth)
    await seed_many(db, fourth, [fact(f"{marker} 旧事实{i}") for i in range(31)])
    llm.script(f"m{fourth}", [{"type": "user", "content": fact(f"{marker} 新事实")}])
    llm.script(marker, [{"op": "merge", "sourceIds": list(range(1, 33)), "content": fact(f"{marker} 合并")}])
    await publish(producer, events, event_payload(fourth, 7005, **spoken(f"m{fourth}")))
    await eventually(lambda: items(db, fourth), lambda r: len(r) == 1)


async def failures(
    producer: AIOKafkaProducer, topics: Topics, db: Database, llm: ScriptedLlm, user_id: int
) -> None:
    """A model whose errors quote the conversation: a rejection (dead letter), a 5xx then an answer,
    and a 2xx body litellm cannot read."""
    rejected, flaky, garbled = user_id + 4, user_id + 5, user_id + 6
    for user in (rejected, flaky, garbled):
        await set_capture(db, user)
    llm.script(f"m{rejected}", status=400, raw_body=quoting(400))
    llm.script(f"m{flaky}", status=500, raw_body=quoting(500), times=1)
    llm.script(f"m{flaky}", [{"type": "user", "content": fact("重试后的事实")}])
    llm.script(f"m{garbled}", raw_body=f"<html>{MARK}-conversation</html>".encode(), times=1)
    llm.script(f"m{garbled}", [{"type": "user", "content": fact("乱码之后的事实")}])
    for user in (rejected, flaky, garbled):
        await publish(producer, topics.events, event_payload(user, 7100 + user % 1000, **spoken(f"m{user}")))
    await eventually(lambda: items(db, flaky), lambda r: len(r) == 1)
    await eventually(lambda: items(db, garbled), lambda r: len(r) == 1, timeout_s=60)
    # A consolidation call the provider refuses, quoting the memories it was shown.
    crowded = user_id + 7
    marker = f"c{crowded}"
    await set_capture(db, crowded)
    await seed_many(db, crowded, [fact(f"{marker} 旧事实{i}") for i in range(31)])
    llm.script(f"m{crowded}", [{"type": "user", "content": fact(f"{marker} 新事实")}])
    llm.script(marker, status=400, raw_body=quoting(400))
    await publish(producer, topics.events, event_payload(crowded, 7200, **spoken(f"m{crowded}")))
    await eventually(lambda: items(db, crowded), lambda r: len(r) == 32)


async def api_calls(service: ServiceProcess, user_id: int) -> None:
    """The user's and the admin's API, with the secret in what is created, edited and deleted."""
    me = bearer(token(user_id, secret=JWT_SECRET))
    admin = bearer(token(user_id + 99, ["memory:read"], secret=JWT_SECRET))
    async with httpx.AsyncClient(base_url=service.base_url, timeout=10) as client:
        created = await client.post(
            "/api/v1/memory", headers=me, json={"scope": "USER", "content": fact("手写")}
        )
        assert created.status_code == 201, created.text
        memory = created.json()["data"]["id"]
        await client.patch(f"/api/v1/memory/{memory}", headers=me, json={"content": fact("手改")})
        clash = await client.post(
            "/api/v1/memory", headers=me, json={"scope": "USER", "content": fact("手改")}
        )
        assert clash.status_code == 409
        await client.get("/api/v1/memory", headers=me)
        await client.get(f"/api/v1/memory/{memory}/history", headers=me)
        await client.get("/api/v1/admin/memory", headers=admin, params={"userId": user_id})
        internal = bearer(INTERNAL_TOKEN)
        await client.get("/internal/v1/memory/injection", headers=internal, params={"userId": user_id})
        await client.delete(f"/api/v1/memory/{memory}", headers=me)
        erased = await client.delete(f"/internal/v1/memory/users/{user_id}", headers=internal)
        assert erased.status_code == 200, erased.text


async def test_no_log_line_at_any_level_carries_content_or_conversation(
    debug_service: ServiceProcess,
    producer: AIOKafkaProducer,
    private_topics: Topics,
    mysql_db: Database,
    llm: ScriptedLlm,
    user_id: int,
) -> None:
    await scenarios(producer, private_topics, mysql_db, llm, user_id)
    await failures(producer, private_topics, mysql_db, llm, user_id)
    await api_calls(debug_service, user_id)
    assert any(MARK in r.text for r in llm.requests)  # the secret did reach the model

    async def dead_lettered() -> float:
        return debug_service.metric("mao_memory_dead_letters_total")

    assert await eventually(dead_lettered, lambda n: n >= 3) >= 3  # invalid_json, schema, model_rejected
    debug_service.stop()
    lines = debug_service.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
    events = {json.loads(line).get("event") for line in lines if line.startswith("{")}
    # The scan covers the lines that would carry the words: DEBUG skips, the model's failures, dead
    # letters, consolidation, the erasure.
    expected = {"event_skipped", "extraction_llm_failed", "consolidation_llm_failed", "event_dead_lettered"}
    assert expected | {"user_erased"} <= events, events
    leaking = [line for line in lines if MARK in line]
    print(f"log lines scanned: {len(lines)}; lines with the secret: {len(leaking)}")
    assert leaking == []
