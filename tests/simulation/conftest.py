"""The service's stack for the simulation: database, handler, consolidator, HTTP API, model, clock."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from service.adapters.db.engine import upgrade_schema
from service.adapters.llm_client import LlmClient
from service.app.caches import ProjectRecorder
from service.app.consolidation import Consolidator, thresholds
from service.app.extraction import ExtractionHandler, ExtractionSlots
from service.bootstrap import build_service
from service.config import Settings
from service.entrypoints.process import Mode, Service
from tests.simulation.driver import START, RecordingLlm, Simulation, Tally
from tests.simulation.twins import TwinMigration, migrate_twins
from tests.support.clock import ManualClock
from tests.support.processes import MariaDbDatabase
from tests.support.tokens import SECRET

SEED = int(os.environ.get("MEMORY_SIM_SEED", "20270101"))
USERS = int(os.environ.get("MEMORY_SIM_USERS", "1"))
EVENTS = int(os.environ.get("MEMORY_SIM_EVENTS", "300"))
MODEL = "openai/gpt-4o-mini"


@pytest.fixture(scope="session")
def model_base() -> Iterator[str]:
    """The seeded model in a process of its own, so its work runs beside the service's, not in it."""
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.simulation.model", str(SEED)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path.cwd())},
    )
    assert server.stdout is not None
    yield server.stdout.readline().strip()
    server.communicate("", timeout=10)


@dataclass
class Stack:
    service: Service
    handler: ExtractionHandler
    consolidator: Consolidator
    llm: RecordingLlm
    http: httpx.AsyncClient
    clock: ManualClock
    twins: TwinMigration | None = None  # what migration 0002 made of the seeded twins, if any

    def simulation(self, users: list[int], events: int) -> Simulation:
        return Simulation(
            self.service.db,
            self.handler,
            self.consolidator,
            self.http,
            self.llm,
            self.clock,
            users,
            events,
            SEED,
            self.twins.ids if self.twins else None,
        )


@asynccontextmanager
async def service_stack(url: str, model_base: str) -> AsyncIterator[Stack]:
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None,
        database_url=url,
        jwt_secret=SECRET,
        default_model=MODEL,
        llm_api_base=model_base,
        llm_api_key="sim",
        capture_cache_ttl_s=0,
    )
    service = build_service(settings, Mode.API)
    app = service.http
    clock = service.db.clock = ManualClock(START)
    client = LlmClient(service.metrics, model_base, "sim", timeout_s=10, max_retries=2, retry_base_s=0.01)
    llm = RecordingLlm(client)
    handler = ExtractionHandler(
        service.db,
        llm,
        service.metrics,
        settings,
        service.capture,
        ProjectRecorder(service.db),
        ExtractionSlots.of(settings.max_in_flight, settings.database_pool_size),
    )
    consolidator = Consolidator(service.db, llm, service.metrics, thresholds(settings))
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as http:
            yield Stack(service, handler, consolidator, llm, http, clock)
    finally:
        await client.stop()
        await service.db.dispose()


def sqlite_url(directory: Path) -> str:
    url = f"sqlite+aiosqlite:///{directory / 'sim.db'}"
    upgrade_schema(url)
    return url


@pytest.fixture(params=["mysql", "sqlite"])
async def stack(
    request: pytest.FixtureRequest, tmp_path: Path, model_base: str, user_id: int
) -> AsyncIterator[Stack]:
    """A MariaDB database of the simulation's own, as the year-end quality figures count every
    user's memories; SQLite from revision 0001 holding the users' lookalike twins, upgraded to head
    before the service starts."""
    twins, own = None, None
    if request.param == "mysql":
        own = MariaDbDatabase().create()
        url = own.url
    else:
        url, twins = migrate_twins(tmp_path, [user_id + i for i in range(USERS)])
    try:
        async with service_stack(url, model_base) as built:
            built.twins = twins
            yield built
    finally:
        if own is not None:
            own.drop()


Simulate = Callable[..., Awaitable[Tally]]
_runs = itertools.count()


@pytest.fixture
def simulate(tmp_path: Path, model_base: str, user_id: int) -> Simulate:
    """A short simulated year on a fresh SQLite database."""

    async def run(users: int = 1, events: int = 300) -> Tally:
        directory = tmp_path / f"run{next(_runs)}"
        directory.mkdir()
        async with service_stack(sqlite_url(directory), model_base) as built:
            return await built.simulation([user_id + i for i in range(users)], events).run()

    return run
