"""The composition root: the one place that builds adapters from `Settings` and wires them together."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import sys
from dataclasses import dataclass, field
from datetime import timedelta
from enum import StrEnum

import structlog
import uvicorn
from aiokafka import AIOKafkaConsumer
from fastapi import FastAPI

from service.adapters.circuit_breaker import BreakerState, CircuitBreaker
from service.adapters.db.database import Database
from service.adapters.db.engine import build_engine, head_revision
from service.adapters.kafka.dead_letters import DeadLetterPublisher
from service.adapters.kafka.embedded_broker import EmbeddedBroker
from service.adapters.kafka.runner import KeyOrderedRunner
from service.adapters.kafka.topics import ensure_topics
from service.adapters.llm_client import LlmClient, StructuredOutput
from service.adapters.metrics import Metrics
from service.app.caches import CaptureSwitch, ProjectRecorder
from service.app.consolidation import Consolidator, thresholds
from service.app.extraction import ExtractionHandler, ExtractionSlots
from service.app.retention import Horizons, RetentionJob, RetentionReport
from service.config import Settings
from service.entrypoints.consumer import EventProcessor, Received
from service.entrypoints.http.app import create_app
from service.entrypoints.http.ops import Check
from service.entrypoints.http.server import server_config

log = structlog.get_logger(__name__)

# Records taken from Kafka but not finished, per LLM slot: lets skip-path events of other sessions
# flow past LLM-bound ones while keeping memory bounded.
BUFFER_PER_SLOT = 8


class Mode(StrEnum):
    RUN = "run"
    WORKER = "worker"
    API = "api"


def configure_logging(level: str) -> None:
    """One JSON line per record on stdout, the service's own and its libraries' (uvicorn, Alembic,
    aiokafka through the standard `logging`) alike, so a log reader never meets a plain-text line."""
    stamp = structlog.processors.TimeStamper(fmt="iso", utc=True)
    render: list[structlog.typing.Processor] = [
        structlog.processors.format_exc_info,
        structlog.processors.JSONRenderer(ensure_ascii=False),
    ]
    libraries = logging.StreamHandler(sys.stdout)
    libraries.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[structlog.stdlib.add_logger_name, structlog.stdlib.add_log_level, stamp],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *render],
        )
    )
    logging.basicConfig(level=level, handlers=[libraries], force=True)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            stamp,
            *render,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        logger_factory=structlog.PrintLoggerFactory(),
        cache_logger_on_first_use=True,
    )
    # Alembic's context lines come with every readiness probe's schema check.
    for noisy in ("aiokafka", "LiteLLM", "litellm", "httpx", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


@dataclass
class Container:
    settings: Settings
    metrics: Metrics
    db: Database
    capture: CaptureSwitch
    embedded: EmbeddedBroker | None = None
    bootstrap: str | None = None
    runner: KeyOrderedRunner[Received] | None = None
    dead_letters: DeadLetterPublisher | None = None
    consolidator: Consolidator | None = None
    closers: list[object] = field(default_factory=list)


def build_container(settings: Settings) -> Container:
    """Nothing connects here: engines and clients open lazily, so building is cheap and testable."""
    metrics = Metrics()
    db = Database(
        build_engine(settings.database_url, settings.database_pool_size),
        None
        if settings.database_url.startswith("sqlite")
        else build_engine(settings.database_url, settings.database_pool_size, autocommit=True),
    )
    return Container(
        settings=settings, metrics=metrics, db=db, capture=CaptureSwitch(db, settings.capture_cache_ttl_s)
    )


def build_llm(settings: Settings, metrics: Metrics) -> LlmClient:
    """One client and one circuit breaker per process: an outage is judged across all sessions."""

    def breaker_changed(state: BreakerState) -> None:
        metrics.llm_breaker.set(state.value)
        if state is BreakerState.OPEN:
            metrics.llm_breaker_opened.inc()
        log.warning("llm_breaker_changed", state=state.name.lower())

    breaker = CircuitBreaker(
        settings.llm_breaker_failures,
        settings.llm_breaker_open_s,
        settings.llm_breaker_max_open_s,
        on_change=breaker_changed,
    )
    return LlmClient(
        metrics,
        api_base=settings.llm_api_base,
        api_key=settings.llm_api_key.get_secret_value() if settings.llm_api_key else None,
        timeout_s=settings.llm_timeout_s,
        max_retries=settings.llm_max_retries,
        retry_base_s=settings.llm_retry_base_s,
        breaker=breaker,
        structured_output=StructuredOutput(settings.llm_structured_output),
        max_connections=settings.max_in_flight,
        reasoning_effort=settings.llm_reasoning_effort,
        reasoning_tokens=settings.llm_reasoning_tokens,
    )


async def start_consumer(container: Container) -> None:
    settings = container.settings
    if settings.kafka_bootstrap is None:
        container.embedded = EmbeddedBroker(settings.embedded_kafka_port)
        await container.embedded.start_async()
        container.bootstrap = container.embedded.bootstrap
    else:
        container.bootstrap = settings.kafka_bootstrap
    if settings.kafka_create_topics:
        await ensure_topics(
            container.bootstrap, [settings.kafka_topic, settings.dlq_topic], settings.kafka_partitions
        )
    dead_letters = container.dead_letters = DeadLetterPublisher(container.bootstrap, settings.dlq_topic)
    await dead_letters.start()
    container.closers.append(dead_letters)
    llm = build_llm(settings, container.metrics)
    container.closers.append(llm)
    handler = ExtractionHandler(
        container.db,
        llm,
        container.metrics,
        settings,
        container.capture,
        ProjectRecorder(container.db),
        slots=ExtractionSlots.of(settings.max_in_flight, settings.database_pool_size),
    )
    container.consolidator = Consolidator(
        container.db, llm, container.metrics, thresholds(settings), settings.llm_consolidation_max_tokens
    )
    processor = EventProcessor(
        handler,
        dead_letters,
        container.metrics,
        after_commit=container.consolidator.schedule,
        model_successes=lambda: llm.successes,
        model_failures=lambda: llm.failures,
        event_failures=settings.llm_event_failures,
    )
    consumer = AIOKafkaConsumer(
        bootstrap_servers=container.bootstrap.split(","),
        group_id=settings.kafka_group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=settings.kafka_session_timeout_ms,
        heartbeat_interval_ms=max(500, settings.kafka_session_timeout_ms // 5),
        max_partition_fetch_bytes=8 * 1024 * 1024,
        fetch_max_bytes=32 * 1024 * 1024,
        client_id="mao-memory",
    )
    container.runner = KeyOrderedRunner(
        consumer,
        settings.kafka_topic,
        processor,
        container.metrics,
        max_buffered=settings.max_in_flight * BUFFER_PER_SLOT,
        grace_s=settings.shutdown_grace_s,
    )


def build_retention(container: Container) -> RetentionJob:
    settings = container.settings
    horizons = Horizons(
        ledger=timedelta(days=settings.retention_ledger_days),
        deleted_history=timedelta(days=settings.retention_deleted_history_days),
    )
    return RetentionJob(container.db, container.metrics, horizons)


async def run_retention_once(settings: Settings) -> RetentionReport:
    container = build_container(settings)
    try:
        return await build_retention(container).run_once()
    finally:
        await container.db.dispose()


def build_http(container: Container, mode: Mode) -> FastAPI:
    checks = {"database": _db_check(container)}
    if mode is not Mode.API:
        checks["broker"] = _broker_check(container)
        checks["consumer"] = _consumer_check(container)
    return create_app(
        container.settings,
        container.metrics,
        container.db,
        container.capture,
        include_api=mode is not Mode.WORKER,
        checks=checks,
    )


def _db_check(container: Container) -> Check:
    """The database answers and holds the schema this code needs."""
    wanted = head_revision()

    async def check() -> bool:
        await container.db.require_current_schema(wanted)
        return True

    return check


def _broker_check(container: Container) -> Check:
    async def check() -> bool:
        publisher = container.dead_letters
        return publisher is not None and await publisher.ping(1.5)

    return check


def _consumer_check(container: Container) -> Check:
    async def check() -> bool:
        return container.runner is not None and container.runner.alive

    return check


class EmbeddedBrokerDied(RuntimeError):
    pass


class ConsumerDied(RuntimeError):
    """The consumer ended without being asked to: the process exits non-zero so it is restarted."""


class _Housekeeping:
    """The background tasks beside the consumer: periodic retention, and the embedded broker's watch
    (if it exits, nothing is consumed any more, so the service stops and exits non-zero)."""

    def __init__(self) -> None:
        self._tasks: list[asyncio.Task[None]] = []
        self.broker_died = False

    def start(self, container: Container, mode: Mode, stop: asyncio.Event) -> None:
        if container.embedded is not None:
            self._tasks.append(asyncio.create_task(self._watch(container.embedded, stop)))
        hours = container.settings.retention_interval_hours
        if mode is not Mode.API and hours > 0:
            job = build_retention(container).run_forever(stop, timedelta(hours=hours))
            self._tasks.append(asyncio.create_task(job))

    async def stop(self) -> None:
        """A retention run in progress is cut between its small transactions; the next one picks up."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _watch(self, broker: EmbeddedBroker, stop: asyncio.Event) -> None:
        while not stop.is_set():
            if not broker.alive:
                log.error("embedded_broker_died", bootstrap=broker.bootstrap)
                self.broker_died = True
                stop.set()
                return
            await asyncio.sleep(1.0)


