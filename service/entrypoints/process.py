"""Running the process: a `Service` that `service.bootstrap` built is started, served until a signal
(or the end of its consumer, its embedded broker or one of its HTTP servers), and shut down.

Everything started is entered into one `AsyncExitStack`, so the shutdown runs in the reverse order of
the start: the stop request, the consumer (its last commits), the background tasks, the background
consolidations, the API's HTTP server and the ops port's, then the graph's clients (dead letters,
model, database) and the embedded broker last."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from typing import Any

import structlog
import uvicorn
from starlette.applications import Starlette

from service.adapters.db.database import Database
from service.adapters.db.engine import SCHEMA_HEAD
from service.adapters.kafka.dead_letters import DeadLetterPublisher
from service.adapters.kafka.embedded_broker import EmbeddedBroker
from service.adapters.kafka.runner import KeyOrderedRunner
from service.adapters.kafka.security import KafkaSecurity, probe
from service.adapters.kafka.topics import ensure_topics
from service.adapters.llm_client import LlmClient
from service.adapters.metrics import Metrics
from service.app.caches import CaptureSwitch
from service.app.consolidation import Consolidator
from service.app.model_quality import ModelQualityReport
from service.app.retention import RetentionJob
from service.config import Settings
from service.core.topic_durability import Durability
from service.entrypoints.consumer import Received
from service.entrypoints.http.server import ops_server_config, server_config
from service.entrypoints.skip_summary import SKIP_SUMMARY_S, SkipSummary

log = structlog.get_logger(__name__)


class Mode(StrEnum):
    RUN = "run"
    WORKER = "worker"
    API = "api"


@dataclass(frozen=True)
class Consumption:
    """The consumer side of `run` and `worker`, built and not started: nothing in it has connected."""

    bootstrap: str
    security: KafkaSecurity
    broker: EmbeddedBroker | None  # without MEMORY_KAFKA_BOOTSTRAP: the embedded broker, started here
    dead_letters: DeadLetterPublisher
    llm: LlmClient
    consolidator: Consolidator
    runner: KeyOrderedRunner[Received]
    skips: SkipSummary  # the processor's, written by a timer while the consumer runs


@dataclass(frozen=True)
class Service:
    """The object graph of one mode, as `service.bootstrap.build_service` builds it."""

    settings: Settings
    mode: Mode
    metrics: Metrics
    db: Database
    capture: CaptureSwitch
    http: Starlette  # the API port's
    ops: Starlette  # the ops port's: /healthz, /readyz and /metrics alone
    consumption: Consumption | None  # None in `api` mode
    llm: LlmClient  # the consumer's; in `api` mode, the one a model is checked through before it is set
    retention: RetentionJob | None  # the periodic run, in `run` and `worker` when its interval is set
    quality: ModelQualityReport | None = None  # the gauges' refresh, in every mode unless switched off


class EmbeddedBrokerDied(RuntimeError):
    pass


class ListenerPortTaken(RuntimeError):
    """A port the service listens on cannot be bound: refused before anything starts."""


class ConsumerDied(RuntimeError):
    """The consumer ended without being asked to: the process exits non-zero so it is restarted."""


async def serve(service: Service) -> None:
    """Serve until SIGTERM or SIGINT; an unrequested end of the consumer or of the embedded broker is
    raised (`ConsumerDied`, `EmbeddedBrokerDied`) once everything is shut down."""
    settings, consumption = service.settings, service.consumption
    # The graph's clients are released whatever happens; `service_stopped` is logged only for a
    # service past the schema check. So the check runs in a stack of its own, whose callbacks then
    # move to the bottom of the service's stack, under the log line.
    async with contextlib.AsyncExitStack() as checking:
        _hold(checking, service)
        # Refuse to start on a database without the current schema: every event would fail on it.
        await service.db.require_current_schema(SCHEMA_HEAD)
        held = checking.pop_all()
    stop = asyncio.Event()
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(log.info, "service_stopped")
        await stack.enter_async_context(held)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        # The HTTP side answers /healthz while the brokers are reached, and stops after the consumer;
        # the ops port last, so probes are answered for as long as anything runs.
        _ensure_listenable(settings.http_host, settings.ops_port, "MEMORY_OPS_PORT")
        _ensure_listenable(settings.http_host, settings.http_port, "MEMORY_HTTP_PORT")
        ops_task = await stack.enter_async_context(_serving(ops_server_config(service.ops, settings)))
        http_task = await stack.enter_async_context(_serving(server_config(service.http, settings)))
        if consumption is not None:
            await _start(consumption, settings)
            stack.push_async_callback(consumption.consolidator.close, settings.shutdown_grace_s)
        # Everything imported and built so far lives as long as the process: leave it out of every
        # later collection, which would otherwise rescan litellm's and pydantic's module graphs.
        gc.freeze()
        housekeeping = await stack.enter_async_context(_Housekeeping(service, stop))
        consumer_task = None
        if consumption is not None:
            consumer_task = await stack.enter_async_context(_consuming(consumption, stop))
        stack.callback(stop.set)
        log.info(
            "service_started",
            mode=service.mode.value,
            http_port=settings.http_port,
            ops_port=settings.ops_port,
            bootstrap=consumption.bootstrap if consumption is not None else None,
        )
        consumer_died = await _until_stopped(stop, [http_task, ops_task], consumer_task, service.metrics)
    if consumer_died is not None:
        raise consumer_died
    if housekeeping.broker_died:
        raise EmbeddedBrokerDied("the embedded broker exited; the service stopped with it")


def _hold(stack: contextlib.AsyncExitStack, service: Service) -> None:
    """The graph's clients, whether they started or not, released after everything that uses them
    (the HTTP server's readiness checks too); the embedded broker last, as the consumer's final
    commits and dead letters go through it."""
    consumption = service.consumption
    if consumption is not None and consumption.broker is not None:
        stack.callback(consumption.broker.stop)
    stack.push_async_callback(service.db.dispose)
    stack.push_async_callback(_quietly, service.llm.stop)
    if consumption is not None:
        stack.push_async_callback(_quietly, consumption.dead_letters.stop)
        stack.push_async_callback(_quietly, consumption.runner.close)


async def _quietly(close: Callable[[], Awaitable[None]]) -> None:
    with contextlib.suppress(Exception):
        await close()


async def _start(consumption: Consumption, settings: Settings) -> None:
    """The embedded broker, the topics (created when the service creates them, the DLQ's durability
    checked either way), the dead-letter producer and the model library: after the HTTP server, so
    /healthz answers while they start."""
    if consumption.broker is not None:
        await consumption.broker.start_async()
    # One connection first: a refused certificate or password stops the start with its cause.
    await probe(consumption.bootstrap, consumption.security)
    log.info("kafka_connected", bootstrap=consumption.bootstrap, security=consumption.security.describe())
    await ensure_topics(
        consumption.bootstrap,
        [settings.kafka_topic, settings.dlq_topic],
        settings.kafka_partitions,
        security=consumption.security,
        durability={settings.dlq_topic: dlq_durability(settings)},
        create=settings.kafka_create_topics,
    )
    await consumption.dead_letters.start()
    consumption.llm.load()


def dlq_durability(settings: Settings) -> Durability:
    return Durability(
        replication_factor=settings.kafka_dlq_replication_factor,
        min_insync_replicas=settings.kafka_dlq_min_insync_replicas,
        retention_ms=settings.dlq_retention_ms,
    )


def _ensure_listenable(host: str, port: int, setting: str) -> None:
    """Bind the port once, as uvicorn will, before anything starts: uvicorn's own failure is a log
    line that names neither the setting nor the listener, after `service_started`, and exit code 3."""
    if port == 0:
        return
    for family, kind, proto, _, address in socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    ):
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # as asyncio binds it: IPv6 alone
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                raise ListenerPortTaken(
                    f"{host}:{port} is already in use or not this host's ({exc.strerror}), so the "
                    f"service cannot listen there: stop what listens on it or set {setting}"
                ) from exc


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Signals belong to `serve`, which stops the consumer before the HTTP side."""
        yield


@contextlib.asynccontextmanager
async def _serving(config: uvicorn.Config) -> AsyncIterator[asyncio.Task[None]]:
    server = _Server(config)
    task = asyncio.create_task(server.serve())
    try:
        yield task
    finally:
        server.should_exit = True
        await asyncio.gather(task, return_exceptions=True)


@contextlib.asynccontextmanager
async def _consuming(consumption: Consumption, stop: asyncio.Event) -> AsyncIterator[asyncio.Task[None]]:
    """The consumer's task, and the skip summary's timer beside it; the consumer's end (a death
    included) is waited for once `stop` is set, then the timer is cancelled, writing the last counts."""
    task = asyncio.create_task(consumption.runner.run(stop))
    summary = asyncio.create_task(consumption.skips.every(SKIP_SUMMARY_S))
    try:
        yield task
    finally:
        await asyncio.gather(task, return_exceptions=True)
        summary.cancel()
        await asyncio.gather(summary, return_exceptions=True)


class _Housekeeping:
    """The background tasks beside the consumer: periodic retention, the model-quality gauges' refresh,
    and the embedded broker's watch
    (if it exits, nothing is consumed any more, so the service stops and exits non-zero)."""

    def __init__(self, service: Service, stop: asyncio.Event) -> None:
        self._service = service
        self._stop = stop
        self._tasks: list[asyncio.Task[None]] = []
        self.broker_died = False

    async def __aenter__(self) -> _Housekeeping:
        consumption, retention = self._service.consumption, self._service.retention
        if consumption is not None and consumption.broker is not None:
            self._tasks.append(asyncio.create_task(self._watch(consumption.broker)))
        if retention is not None:
            interval = timedelta(hours=self._service.settings.retention_interval_hours)
            self._tasks.append(asyncio.create_task(retention.run_forever(self._stop, interval)))
        if self._service.quality is not None:
            every = timedelta(minutes=self._service.settings.quality_refresh_minutes)
            self._tasks.append(asyncio.create_task(self._service.quality.refresh_forever(self._stop, every)))
        return self

    async def __aexit__(self, *_: object) -> None:
        """A retention run in progress is cut between its small transactions; the next one picks up."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _watch(self, broker: EmbeddedBroker) -> None:
        while not self._stop.is_set():
            if not broker.alive:
                log.error("embedded_broker_died", bootstrap=broker.bootstrap)
                self.broker_died = True
                self._stop.set()
                return
            await asyncio.sleep(1.0)


async def _until_stopped(
    stop: asyncio.Event,
    http_tasks: list[asyncio.Task[None]],
    consumer_task: asyncio.Task[None] | None,
    metrics: Metrics,
) -> ConsumerDied | None:
    """Wait for a stop request, an HTTP server's end or the consumer's; the consumer never ends
    quietly: an end nobody asked for is returned, to be raised once everything is shut down."""
    waiters: list[asyncio.Future[Any]] = [asyncio.ensure_future(stop.wait()), *http_tasks]
    if consumer_task is not None:
        waiters.append(consumer_task)
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
