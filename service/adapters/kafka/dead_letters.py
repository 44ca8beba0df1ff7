"""The dead-letter contract, both ways, and the one producer of the dead-letter path.

The header names and the functions that build them (a copy with its verdict, a stub, the last
resort) and read them back (a replay's key and headers) are here and nowhere else; the consumer
writes dead letters and `replay` reads them through these. `DeadLetterPublisher` is the one producer:
it publishes the consumer's dead letters to the DLQ and a replay's messages to the main topic.

A dead letter is a faithful copy of the record: the same key and value (a record without a value stays
without one), and the original headers as bytes, in order, a null value still null. The verdict and
the coordinates follow as `x-dlq-*` and `x-original-*` headers. A header key that is not UTF-8
(`record_reader` keeps its bytes) cannot be written back by a Kafka client, so it travels as
`x-dlq-raw-key:<hex of its bytes>` with its value.

A message the broker refuses for good (larger than the topic's `max.message.bytes`, a topic the
service may not write) is replaced by a stub that keeps the verdict, the original coordinates and
headers and a SHA-256 of the payload, so the original can still be found on the source topic while its
retention lasts.
"""

from __future__ import annotations

import asyncio
import hashlib
import json

from aiokafka import AIOKafkaProducer
from aiokafka.errors import (
    CorruptRecordException,
    InvalidTopicError,
    MessageSizeTooLargeError,
    PolicyViolationError,
    RecordListTooLargeError,
    TopicAuthorizationFailedError,
)

from service.adapters.kafka.record_format import MARKS, header_key_bytes
from service.adapters.kafka.security import KafkaSecurity
from service.core.labels import DeadLetterReason

MAX_DLQ_MESSAGE_BYTES = 16 * 1024 * 1024
PLAINTEXT = KafkaSecurity()
REASON, ERROR, STUB = "x-dlq-reason", "x-dlq-error", "x-dlq-stub"
ORIGINAL_TOPIC, ORIGINAL_PARTITION, ORIGINAL_OFFSET = (
    "x-original-topic",
    "x-original-partition",
    "x-original-offset",
)
# A stub's own headers: the verdict of the dead letter it stands for, and the payload's hash and size.
ORIGINAL_REASON, ORIGINAL_ERROR = "x-dlq-original-reason", "x-dlq-original-error"
PAYLOAD_SHA256, PAYLOAD_BYTES = "x-dlq-payload-sha256", "x-dlq-payload-bytes"
HEADERS_DROPPED = "x-dlq-headers-dropped"
RAW_KEY_PREFIX = "x-dlq-raw-key:"
# Kafka clients refuse a record with neither key nor value: such a dead letter carries an empty key
# and this header, and a replay restores the missing key.
NULL_KEY = "x-dlq-null-key"
# Added by a replay to the main topic: how many times the event has been replayed.
REPLAY_COUNT = "x-replay-count"
# A stub must fit where its original did not: each original header value is cut to this, and the
# headers kept in order up to the total (the rest counted in `x-dlq-headers-dropped`).
STUB_HEADER_BYTES = 1024
STUB_HEADERS_TOTAL_BYTES = 64 * 1024
MAX_ERROR_CHARS = 1000

Headers = list[tuple[str, bytes | None]]


_TOO_LARGE = (MessageSizeTooLargeError, RecordListTooLargeError)
_REFUSED_FOR_GOOD = (
    *_TOO_LARGE,
    TopicAuthorizationFailedError,
    InvalidTopicError,
    PolicyViolationError,
    CorruptRecordException,
)


def refused_for_good(exc: BaseException) -> bool:
    """The broker, or the client's own checks, will refuse this message however often it is sent."""
    return isinstance(exc, (*_REFUSED_FOR_GOOD, AssertionError, TypeError, ValueError))


def header(headers: Headers, name: str) -> str | None:
    """The last value of a header, as text (a verdict appended to a copy overrides a forged one)."""
    for key, value in reversed(headers):
        if key == name:
            return None if value is None else value.decode("utf-8", "replace")
    return None


def copied_headers(original: Headers) -> Headers:
    """The record's headers as they can be written again; the reader's stub marker is not copied."""
    copied: Headers = []
    for key, value in original:
        if key in MARKS:
            continue
        try:
            key.encode("utf-8")
            name = key
        except UnicodeEncodeError:
            name = RAW_KEY_PREFIX + header_key_bytes(key).hex()
        copied.append((name, value))
    return copied


def verdict(reason: str, error: str, topic: str, partition: int, offset: int) -> Headers:
    return [
        (REASON, reason.encode()),
        (ERROR, error[:MAX_ERROR_CHARS].encode("utf-8", "replace")),
        (ORIGINAL_TOPIC, topic.encode()),
        (ORIGINAL_PARTITION, str(partition).encode()),
        (ORIGINAL_OFFSET, str(offset).encode()),
    ]


