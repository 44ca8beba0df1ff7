from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from datetime import datetime
from typing import Any

import pytest

from service.adapters.db.database import Database
from service.adapters.llm_client import LlmClient
from service.adapters.metrics import Metrics
from service.app.caches import CaptureSwitch, ProjectRecorder
from service.app.extraction import ExtractionHandler, ExtractionSlots
from service.config import Settings
from service.core.events import TaskFinishedEvent
from tests.conftest import event_payload
from tests.support.clock import ManualClock
from tests.support.scripted_llm import ScriptedLlm

DEFAULT_MODEL = "openai/scripted-default"


@pytest.fixture(scope="session")
def metrics() -> Metrics:
    return Metrics()


@pytest.fixture(scope="session")
async def llm_client(llm_server: ScriptedLlm, metrics: Metrics) -> AsyncIterator[LlmClient]:
    client = LlmClient(
        metrics, llm_server.api_base, "test-key", timeout_s=5, max_retries=2, retry_base_s=0.01
    )
    yield client
    await client.stop()


HandlerFactory = Callable[..., ExtractionHandler]


@pytest.fixture
def clock(any_db: Database) -> Iterator[ManualClock]:
    """The dialect's database on a hand-moved clock, put back afterwards."""
    previous = any_db.clock
    manual = any_db.clock = ManualClock(datetime(2030, 1, 1))
    yield manual
    any_db.clock = previous


@pytest.fixture
def make_handler(llm: ScriptedLlm, llm_client: LlmClient, metrics: Metrics) -> HandlerFactory:
    def build(
        db: Database,
        llm: LlmClient | None = None,
        capture: CaptureSwitch | None = None,
        slots: int = 8,
        database_slots: int = 8,
        **overrides: Any,
    ) -> ExtractionHandler:
        values = {"default_model": DEFAULT_MODEL, "capture_cache_ttl_s": 0} | overrides
        settings = Settings(_env_file=None, **values)  # type: ignore[call-arg]
        return ExtractionHandler(
            db,
            llm or llm_client,
            metrics,
            settings,
            capture or CaptureSwitch(db, 0),
            ProjectRecorder(db),
            slots=ExtractionSlots.of(slots, database_slots),
        )

    return build


def make_event(user_id: int, session_id: int = 1, **overrides: Any) -> TaskFinishedEvent:
    payload = event_payload(user_id, session_id, **overrides)
    return TaskFinishedEvent.model_validate_json(__import__("json").dumps(payload))
