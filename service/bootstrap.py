"""The composition root: the one place that builds adapters from `Settings` and wires them into the
object graph of a mode, a `Service`; `service.entrypoints.process` runs it."""

from __future__ import annotations

import asyncio
import logging
import sys
import tempfile
from collections.abc import Callable
from datetime import timedelta
from typing import TextIO

import structlog
from aiokafka import AIOKafkaConsumer
from starlette.applications import Starlette

from service.adapters.circuit_breaker import BreakerState, CircuitBreaker
from service.adapters.db.database import Database
from service.adapters.db.engine import SCHEMA_HEAD, build_engine, upgrade_schema
from service.adapters.kafka.dead_letters import DeadLetterPublisher
from service.adapters.kafka.embedded_broker import EmbeddedBroker
from service.adapters.kafka.runner import KeyOrderedRunner
from service.adapters.kafka.security import KafkaConnectionRefused, KafkaSecurity, probe
from service.adapters.llm_client import LlmClient, StructuredOutput
from service.adapters.metrics import Metrics
from service.app.caches import CaptureSwitch, ProjectRecorder
from service.app.consolidation import Consolidator, thresholds
from service.app.erasure import UserEraser
from service.app.evaluation import EvalTarget, TimedLlm, evaluate
from service.app.extraction import ExtractionHandler, ExtractionSlots
from service.app.model_quality import ModelQualityReport
from service.app.retention import Horizons, RetentionJob, RetentionReport
from service.config import Settings
from service.core.eval_cases import EvalCase
from service.core.log_bounds import bound_log_values
from service.entrypoints.consumer import EventProcessor, Received
from service.entrypoints.http.app import create_apps
from service.entrypoints.http.ops import Check, CheckFailed
from service.entrypoints.kafka_settings import kafka_security
from service.entrypoints.process import Consumption, Mode, Service

log = structlog.get_logger(__name__)

# Records taken from Kafka but not finished, per LLM slot: lets skip-path events of other sessions
# flow past LLM-bound ones while keeping memory bounded.
BUFFER_PER_SLOT = 8