def dead_letter_stub(value: bytes | None, headers: Headers, refusal: BaseException) -> tuple[bytes, Headers]:
    """The stand-in published when the dead letter itself was refused for good."""
    payload = value or b""
    digest = hashlib.sha256(payload).hexdigest()
    body = {"stub": True, "payloadSha256": digest, "payloadBytes": len(payload)}
    reason = (
        DeadLetterReason.PAYLOAD_TOO_LARGE
        if isinstance(refusal, _TOO_LARGE)
        else DeadLetterReason.DLQ_REFUSED
    )
    kept = _bounded([(k, v) for k, v in headers if k not in {REASON, ERROR}])
    kept += [
        (REASON, reason.value.encode()),
        (ERROR, f"{type(refusal).__name__}: {refusal}"[:MAX_ERROR_CHARS].encode("utf-8", "replace")),
        (ORIGINAL_REASON, (header(headers, REASON) or "").encode()),
        (ORIGINAL_ERROR, (header(headers, ERROR) or "")[:STUB_HEADER_BYTES].encode()),
        (PAYLOAD_SHA256, digest.encode()),
        (PAYLOAD_BYTES, str(len(payload)).encode()),
        (STUB, b"1"),
    ]
    return json.dumps(body).encode(), kept


def _bounded(headers: Headers) -> Headers:
    """The headers in order, each value cut, up to the stub's total; how many were left out is said."""
    kept: Headers = []
    size = 0
    for name, value in headers:
        cut = value[:STUB_HEADER_BYTES] if value is not None else None
        size += len(name.encode("utf-8")) + len(cut or b"")
        if size > STUB_HEADERS_TOTAL_BYTES:
            return [*kept, (HEADERS_DROPPED, str(len(headers) - len(kept)).encode())]
        kept.append((name, cut))
    return kept


def verdict_only(headers: Headers) -> Headers:
    """The last resort when even the stub is refused: the verdict and the coordinates alone."""
    return [(k, v) for k, v in headers if k.startswith(("x-dlq-", "x-original-"))]


def with_null_key(value: bytes | None, key: bytes | None, headers: Headers) -> tuple[bytes | None, Headers]:
    """The key and headers a message is published with: one with neither key nor value, which Kafka
    clients refuse, gets an empty key and NULL_KEY."""
    if key is None and value is None:
        return b"", [*headers, (NULL_KEY, b"1")]
    return key, headers


def replayed(value: bytes | None, key: bytes | None, headers: Headers) -> tuple[bytes | None, Headers]:
    """The key and headers a dead letter goes back to the main topic with: a key the record did not
    have is removed again (unless it had no value either: no client sends that), and the headers are
    the original ones without the verdict, counting the replays."""
    if header(headers, NULL_KEY) and value is not None:
        key = None
    kept = [(k, v) for k, v in headers if k not in {REASON, ERROR, REPLAY_COUNT, NULL_KEY}]
    return key, [*kept, (REPLAY_COUNT, str(_replays(header(headers, REPLAY_COUNT)) + 1).encode())]


def _replays(count: str | None) -> int:
    """The replays a forged or garbled count stands for: 0 unless it is a plain ASCII number (a
    superscript digit passes `isdigit` and fails `int`, and `int` refuses over 4,300 digits)."""
    if count is None or not (count.isascii() and count.isdigit() and len(count) <= 18):
        return 0
    return int(count)


class DeadLetterPublisher:
    """The one producer of the dead-letter path, to one topic: the DLQ for the consumer's dead letters,
    the main topic for a replay. A publish returns once every in-sync replica has the message
    (acks=all), since that acknowledgement lets the source offset be committed; idempotence keeps a
    retried send from writing it twice. A broker without idempotent producers (Tansu rejects
    InitProducerId) takes `idempotence=False`: the DLQ tolerates a duplicate, and the ledger makes a
    replayed duplicate a skip."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        max_request_size: int = MAX_DLQ_MESSAGE_BYTES,
        *,
        security: KafkaSecurity = PLAINTEXT,
        idempotence: bool = False,
    ) -> None:
        self.topic = topic
        self._producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap.split(","),
            acks="all",
            enable_idempotence=idempotence,
            max_request_size=max_request_size,
            client_id="mao-memory",
            **security.options(),
        )
        self._started = False

    async def start(self) -> None:
        await self._producer.start()
        self._started = True

    async def stop(self) -> None:
        await self._producer.stop()

    async def publish(self, value: bytes | None, key: bytes | None, headers: Headers) -> None:
        """Returns once the broker has acknowledged the message, so the source offset may be committed."""
        key, headers = with_null_key(value, key, headers)
        await self._producer.send_and_wait(self.topic, value, key=key, headers=headers)

    async def ping(self, timeout_s: float) -> bool:
        """The cluster answers a metadata request (the readiness check of the broker). A publisher not
        started yet asks nothing: its client knows no broker, and would log an error on each probe."""
        if not self._started:
            return False
        try:
            await asyncio.wait_for(self._producer.client.fetch_all_metadata(), timeout_s)
        except Exception:
            return False
        return True
