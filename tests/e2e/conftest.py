"""The real service as a child process, against Tansu, MariaDB and the scripted model."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from tests.support.backends import Broker
from tests.support.processes import MariaDbDatabase, ServiceProcess
from tests.support.scripted_llm import ScriptedLlm

JWT_SECRET = "e2e-jwt-secret-with-enough-entropy-0123456789"
INTERNAL_TOKEN = "e2e-internal-token-e2e-internal-token"


class Topics:
    def __init__(self) -> None:
        self.events = f"task.finished.{uuid.uuid4().hex[:8]}"
        self.dlq = f"{self.events}.dlq"


@pytest.fixture(scope="session")
def topics() -> Topics:
    return Topics()


def service_env(mariadb: MariaDbDatabase, broker: Broker, llm: ScriptedLlm, topics: Topics) -> dict[str, str]:
    return {
        "MEMORY_DATABASE_URL": mariadb.url,
        "MEMORY_KAFKA_BOOTSTRAP": broker.bootstrap,
        "MEMORY_KAFKA_TOPIC": topics.events,
        "MEMORY_KAFKA_GROUP_ID": f"mao-memory-{topics.events}",
        "MEMORY_KAFKA_PARTITIONS": "4",
        "MEMORY_KAFKA_SESSION_TIMEOUT_MS": "6000",
        # Tansu has no idempotent producers (InitProducerId fails).
        "MEMORY_KAFKA_DLQ_IDEMPOTENCE": "false",
        "MEMORY_LLM_API_BASE": llm.api_base,
        "MEMORY_LLM_API_KEY": "test-key",
        "MEMORY_DEFAULT_MODEL": "openai/scripted-default",
        "MEMORY_LLM_RETRY_BASE_S": "0.05",
        "MEMORY_CAPTURE_CACHE_TTL_S": "0.2",
        "MEMORY_ROBOT_PROJECT_KEYS": "WEIXIN,FEISHU",
        "MEMORY_JWT_SECRET": JWT_SECRET,
        "MEMORY_INTERNAL_TOKEN": INTERNAL_TOKEN,
        "MEMORY_SHUTDOWN_GRACE_S": "5",
    }


@pytest.fixture(scope="session")
def service(
    mariadb: MariaDbDatabase, broker: Broker, llm_server: ScriptedLlm, topics: Topics
) -> Iterator[ServiceProcess]:
    process = ServiceProcess("run", service_env(mariadb, broker, llm_server, topics)).start()
    yield process
    process.stop()


@pytest.fixture(scope="session")
async def producer(broker: Broker) -> AsyncIterator[AIOKafkaProducer]:
    client = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, max_request_size=8 * 1024 * 1024)
    await client.start()
    yield client
    await client.stop()


async def publish(producer: AIOKafkaProducer, topic: str, payload: dict[str, Any] | bytes) -> None:
    value = payload if isinstance(payload, bytes) else json.dumps(payload, ensure_ascii=False).encode()
    key = str(payload["sessionId"]).encode() if isinstance(payload, dict) else b"poison"
    await producer.send_and_wait(topic, value, key=key)


async def read_topic(bootstrap: str, topic: str, timeout_ms: int = 3000) -> list[Any]:
    """Everything on a topic so far, read by a throwaway consumer without a group."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        max_partition_fetch_bytes=8 * 1024 * 1024,
    )
    await consumer.start()
    try:
        records: list[Any] = []
        batch = await consumer.getmany(timeout_ms=timeout_ms)
        while batch:
            for part in batch.values():
                records.extend(part)
            batch = await consumer.getmany(timeout_ms=500)
        return records
    finally:
        await consumer.stop()
