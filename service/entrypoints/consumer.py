"""One Kafka record to its outcome: decode or dead-letter, run the handler, retry what can succeed later."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter
from collections.abc import Callable
from typing import NamedTuple, TypeAlias

import structlog
from aiokafka import ConsumerRecord

from service.adapters.db.errors import is_transient
from service.adapters.kafka.dead_letters import (
    ERROR,
    ORIGINAL_ERROR,
    ORIGINAL_REASON,
    REASON,
    DeadLetterPublisher,
    Headers,
    copied_headers,
    dead_letter_stub,
    header,
    refused_for_good,
    verdict,
    verdict_only,
)
from service.adapters.kafka.record_format import STUB_REASON, UNDECODABLE
from service.adapters.llm_failures import FailureClass
from service.adapters.metrics import Metrics
from service.app.extraction import Extracted, ExtractionHandler, ModelRejected, ModelUnavailable
from service.core.backoff import Backoff
from service.core.events import MAX_EVENT_BYTES, TaskFinishedEvent, Undecodable, decode_event
from service.core.failure_budget import Failure, FailureBudget
from service.core.labels import DeadLetterReason, ProcessingPath
from service.core.outcomes import Outcome
from service.entrypoints.skip_summary import SkipSummary

log = structlog.get_logger(__name__)

MAX_BUG_ATTEMPTS = 3
MAX_BACKOFF_S = 30.0
# An outage is waited out without end (offsets stay put): 0.5 s, doubling, at most MAX_BACKOFF_S apart,
# each wait times a factor in [0.5, 1.5) so that events failing together do not retry together.
OUTAGE_BACKOFF = Backoff(0.5, cap=MAX_BACKOFF_S, jitter=1.0)
# The poll loop waits for the batch's cache warm-up at most this long; the slow path covers the rest.
WARM_TIMEOUT_S = 1.0

# Called once an extraction is committed; must return at once (consolidation runs in the background).
AfterCommit = Callable[[Extracted], None]
Record: TypeAlias = ConsumerRecord[bytes, bytes]


def _coordinates(record: ConsumerRecord[bytes, bytes], event: object) -> dict[str, object]:
    """Where an event came from and whose it is, for its log line."""
    fields: dict[str, object] = {"partition": record.partition, "offset": record.offset}
    if isinstance(event, TaskFinishedEvent):
        fields |= {"event_id": event.event_id, "user_id": event.user_id, "session_id": event.session_id}
    return fields


class Received(NamedTuple):
    """A record decoded once, when its batch was fetched (a tuple: the skip path makes one per record)."""

    record: Record
    event: TaskFinishedEvent | Undecodable
    # The outcome the event reaches without I/O (a skip decided from the event and warm caches), or
    # None when the handler has to run.
    fast: Outcome | None = None


def decode_record(record: Record) -> TaskFinishedEvent | Undecodable:
    """A fetched record's event; a stub from `record_reader` is undecodable by definition."""
    headers = record.headers
    if headers and headers[0][0] == UNDECODABLE:
        why = (headers[0][1] or b"").decode("utf-8", "replace")
        reason = header(list(headers[1:2]), STUB_REASON) or DeadLetterReason.UNDECODABLE_RECORD.value
        return Undecodable(reason, why)
    return decode_event(record.value, MAX_EVENT_BYTES)