class _Server(uvicorn.Server):
    def capture_signals(self):  # type: ignore[no-untyped-def]
        """Signals belong to `serve_forever`, which stops the consumer before the HTTP side."""
        return contextlib.nullcontext()


async def serve_forever(settings: Settings, mode: Mode) -> None:
    container = build_container(settings)
    try:
        # Refuse to start on a database without the current schema: every event would fail on it.
        await container.db.require_current_schema(head_revision())
    except BaseException:
        await container.db.dispose()
        raise
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = _Server(server_config(build_http(container, mode), settings))
    http_task = asyncio.create_task(server.serve())
    consumer_task: asyncio.Task[None] | None = None
    consumer_died: ConsumerDied | None = None
    housekeeping = _Housekeeping()
    try:
        if mode is not Mode.API:
            await start_consumer(container)
        # Everything imported and built so far lives as long as the process: leave it out of every
        # later collection, which would otherwise rescan litellm's and pydantic's module graphs.
        gc.freeze()
        if container.runner is not None:
            consumer_task = asyncio.create_task(container.runner.run(stop))
        housekeeping.start(container, mode, stop)
        log.info(
            "service_started", mode=mode.value, http_port=settings.http_port, bootstrap=container.bootstrap
        )
        consumer_died = await _until_stopped(stop, http_task, consumer_task, container.metrics)
    finally:
        stop.set()
        if consumer_task is not None:
            await asyncio.gather(consumer_task, return_exceptions=True)
        await housekeeping.stop()
        if container.consolidator is not None:
            await container.consolidator.close(settings.shutdown_grace_s)
        server.should_exit = True
        await asyncio.gather(http_task, return_exceptions=True)
        for closer in container.closers:
            with contextlib.suppress(Exception):
                await closer.stop()  # type: ignore[attr-defined]
        await container.db.dispose()
        if container.embedded is not None:
            container.embedded.stop()
        log.info("service_stopped")
    if consumer_died is not None:
        raise consumer_died
    if housekeeping.broker_died:
        raise EmbeddedBrokerDied("the embedded broker exited; the service stopped with it")


