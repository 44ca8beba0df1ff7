"""A topic deleted and created again under a running worker: the new log is read from its start,
said at WARNING and in a metric, and no offset range of it is skipped in silence."""

from __future__ import annotations

import json

import httpx
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from service.adapters.db.database import Database
from tests.conftest import event_payload, eventually, said
from tests.e2e.conftest import Topics, service_env
from tests.support.backends import Broker
from tests.support.pool import ledger_of_user, set_capture
from tests.support.processes import MariaDbDatabase, ServiceProcess
from tests.support.scripted_llm import ScriptedLlm


async def send(producer: AIOKafkaProducer, topic: str, user_id: int, sessions: range) -> None:
    for session in sessions:
        payload = event_payload(user_id, session, lastUserMessage=said(f"re{user_id}"))
        await producer.send_and_wait(topic, json.dumps(payload).encode(), key=b"%d" % session, partition=0)


async def test_a_re_created_topic_is_read_from_its_start(
    mariadb: MariaDbDatabase,
    broker: Broker,
    llm_server: ScriptedLlm,
    producer: AIOKafkaProducer,
    mysql_db: Database,
    user_id: int,
) -> None:
    topics = Topics()
    env = service_env(mariadb, broker, llm_server, topics) | {"MEMORY_KAFKA_PARTITIONS": "2"}
    worker = ServiceProcess("worker", env, name="recreated").start()
    try:
        await set_capture(mysql_db, user_id)
        llm_server.script(f"re{user_id}", [{"type": "user", "content": "重建的主题也要读完"}])
        await send(producer, topics.events, user_id, range(1, 21))
        done = await eventually(lambda: ledger_of_user(mysql_db, user_id), lambda r: len(r) == 20, 30)
        assert len(done) == 20

        admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
        await admin.start()
        try:
            await admin.delete_topics([topics.events])
            await admin.create_topics([NewTopic(topics.events, 2, 1)])
        finally:
            await admin.close()
        await send(producer, topics.events, user_id, range(101, 106))  # the new log ends at 5, below 20
        done = await eventually(lambda: ledger_of_user(mysql_db, user_id), lambda r: len(r) == 25, 30)
        await send(producer, topics.events, user_id, range(106, 141))
        done = await eventually(lambda: ledger_of_user(mysql_db, user_id), lambda r: len(r) == 60, 30)
        assert sorted(r["session_id"] for r in done) == [*range(1, 21), *range(101, 141)]

        metrics = httpx.get(f"{worker.base_url}/metrics").text
        assert 'mao_memory_consumer_log_resets_total{partition="0"} 1.0' in metrics
        log = worker.log_path.read_text()
        assert "partition_log_reset" in log and "partition_log_caught_up" in log
    finally:
        worker.stop()
