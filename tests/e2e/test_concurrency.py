"""Two workers of one consumer group processing one user's events from different partitions at once."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest
from aiokafka import AIOKafkaProducer

from service.adapters.db.database import Database
from tests.conftest import event_payload, eventually
from tests.e2e.conftest import Topics, publish, service_env
from tests.support.backends import Broker
from tests.support.pool import history, items, ledger_of_user, seed_many, set_capture
from tests.support.processes import OUTPUT, MariaDbDatabase, ServiceProcess
from tests.support.scripted_llm import ScriptedLlm

EVENTS = 60
OLD, TARGETS = 130, 60


def assigned(worker: ServiceProcess) -> float:
    return worker.metric("mao_memory_partitions_assigned")


@pytest.fixture
def two_workers(
    mariadb: MariaDbDatabase, broker: Broker, llm_server: ScriptedLlm
) -> Iterator[tuple[list[ServiceProcess], Topics]]:
    topics = Topics()
    env = service_env(mariadb, broker, llm_server, topics)
    workers = [ServiceProcess("worker", env, name=f"worker{i}").start(wait_ready=False) for i in range(2)]
    for worker in workers:
        worker.wait_ready()
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline and not all(assigned(w) > 0 for w in workers):
        time.sleep(0.3)
    assert all(assigned(w) > 0 for w in workers), "both workers should own partitions"
    yield workers, topics
    for worker in workers:
        worker.stop()


async def test_one_users_events_on_two_workers_keep_the_cap_and_every_touch(
    two_workers: tuple[list[ServiceProcess], Topics],
    producer: AIOKafkaProducer,
    mysql_db: Database,
    llm: ScriptedLlm,
    user_id: int,
) -> None:
    workers, topics = two_workers
    topic = topics.events
    await set_capture(mysql_db, user_id)
    # Oldest first: 130 rows nobody confirms, then the 60 that the events will touch.
    await seed_many(
        mysql_db, user_id, [f"旧事实{i}" for i in range(OLD)] + [f"目标事实{j}" for j in range(TARGETS)]
    )
    seeded = {i.content: i for i in await items(mysql_db, user_id)}
    llm.default_delay_s = 0.05
    for j in range(EVENTS):
        llm.script(
            f"并发{user_id}-{j}:",
            [
                {"type": "user", "action": "insert", "content": f"新事实{j}-a"},
                {"type": "user", "action": "insert", "content": f"新事实{j}-b"},
                {"type": "user", "action": "insert", "content": f"目标事实{j}"},
            ],
        )
    events = [
        event_payload(
            user_id, 50_000 + j, lastUserMessage=f"请记住 并发{user_id}-{j}: 这是一个足够长的用户消息"
        )
        for j in range(EVENTS)
    ]
    started = time.perf_counter()
    await asyncio.gather(*(publish(producer, topic, e) for e in events))

    done = await eventually(
        lambda: ledger_of_user(mysql_db, user_id), lambda r: len(r) == EVENTS, timeout_s=90
    )
    assert sorted(r["event_id"] for r in done) == sorted(e["eventId"] for e in events)
    elapsed = time.perf_counter() - started

    final = await items(mysql_db, user_id)
    active = [i for i in final if i.status == "ACTIVE"]
    dismissed = [i for i in final if i.status == "DISMISSED"]
    assert len(active) == 200
    assert len({i.content for i in final}) == len(final)  # no duplicate content, hence no duplicate hash
    assert {f"新事实{j}-{s}" for j in range(EVENTS) for s in "ab"} <= {i.content for i in active}
    by_content = {i.content: i for i in final}
    for j in range(TARGETS):  # no lost touch
        row = by_content[f"目标事实{j}"]
        assert row.status == "ACTIVE" and row.updated_at > seeded[row.content].updated_at
    assert len(dismissed) == OLD + TARGETS + 2 * EVENTS - 200
    assert all(i.content.startswith("旧事实") for i in dismissed)
    actions = Counter(h["action"] for h in await history(mysql_db, user_id))
    assert (actions["insert"], actions["touch"], actions["demote"]) == (2 * EVENTS, TARGETS, len(dismissed))
    per_worker = [w.metric("mao_memory_events_total", outcome="extracted") for w in workers]
    assert all(n > 0 for n in per_worker) and sum(per_worker) == EVENTS
    OUTPUT.mkdir(parents=True, exist_ok=True)
    (OUTPUT / "concurrency.txt").write_text(
        f"events={EVENTS} users=1 workers=2 per_worker={per_worker} active={len(active)} "
        f"dismissed={len(dismissed)} inserts={actions['insert']} touches={actions['touch']} "
        f"demotions={actions['demote']} elapsed_s={elapsed:.2f}\n"
    )
    assert httpx.get(f"{workers[0].base_url}/healthz").status_code == 200
