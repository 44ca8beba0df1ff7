"""The dead-letter topic, published through a FastStream `KafkaBroker` (which documents it in AsyncAPI).

A message the broker refuses for good (larger than the topic's `max.message.bytes`, a topic the
service may not write) cannot be retried into the DLQ; it is replaced by a stub that keeps the
verdict, the original coordinates and headers and a SHA-256 of the payload, so the original can still
be found on the source topic while its retention lasts.
"""

from __future__ import annotations

import hashlib
import json

from aiokafka.errors import (
    CorruptRecordException,
    InvalidTopicError,
    MessageSizeTooLargeError,
    PolicyViolationError,
    RecordListTooLargeError,
    TopicAuthorizationFailedError,
)
from faststream.kafka import KafkaBroker

MAX_DLQ_MESSAGE_BYTES = 16 * 1024 * 1024
REASON, ERROR, STUB = "x-dlq-reason", "x-dlq-error", "x-dlq-stub"
# A stub must fit where its original did not: each original header value is cut to this.
STUB_HEADER_CHARS = 1024

_TOO_LARGE = (MessageSizeTooLargeError, RecordListTooLargeError)
_REFUSED_FOR_GOOD = (
    *_TOO_LARGE,
    TopicAuthorizationFailedError,
    InvalidTopicError,
    PolicyViolationError,
    CorruptRecordException,
)


def build_broker(bootstrap: str, max_request_size: int = MAX_DLQ_MESSAGE_BYTES) -> KafkaBroker:
    """Idempotence stays off: Tansu rejects InitProducerId, and the DLQ tolerates a duplicate."""
    return KafkaBroker(
        bootstrap.split(","),
        enable_idempotence=False,
        max_request_size=max_request_size,
        client_id="mao-memory",
        logger=None,
    )


def refused_for_good(exc: BaseException) -> bool:
    """The broker (or the client's own size check) will refuse this message however often it is sent."""
    return isinstance(exc, _REFUSED_FOR_GOOD)


def dead_letter_stub(
    value: bytes | None, headers: dict[str, str], refusal: BaseException
) -> tuple[bytes, dict[str, str]]:
    """The stand-in published when the dead letter itself was refused for good."""
    payload = value or b""
    digest = hashlib.sha256(payload).hexdigest()
    body = {"stub": True, "payloadSha256": digest, "payloadBytes": len(payload)}
    reason = "payload_too_large" if isinstance(refusal, _TOO_LARGE) else "dlq_refused"
    stub_headers = {k: v[:STUB_HEADER_CHARS] for k, v in headers.items()}
    stub_headers |= {
        REASON: reason,
        ERROR: f"{type(refusal).__name__}: {refusal}"[:1000],
        "x-dlq-original-reason": headers.get(REASON, ""),
        "x-dlq-original-error": headers.get(ERROR, "")[:STUB_HEADER_CHARS],
        "x-dlq-payload-sha256": digest,
        "x-dlq-payload-bytes": str(len(payload)),
        STUB: "1",
    }
    return json.dumps(body).encode(), stub_headers


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
