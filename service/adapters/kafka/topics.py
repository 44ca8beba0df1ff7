"""Creating the topic and its DLQ at start: a consumer started before any producer never waits for them."""

from __future__ import annotations

import contextlib

import structlog
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

log = structlog.get_logger(__name__)


async def ensure_topics(bootstrap: str, topics: list[str], partitions: int, replication: int = 1) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap.split(","), client_id="mao-memory-admin")
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [t for t in topics if t not in existing]
        if not missing:
            return
        # Another replica may create it between the listing and the request.
        with contextlib.suppress(TopicAlreadyExistsError):
            await admin.create_topics(
                [NewTopic(name=t, num_partitions=partitions, replication_factor=replication) for t in missing]
            )
        log.info("topics_created", topics=missing, partitions=partitions)
    finally:
        await admin.close()
