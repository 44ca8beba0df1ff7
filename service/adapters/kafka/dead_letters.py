"""The dead-letter topic, published through a FastStream `KafkaBroker` (which documents it in AsyncAPI)."""

from __future__ import annotations

from faststream.kafka import KafkaBroker

MAX_DLQ_MESSAGE_BYTES = 16 * 1024 * 1024


def build_broker(bootstrap: str) -> KafkaBroker:
    """Idempotence stays off: Tansu rejects InitProducerId, and the DLQ tolerates a duplicate."""
    return KafkaBroker(
        bootstrap.split(","),
        enable_idempotence=False,
        max_request_size=MAX_DLQ_MESSAGE_BYTES,
        client_id="mao-memory",
        logger=None,
    )


class DeadLetterPublisher:
    def __init__(self, broker: KafkaBroker, topic: str) -> None:
        self._broker = broker
        self.topic = topic
        self._publisher = broker.publisher(
            topic, description="task.finished messages that cannot be processed"
        )

    async def publish(self, value: bytes | None, key: bytes | None, headers: dict[str, str]) -> None:
        """Returns once the broker has acknowledged the message, so the source offset may be committed."""
        await self._broker.publish(value or b"", topic=self.topic, key=key, headers=headers)

    async def ping(self, timeout_s: float) -> bool:
        return bool(await self._broker.ping(timeout=timeout_s))
