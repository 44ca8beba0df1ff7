"""The dead-letter topic and producer against the real broker: acks=all, idempotence as configured,
the topic created with its retention and the broker's replication default, and a weaker existing
topic said at start."""

from __future__ import annotations

import uuid

import structlog
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from service.adapters.db.database import Database
from service.adapters.kafka.dead_letters import DeadLetterPublisher
from service.adapters.kafka.topics import ensure_topics, new_topic
from service.adapters.metrics import Metrics
from service.app.caches import CaptureSwitch
from service.bootstrap import build_consumption
from service.config import Settings
from service.core.topic_durability import Durability
from tests.integration.test_dlq_replay import read_all
from tests.support.backends import Broker

SEVEN_DAYS_MS = 7 * 86_400_000


def _acks(publisher: DeadLetterPublisher) -> int:
    return publisher._producer._sender._acks  # type: ignore[no-any-return]


async def test_a_dead_letter_is_acknowledged_by_every_in_sync_replica(broker: Broker) -> None:
    """acks=all (-1 on the wire) with idempotence off, as on Tansu, and the dead letter arrives."""
    dlq = f"dlq.{uuid.uuid4().hex[:8]}"
    await ensure_topics(broker.bootstrap, [dlq], 1)
    publisher = DeadLetterPublisher(broker.bootstrap, dlq, idempotence=False)
    await publisher.start()
    try:
        assert _acks(publisher) == -1
        assert publisher._producer._txn_manager is None
        await publisher.publish(b"poison", b"k", [("x-dlq-reason", b"schema")])
    finally:
        await publisher.stop()
    assert [r.value for r in await read_all(broker.bootstrap, dlq)] == [b"poison"]


async def test_idempotence_is_on_for_a_configured_cluster_and_off_for_the_embedded_broker(
    sqlite_db: Database,
) -> None:
    """Nothing connects while building: the producers' own configuration is read."""
    assert Settings.model_fields["kafka_dlq_idempotence"].default is True
    metrics = Metrics()
    capture = CaptureSwitch(sqlite_db, 1.0)
    external = build_consumption(
        Settings(kafka_bootstrap="127.0.0.1:1", kafka_dlq_idempotence=True), metrics, sqlite_db, capture
    )
    embedded = build_consumption(Settings(kafka_dlq_idempotence=True), Metrics(), sqlite_db, capture)
    assert external.dead_letters._producer._txn_manager is not None
    assert embedded.dead_letters._producer._txn_manager is None
    assert _acks(external.dead_letters) == _acks(embedded.dead_letters) == -1


async def test_a_fresh_dead_letter_topic_carries_its_retention(broker: Broker) -> None:
    """Tansu answers DescribeConfigs with no entries, so the create request is checked as sent (and
    accepted by the broker); a broker that reports configurations must report the retention."""
    dlq = f"dlq.{uuid.uuid4().hex[:8]}"
    wanted = Durability(retention_ms=SEVEN_DAYS_MS)
    request = new_topic(dlq, 2, wanted)
    assert request.topic_configs == {"retention.ms": str(SEVEN_DAYS_MS)}
    assert request.replication_factor == -1  # the broker's default
    await ensure_topics(broker.bootstrap, [dlq], 2, durability={dlq: wanted})
    admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics([dlq])
        configs = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, dlq)])
    finally:
        await admin.close()
    assert len(described[0]["partitions"]) == 2
    entries = {e[0]: e[1] for r in configs for res in r.resources for e in res[4]}
    if entries:
        assert entries["retention.ms"] == str(SEVEN_DAYS_MS)


async def test_an_existing_topic_less_durable_than_configured_is_said(broker: Broker) -> None:
    dlq = f"dlq.{uuid.uuid4().hex[:8]}"
    await ensure_topics(broker.bootstrap, [dlq], 1)
    wanted = Durability(replication_factor=3, min_insync_replicas=2, retention_ms=SEVEN_DAYS_MS)
    with structlog.testing.capture_logs() as logs:
        # Checked also where an operator owns the topics and the service creates none.
        await ensure_topics(broker.bootstrap, [dlq], 1, durability={dlq: wanted}, create=False)
    gaps = [e["gap"] for e in logs if e["event"] == "topic_less_durable_than_configured"]
    assert all(e["log_level"] == "warning" for e in logs if "gap" in e)
    assert "replication factor 1 < 3 configured" in gaps
    # Tansu reports no topic configuration: what could not be checked is said instead.
    assert "the broker reports no topic configuration: min.insync.replicas, retention.ms not checked" in gaps


async def test_a_missing_topic_is_left_to_its_owner_when_creation_is_off(broker: Broker) -> None:
    dlq = f"dlq.{uuid.uuid4().hex[:8]}"
    await ensure_topics(broker.bootstrap, [dlq], 1, durability={dlq: Durability()}, create=False)
    admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
    await admin.start()
    try:
        assert dlq not in await admin.list_topics()
    finally:
        await admin.close()