class EventProcessor:
    """Returns only when the event's effects are committed or it sits on the DLQ; never drops one."""

    def __init__(
        self,
        handler: ExtractionHandler,
        dead_letters: DeadLetterPublisher,
        metrics: Metrics,
        after_commit: AfterCommit | None = None,
        model_answered_ago: Callable[[], float | None] = lambda: None,
        event_failures: int = 3,
        event_failure_window_s: float = 60.0,
    ) -> None:
        self._handler = handler
        self._dead_letters = dead_letters
        self._metrics = metrics
        self._after_commit = after_commit
        self._model_answered_ago = model_answered_ago
        self._event_failures = event_failures
        self._event_failure_window_s = event_failure_window_s
        # Bound once: resolving a label per event costs the skip path more than counting does.
        self._outcomes = {outcome: metrics.events.labels(outcome.value) for outcome in Outcome}
        self._debug = logging.getLogger().isEnabledFor(logging.DEBUG)  # skips are too many to log otherwise
        # Its timer belongs to the consumer's lifetime (`service.entrypoints.process`).
        self.skips = SkipSummary()

    async def prepare(self, records: list[ConsumerRecord[bytes, bytes]]) -> list[Received]:
        """Decode a fetched batch, read its users' capture switches in one round trip, and decide
        what needs no I/O."""
        events = [decode_record(record) for record in records]
        users = {e.user_id for e in events if isinstance(e, TaskFinishedEvent)}
        try:
            async with asyncio.timeout(WARM_TIMEOUT_S):
                await self._handler.warm(users)
        except Exception as exc:
            # Only an optimisation failed: the events take the slow path, which waits out outages.
            log.warning("capture_warm_failed", error=f"{type(exc).__name__}: {exc}")
        fast = self._handler.outcome_without_io
        return [
            Received(record, event, fast(event) if isinstance(event, TaskFinishedEvent) else None)
            for record, event in zip(records, events, strict=True)
        ]

    def taken(self, finished: list[Received]) -> None:
        """Count the batch's skips that finished as they were taken: a metric update or a log line
        per skip would cost the skip path more than deciding it."""
        counts = Counter(received.fast for received in finished if received.fast is not None)
        for outcome, count in counts.items():
            self._outcomes[outcome].inc(count)
        if self._debug:
            for received in finished:
                if received.fast is not None:
                    self._log_skip_debug(received, received.fast, 0.0)
        self.skips.add(counts)

    async def __call__(self, received: Received) -> None:
        started = time.perf_counter()
        record, decoded = received.record, received.event
        if isinstance(decoded, TaskFinishedEvent):
            outcome, extracted = await self._handle(record, decoded)
        else:
            await self._dead_letter(record, decoded.reason, decoded.detail)
            outcome, extracted = Outcome.DEAD_LETTERED, None
        self._outcomes[outcome].inc()
        path = ProcessingPath.LLM if outcome in {Outcome.EXTRACTED, Outcome.FAILED} else ProcessingPath.SKIP
        elapsed = time.perf_counter() - started
        self._metrics.processing_latency.labels(path).observe(elapsed)
        if path is ProcessingPath.LLM:
            log.info(
                "event_processed",
                **_coordinates(received.record, received.event),
                outcome=outcome.value,
                ms=round(elapsed * 1000, 1),
            )
        elif outcome is not Outcome.DEAD_LETTERED:  # a dead letter has its own line
            self._log_skip(received, outcome, elapsed)
        if extracted is not None and extracted.added and self._after_commit is not None:
            self._after_commit(extracted)

    def _log_skip(self, received: Received, outcome: Outcome, elapsed: float) -> None:
        if self._debug:
            self._log_skip_debug(received, outcome, elapsed)
        self.skips.add({outcome: 1})

    def _log_skip_debug(self, received: Received, outcome: Outcome, elapsed: float) -> None:
        log.debug(
            "event_skipped",
            **_coordinates(received.record, received.event),
            outcome=outcome.value,
            ms=round(elapsed * 1000, 1),
        )

    async def _handle(self, record: Record, event: TaskFinishedEvent) -> tuple[Outcome, Extracted | None]:
        """A database or model outage is waited out (offsets stay put); a request the model rejects
        goes to the DLQ at once; an event the model keeps failing on while it answers other events, and
        a bug, get a bounded number of tries, then the DLQ."""
        waits, bug_attempts = OUTAGE_BACKOFF.delays(random.random), 0
        delay = next(waits)
        budget = FailureBudget(self._event_failures, self._event_failure_window_s)
        while True:
            try:
                return await self._handler.handle(event)
            except asyncio.CancelledError:
                raise
            except ModelRejected as exc:
                await self._dead_letter(record, DeadLetterReason.MODEL_REJECTED, str(exc), event, exc.safe)
                return Outcome.DEAD_LETTERED, None
            except ModelUnavailable as exc:
                failure = Failure(
                    outage=exc.failure is FailureClass.OUTAGE,
                    timed_out=exc.timed_out,
                    overtaken=exc.overtaken,
                    answered_ago_s=self._model_answered_ago(),
                )
                if budget.failed(failure):
                    await self._dead_letter(record, DeadLetterReason.MODEL_FAILED, exc.kind, event)
                    return Outcome.DEAD_LETTERED, None
                # The circuit breaker holds further calls while an outage lasts; this only spaces
                # the event's own tries.
                self._metrics.event_retries.inc()
                log.info(
                    "event_retry_model_unavailable",
                    event_id=event.event_id,
                    kind=exc.kind,
                    counted=budget.counted,
                    delay=delay,
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
                        reason = DeadLetterReason.PROCESSING_ERROR
                        await self._dead_letter(record, reason, detail, event, type(exc).__name__)
                        return Outcome.DEAD_LETTERED, None
            await asyncio.sleep(delay)
            delay = next(waits)

    async def crashed(self, received: Received, error: BaseException) -> None:
        """`__call__` failed again and again on this record: a bug; the record goes to the DLQ."""
        detail = f"{type(error).__name__}: {error}"
        event = received.event if isinstance(received.event, TaskFinishedEvent) else None
        reason = DeadLetterReason.PROCESSING_ERROR
        await self._dead_letter(received.record, reason, detail, event, type(error).__name__)
        self._outcomes[Outcome.DEAD_LETTERED].inc()

    async def _dead_letter(
        self,
        record: Record,
        reason: str,
        detail: str,
        event: TaskFinishedEvent | None = None,
        logged: str | None = None,
    ) -> None:
        """Returns once the DLQ holds the message, or a stub of it, or (if even the stub is refused for
        good) once the loss is counted and logged with the coordinates: the partition always moves on.
        Nothing in the record can make this raise: a failure to copy it publishes a bare stub.

        `logged`: what the log lines say instead of `detail` when `detail` may quote the conversation
        (a provider's or an exception's text); the dead letter's header carries `detail` itself."""
        coordinates = _coordinates(record, event)
        coordinates["key"] = (record.key or b"").decode("utf-8", "replace")
        try:
            headers = copied_headers(list(record.headers or ()))
            headers += verdict(reason, detail, record.topic, record.partition, record.offset)
            await self._publish_or_stub(record.value, record.key, headers, coordinates, logged)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("dead_letter_copy_failed", reason=reason, **coordinates)
            why = f"the record could not be copied ({type(exc).__name__}); {reason}: {detail}"
            bare = verdict(
                DeadLetterReason.UNDECODABLE_RECORD, why, record.topic, record.partition, record.offset
            )
            await self._publish_or_stub(None, None, bare, coordinates, logged)

    async def _publish_or_stub(
        self,
        value: bytes | None,
        key: bytes | None,
        headers: Headers,
        coordinates: dict[str, object],
        logged: str | None,
    ) -> None:
        refusal = await self._publish_dead_letter(value, key, headers)
        if refusal is not None:
            log.warning(
                "dlq_message_refused", reason=header(headers, REASON), error=repr(refusal), **coordinates
            )
            value, headers = dead_letter_stub(value, headers, refusal)
            refusal = await self._publish_dead_letter(value, key, headers)
            if refusal is not None:  # the last resort: the verdict and the coordinates alone
                value, key = None, None
                headers = verdict_only(headers)
                refusal = await self._publish_dead_letter(value, key, headers)
            if refusal is not None:
                self._metrics.dead_letters_lost.inc()
                log.error(
                    "dead_letter_lost",
                    reason=header(headers, ORIGINAL_REASON),
                    error=logged if logged is not None else (header(headers, ORIGINAL_ERROR) or "")[:300],
                    **coordinates,
                )
                return
        reason = header(headers, REASON) or ""
        self._metrics.dead_letters.labels(reason).inc()
        log.info(
            "event_dead_lettered",
            reason=reason,
            error=logged if logged is not None else (header(headers, ERROR) or "")[:300],
            **coordinates,
        )

    async def _publish_dead_letter(
        self, value: bytes | None, key: bytes | None, headers: Headers
    ) -> BaseException | None:
        """None once published; a refusal for good is returned; anything else is retried, without end
        (the record's offset waits for it), on OUTAGE_BACKOFF."""
        waits = OUTAGE_BACKOFF.delays(random.random)
        while True:
            try:
                await self._dead_letters.publish(value, key, headers)
                return None
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if refused_for_good(exc):
                    return exc
                delay = next(waits)
                log.warning("dlq_publish_failed", error=str(exc), delay=delay)
                await asyncio.sleep(delay)
