"""One Kafka record to its outcome: decode or dead-letter, run the handler, retry what can succeed later."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import structlog
from aiokafka import ConsumerRecord

from service.adapters.db.errors import is_transient
from service.adapters.kafka.dead_letters import (
    ERROR,
    REASON,
    DeadLetterPublisher,
    dead_letter_stub,
    refused_for_good,
)
from service.adapters.metrics import Metrics
from service.app.extraction import Extracted, ExtractionHandler, ModelRejected, ModelUnavailable, Outcome
from service.core.events import TaskFinishedEvent, Undecodable, decode_event

log = structlog.get_logger(__name__)

MAX_EVENT_BYTES = 1024 * 1024
MAX_BUG_ATTEMPTS = 3
MAX_BACKOFF_S = 30.0
# The poll loop waits for the batch's cache warm-up at most this long; the slow path covers the rest.
WARM_TIMEOUT_S = 1.0

# Skipped events are summed up in one INFO line per this many seconds.
SKIP_SUMMARY_S = 60.0

# Called once an extraction is committed; must return at once (consolidation runs in the background).
AfterCommit = Callable[[Extracted], None]


def _coordinates(record: ConsumerRecord[bytes, bytes], event: object) -> dict[str, object]:
    """Where an event came from and whose it is, for its log line."""
    fields: dict[str, object] = {"partition": record.partition, "offset": record.offset}
    if isinstance(event, TaskFinishedEvent):
        fields |= {"event_id": event.event_id, "user_id": event.user_id, "session_id": event.session_id}
    return fields


@dataclass(frozen=True, slots=True)
class Received:
    """A record decoded once, when its batch was fetched."""

    record: ConsumerRecord[bytes, bytes]
    event: TaskFinishedEvent | Undecodable


class EventProcessor:
    """Returns only when the event's effects are committed or it sits on the DLQ; never drops one."""

    def __init__(
        self,
        handler: ExtractionHandler,
        dead_letters: DeadLetterPublisher,
        metrics: Metrics,
        after_commit: AfterCommit | None = None,
    ) -> None:
        self._handler = handler
        self._dead_letters = dead_letters
        self._metrics = metrics
        self._after_commit = after_commit
        # Bound once: resolving a label per event costs the skip path more than counting does.
        self._outcomes = {outcome: metrics.events.labels(outcome.value) for outcome in Outcome}
        self._debug = logging.getLogger().isEnabledFor(logging.DEBUG)  # skips are too many to log otherwise
        self._skips: Counter[Outcome] = Counter()
        self._fast: Counter[Outcome] = Counter()  # counted per batch: a metric update per skip costs more
        self._skips_since = time.monotonic()

    async def prepare(self, records: list[ConsumerRecord[bytes, bytes]]) -> list[Received]:
        """Decode a fetched batch and read its users' capture switches in one round trip."""
        received = [Received(record, decode_event(record.value, MAX_EVENT_BYTES)) for record in records]
        users = {r.event.user_id for r in received if isinstance(r.event, TaskFinishedEvent)}
        try:
            async with asyncio.timeout(WARM_TIMEOUT_S):
                await self._handler.warm(users)
        except Exception as exc:
            # Only an optimisation failed: the events take the slow path, which waits out outages.
            log.warning("capture_warm_failed", error=f"{type(exc).__name__}: {exc}")
        return received

    def try_fast(self, received: Received) -> bool:
        """Finish an event synchronously when its outcome needs no I/O (most skips); True if finished."""
        if not isinstance(received.event, TaskFinishedEvent):
            return False
        outcome = self._handler.outcome_without_io(received.event)
        if outcome is None:
            return False
        self._fast[outcome] += 1
        self._log_skip(received, outcome, 0.0)
        return True

    def taken(self) -> None:
        for outcome, count in self._fast.items():
            self._outcomes[outcome].inc(count)
        self._fast.clear()

    async def __call__(self, received: Received) -> None:
        started = time.perf_counter()
        record, decoded = received.record, received.event
        if isinstance(decoded, TaskFinishedEvent):
            outcome, extracted = await self._handle(record, decoded)
        else:
            await self._dead_letter(record, decoded.reason, decoded.detail)
            outcome, extracted = Outcome.DEAD_LETTERED, None
        self._outcomes[outcome].inc()
        path = "llm" if outcome in {Outcome.EXTRACTED, Outcome.FAILED} else "skip"
        elapsed = time.perf_counter() - started
        self._metrics.processing_latency.labels(path).observe(elapsed)
        if path == "llm":
            log.info(
                "event_processed",
                **_coordinates(received.record, received.event),
                outcome=outcome.value,
                ms=round(elapsed * 1000, 1),
            )
        elif outcome is not Outcome.DEAD_LETTERED:  # a dead letter has its own line
            self._log_skip(received, outcome, elapsed)
        if extracted is not None and extracted.inserted and self._after_commit is not None:
            self._after_commit(extracted)

    def _log_skip(self, received: Received, outcome: Outcome, elapsed: float) -> None:
        """DEBUG per skip; at INFO, a count of skips by outcome once a minute (capture off is the first
        thing a newcomer meets, and the skip path is too hot for a line per event)."""
        if self._debug:
            log.debug(
                "event_skipped",
                **_coordinates(received.record, received.event),
                outcome=outcome.value,
                ms=round(elapsed * 1000, 1),
            )
        self._skips[outcome] += 1
        now = time.monotonic()
        if now - self._skips_since >= SKIP_SUMMARY_S:
            counts = {outcome.value: n for outcome, n in self._skips.items()}
            log.info("events_skipped", seconds=round(now - self._skips_since), **counts)
            self._skips.clear()
            self._skips_since = now

    async def _handle(
        self, record: ConsumerRecord[bytes, bytes], event: TaskFinishedEvent
    ) -> tuple[Outcome, Extracted | None]:
        """A database or model outage is waited out (offsets stay put); a request the model rejects
        goes to the DLQ with the provider's message; a bug gets three tries, then the DLQ."""
        delay, bug_attempts = 0.5, 0
        while True:
            try:
                return await self._handler.handle(event)
            except asyncio.CancelledError:
                raise
            except ModelRejected as exc:
                await self._dead_letter(record, "model_rejected", str(exc), event)
                return Outcome.DEAD_LETTERED, None
            except ModelUnavailable as exc:
                # The circuit breaker holds further calls while the outage lasts; this only spaces
                # the event's own tries.
                self._metrics.event_retries.inc()
                log.info(
                    "event_retry_model_unavailable", event_id=event.event_id, error=str(exc), delay=delay
                )
            except Exception as exc:
                if is_transient(exc):
                    self._metrics.db_retries.inc()
                    log.warning("event_retry_transient", event_id=event.event_id, error=str(exc), delay=delay)
                else:
                    bug_attempts += 1
                    log.exception("event_processing_error", event_id=event.event_id, attempt=bug_attempts)
                    if bug_attempts >= MAX_BUG_ATTEMPTS:
                        detail = f"{type(exc).__name__}: {exc}"
                        await self._dead_letter(record, "processing_error", detail, event)
                        return Outcome.DEAD_LETTERED, None
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_BACKOFF_S)

    async def _dead_letter(
        self,
        record: ConsumerRecord[bytes, bytes],
        reason: str,
        detail: str,
        event: TaskFinishedEvent | None = None,
    ) -> None:
        """Returns once the DLQ holds the message, or a stub of it, or (if even the stub is refused for
        good) once the loss is counted and logged with the coordinates: the partition always moves on."""
        # The original headers travel along, so a replay can restore them.
        original = {k: v.decode("utf-8", "replace") for k, v in record.headers or ()}
        headers = {
            **original,
            REASON: reason,
            ERROR: detail[:1000],
            "x-original-topic": record.topic,
            "x-original-partition": str(record.partition),
            "x-original-offset": str(record.offset),
        }
        coordinates = _coordinates(record, event)
        coordinates["key"] = (record.key or b"").decode("utf-8", "replace")
        refusal = await self._publish_dead_letter(record.value, record.key, headers)
        if refusal is not None:
            log.warning("dlq_message_refused", reason=reason, error=repr(refusal), **coordinates)
            value, headers = dead_letter_stub(record.value, headers, refusal)
            if await self._publish_dead_letter(value, record.key, headers) is not None:
                self._metrics.dead_letters_lost.inc()
                log.error("dead_letter_lost", reason=reason, error=detail[:300], **coordinates)
                return
        self._metrics.dead_letters.labels(headers[REASON]).inc()
        log.info("event_dead_lettered", reason=headers[REASON], error=headers[ERROR][:300], **coordinates)

    async def _publish_dead_letter(
        self, value: bytes | None, key: bytes | None, headers: dict[str, str]
    ) -> BaseException | None:
        """None once published; a refusal for good is returned; anything else is retried."""
        delay = 0.5
        while True:
            try:
                await self._dead_letters.publish(value, key, headers)
                return None
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if refused_for_good(exc):
                    return exc
                log.warning("dlq_publish_failed", error=str(exc), delay=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_BACKOFF_S)