async def _until_stopped(
    stop: asyncio.Event,
    http_task: asyncio.Task[None],
    consumer_task: asyncio.Task[None] | None,
    metrics: Metrics,
) -> ConsumerDied | None:
    """Wait for a stop request, the HTTP server's end or the consumer's; the consumer never ends
    quietly: an end nobody asked for is returned, to be raised once everything is shut down."""
    waiters: list[asyncio.Future[object]] = [asyncio.ensure_future(stop.wait()), http_task]  # type: ignore[list-item]
    if consumer_task is not None:
        waiters.append(consumer_task)  # type: ignore[arg-type]
    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    if consumer_task is None or not consumer_task.done() or stop.is_set():
        return None
    return _consumer_death(consumer_task, metrics)


def _consumer_death(task: asyncio.Task[None], metrics: Metrics) -> ConsumerDied:
    """Log the consumer's unrequested end with its traceback, and count it."""
    metrics.consumer_crashes.inc()
    error = None if task.cancelled() else task.exception()
    if error is None:
        log.error("consumer_died", error="the consumer ended without a stop request")
        return ConsumerDied("the consumer ended without a stop request")
    log.error("consumer_died", error=f"{type(error).__name__}: {error}", exc_info=error)
    return ConsumerDied(f"the consumer died: {type(error).__name__}: {error}")