def configure_logging(level: str, stream: TextIO | None = None) -> None:
    """One JSON line per record on stdout, the service's own and its libraries' (uvicorn, Alembic,
    aiokafka through the standard `logging`) alike, so a log reader never meets a plain-text line;
    every text in it bounded (`bound_log_values`). A command whose stdout is its result logs on
    stderr. `stream` defaults to the `sys.stdout` of the call, not of the import."""
    stream = stream or sys.stdout
    stamp = structlog.processors.TimeStamper(fmt="iso", utc=True)
    render: list[structlog.typing.Processor] = [
        structlog.processors.format_exc_info,
        structlog.processors.JSONRenderer(ensure_ascii=False),
    ]
    libraries = logging.StreamHandler(stream)
    libraries.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[
                structlog.stdlib.add_logger_name,
                structlog.stdlib.add_log_level,
                stamp,
                bound_log_values,
            ],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *render],
        )
    )
    logging.basicConfig(level=level, handlers=[libraries], force=True)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            stamp,
            bound_log_values,
            *render,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        logger_factory=structlog.PrintLoggerFactory(stream),
        cache_logger_on_first_use=True,
    )
    # Alembic's context lines come with every `migrate`; aiosqlite's DEBUG lines carry every
    # statement's values, memory text included.
    for noisy in ("aiokafka", "LiteLLM", "litellm", "httpx", "alembic", "aiosqlite"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def build_service(settings: Settings, mode: Mode) -> Service:
    """Nothing connects here: engines and clients open lazily or when the process starts them, so
    building is cheap and testable. Outside `api` mode it runs in the event loop, as aiokafka's
    clients must be made there."""
    metrics = Metrics()
    db = build_database(settings)
    capture = CaptureSwitch(db, settings.capture_cache_ttl_s)
    consumption = None if mode is Mode.API else build_consumption(settings, metrics, db, capture)
    # `api` mode calls the model only to check a model before it is set.
    llm = consumption.llm if consumption is not None else build_llm(settings, metrics)
    periodic = mode is not Mode.API and settings.retention_interval_hours > 0
    http, ops = build_http(
        settings, metrics, db, capture, consumption, llm, include_api=mode is not Mode.WORKER
    )
    return Service(
        settings=settings,
        mode=mode,
        metrics=metrics,
        db=db,
        capture=capture,
        http=http,
        ops=ops,
        consumption=consumption,
        llm=llm,
        retention=build_retention(settings, db, metrics) if periodic else None,
        quality=ModelQualityReport(db, metrics) if settings.quality_refresh_minutes > 0 else None,
    )


def build_database(settings: Settings) -> Database:
    return Database(
        build_engine(settings.database_url, settings.database_pool_size),
        None
        if settings.database_url.startswith("sqlite")
        else build_engine(settings.database_url, settings.database_pool_size, autocommit=True),
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
        quiet_s=settings.llm_breaker_quiet_s,
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
        defer_import=True,  # loaded by the process once its HTTP server answers
    )


def build_consumption(
    settings: Settings, metrics: Metrics, db: Database, capture: CaptureSwitch
) -> Consumption:
    broker, bootstrap = None, settings.kafka_bootstrap
    if bootstrap is None:
        broker = EmbeddedBroker(settings.embedded_kafka_port)
        bootstrap = broker.bootstrap
    # The embedded broker (Tansu) speaks PLAINTEXT only and has no idempotent producers.
    security = kafka_security(settings) if broker is None else KafkaSecurity()
    dead_letters = DeadLetterPublisher(
        bootstrap,
        settings.dlq_topic,
        security=security,
        idempotence=settings.kafka_dlq_idempotence and broker is None,
    )
    llm = build_llm(settings, metrics)
    handler = ExtractionHandler(
        db,
        llm,
        metrics,
        settings,
        capture,
        ProjectRecorder(db),
        slots=ExtractionSlots.of(settings.max_in_flight, settings.database_pool_size),
    )
    consolidator = Consolidator(db, llm, metrics, thresholds(settings), settings.llm_consolidation_max_tokens)
    processor = EventProcessor(
        handler,
        dead_letters,
        metrics,
        after_commit=consolidator.schedule,
        model_answered_ago=llm.answered_ago,
        event_failures=settings.llm_event_failures,
        event_failure_window_s=settings.llm_event_failure_window_s,
    )
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap.split(","),
        group_id=settings.kafka_group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=settings.kafka_session_timeout_ms,
        heartbeat_interval_ms=max(500, settings.kafka_session_timeout_ms // 5),
        # A partition's fetch holds the largest event (MAX_EVENT_BYTES) many times over; one fetch
        # response holds as much, whatever the partition count.
        max_partition_fetch_bytes=8 * 1024 * 1024,
        fetch_max_bytes=8 * 1024 * 1024,
        client_id="mao-memory",
        **security.options(),
    )
    runner = KeyOrderedRunner(
        consumer,
        settings.kafka_topic,
        processor,
        metrics,
        max_buffered=settings.max_in_flight * BUFFER_PER_SLOT,
        grace_s=settings.shutdown_grace_s,
    )
    return Consumption(bootstrap, security, broker, dead_letters, llm, consolidator, runner, processor.skips)


def build_retention(settings: Settings, db: Database, metrics: Metrics) -> RetentionJob:
    horizons = Horizons(
        ledger=timedelta(days=settings.retention_ledger_days),
        deleted_history=timedelta(days=settings.retention_deleted_history_days),
    )
    return RetentionJob(db, metrics, horizons)


async def run_retention_once(
    settings: Settings, progress: Callable[[RetentionReport], None] | None = None
) -> RetentionReport:
    db = build_database(settings)
    try:
        return await build_retention(settings, db, Metrics()).run_once(progress)
    finally:
        await db.dispose()


async def erase_user(settings: Settings, user_id: int) -> dict[str, int]:
    db = build_database(settings)
    try:
        return await UserEraser(db, Metrics()).erase(user_id)
    finally:
        await db.dispose()


async def run_eval(
    settings: Settings,
    models: list[str],
    cases: list[EvalCase],
    concurrency: int,
    progress: Callable[[int, int], None] | None = None,
) -> list[dict[str, object]]:
    """The labelled cases through each model's own handler and client, on a throwaway SQLite
    database migrated like production's; one report per model, in the order given."""
    with tempfile.TemporaryDirectory(prefix="mao-memory-eval-") as scratch:
        url = f"sqlite+aiosqlite:///{scratch}/eval.db"
        await asyncio.to_thread(upgrade_schema, url)
        db = build_database(settings.model_copy(update={"database_url": url}))
        targets = [_eval_target(settings, model, i, db) for i, model in enumerate(dict.fromkeys(models))]
        try:
            await evaluate(targets, cases, concurrency, progress)
            return [target.report() for target in targets]
        finally:
            for target in targets:
                await target.client.stop()
            await db.dispose()


def _eval_target(settings: Settings, model: str, index: int, db: Database) -> EvalTarget:
    """A model's handler as production builds it, with the model as its default (no D10 setting
    in the throwaway database) and its own client and metrics, so tokens and cost are its alone;
    every prompt laid out afresh, so a case's prompt is the same however the cases run."""
    settings = settings.model_copy(update={"default_model": model, "llm_prompt_layouts": 0})
    metrics = Metrics()
    client = build_llm(settings, metrics)
    llm = TimedLlm(client)
    handler = ExtractionHandler(
        db,
        llm,
        metrics,
        settings,
        CaptureSwitch(db, settings.capture_cache_ttl_s),
        ProjectRecorder(db),
        slots=ExtractionSlots.of(settings.max_in_flight, settings.database_pool_size),
    )
    return EvalTarget(
        model,
        handler,
        llm,
        client,
        metrics,
        db,
        index,
        priced=client.priced(model),
        conversation_tokens=settings.llm_conversation_tokens,
    )


def build_http(
    settings: Settings,
    metrics: Metrics,
    db: Database,
    capture: CaptureSwitch,
    consumption: Consumption | None,
    llm: LlmClient,
    include_api: bool,
) -> tuple[Starlette, Starlette]:
    checks = {"database": _db_check(db)}
    if consumption is not None:
        checks["broker"] = _broker_check(consumption)
        checks["consumer"] = _consumer_check(consumption.runner)
    return create_apps(settings, metrics, db, capture, llm, include_api=include_api, checks=checks)


def _db_check(db: Database) -> Check:
    """The database answers and holds the schema this code needs."""

    async def check() -> bool:
        await db.require_current_schema(SCHEMA_HEAD)
        return True

    return check


def _broker_check(consumption: Consumption) -> Check:
    """The producer's metadata request; when it fails, one fresh connection says why (a refused
    certificate or password, nothing listening)."""

    async def check() -> bool:
        if await consumption.dead_letters.ping(1.0):
            return True
        try:
            await probe(consumption.bootstrap, consumption.security, timeout_s=0.8)
        except KafkaConnectionRefused as exc:
            raise CheckFailed(str(exc)) from None
        return False

    return check


def _consumer_check(runner: KeyOrderedRunner[Received]) -> Check:
    """Down when the consumer is; ready, with a note, while it reads a re-created log again."""

    async def check() -> bool | str:
        if not runner.alive:
            return False
        if runner.catching_up:
            again = ", ".join(str(tp.partition) for tp in sorted(runner.catching_up))
            return f"reading partition {again} again from its start: its log was re-created"
        return True

    return check
