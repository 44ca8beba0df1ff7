"""Creating the topic and its DLQ at start: a consumer started before any producer never waits for
them. A topic that exists is checked against the durability asked of it, and a weaker one is said
(WARNING), never altered: changing a live topic is the cluster owner's decision."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

import structlog
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import TopicAlreadyExistsError

from service.adapters.kafka.security import KafkaSecurity
from service.core.topic_durability import Durability, durability_gaps

log = structlog.get_logger(__name__)

PLAINTEXT = KafkaSecurity()


async def ensure_topics(
    bootstrap: str,
    topics: list[str],
    partitions: int,
    *,
    security: KafkaSecurity = PLAINTEXT,
    durability: Mapping[str, Durability] | None = None,
    create: bool = True,
) -> None:
    """`durability`: per topic, what it is created with and checked against; a topic without one
    is created with a replication factor of 1 (the embedded broker's only one). `create=False`
    (an operator owns the topics): existing topics are only checked."""
    wanted = durability or {}
    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap.split(","), client_id="mao-memory-admin", **security.options()
    )
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [t for t in topics if t not in existing]
        for topic in topics:
            if topic in existing and topic in wanted:
                await _check(admin, topic, wanted[topic])
        if not missing or not create:
            return
        # Another replica may create it between the listing and the request.
        with contextlib.suppress(TopicAlreadyExistsError):
            await admin.create_topics([new_topic(t, partitions, wanted.get(t)) for t in missing])
        log.info("topics_created", topics=missing, partitions=partitions)
    finally:
        await admin.close()


def new_topic(name: str, partitions: int, durability: Durability | None) -> NewTopic:
    """The create request of one topic. A replication factor of -1 is the broker's default (KIP-464);
    aiokafka's check then wants an empty, not a missing, replica assignment."""
    if durability is None:
        return NewTopic(name=name, num_partitions=partitions, replication_factor=1)
    factor = durability.replication_factor or -1
    return NewTopic(
        name=name,
        num_partitions=partitions,
        replication_factor=factor,
        replica_assignments={} if factor == -1 else None,
        topic_configs=durability.topic_configs(),
    )


async def _check(admin: AIOKafkaAdminClient, topic: str, wanted: Durability) -> None:
    described = await admin.describe_topics([topic])
    replicas = min((len(p["replicas"]) for t in described for p in t["partitions"]), default=None)
    answer = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    configs = {
        entry[0]: entry[1] for response in answer for resource in response.resources for entry in resource[4]
    }
    for gap in durability_gaps(wanted, replicas, configs):
        log.warning("topic_less_durable_than_configured", topic=topic, gap=gap)
