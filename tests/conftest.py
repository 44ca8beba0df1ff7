"""Shared fixtures: a fresh MySQL database per run, the scripted LLM, the broker (tests/support/backends.py
says which servers: the local MariaDB and Tansu, or containers)."""

from __future__ import annotations

import asyncio
import itertools
import os
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import settings as hypothesis_settings

from service.adapters.db.database import Database
from service.adapters.db.engine import build_engine, upgrade_schema
from service.config import ENV_FILE_VARIABLE, Settings
from tests.support.backends import Broker, session_broker
from tests.support.processes import MariaDbDatabase
from tests.support.scripted_llm import ScriptedLlm

# Variables the suite sets itself: litellm reads its cost map from the package, and never loads a
# `.env` (in DEV mode `import litellm` runs dotenv's upward search from its own install directory,
# which with the venv at ./.venv reaches the repository's `.env`).
SUITE_VARIABLES = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_MODE": "PRODUCTION"}
# Prefixes of the variables that steer litellm and the providers' clients (organisation, project,
# headers, base URLs, keys), and single variables that reroute or re-verify HTTP.
FOREIGN_PREFIXES = ("OPENAI_", "ANTHROPIC_", "LITELLM_")
FOREIGN_VARIABLES = {
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "EXPERIMENTAL_OPENAI_BASE_LLM_HTTP_HANDLER",
}


def _hermetic_environment() -> None:
    """No test reads the developer's `.env` or environment: the variables that configure the service
    go (pydantic-settings matches them in any case; the suite's own MEMORY_TEST_*, _SIM_* and _FUZZ_*
    stay), and so do litellm's, the providers', the proxies' and the TLS trust store's, which change
    what a model call sends or where it goes. An empty MEMORY_ENV_FILE, inherited by every process a
    test starts, turns the command line's dotenv file off. Done on import, before any test module is
    collected (and so before litellm is imported)."""
    settings = {f"MEMORY_{name.upper()}" for name in Settings.model_fields}
    for name in list(os.environ):
        upper = name.upper()
        if upper in settings or upper in FOREIGN_VARIABLES or upper.startswith(FOREIGN_PREFIXES):
            del os.environ[name]
    os.environ[ENV_FILE_VARIABLE] = ""
    os.environ.update(SUITE_VARIABLES)
    # Loopback (the local model stubs, the broker, the database) never goes through a proxy.
    os.environ["NO_PROXY"] = os.environ["no_proxy"] = "localhost,127.0.0.1,::1"


_hermetic_environment()
# CI replays the same examples every run; local runs keep exploring new ones.
hypothesis_settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    hypothesis_settings.load_profile("ci")

# Markers the suite sets itself, so that `-m` picks a loop: `make test-fast` runs
# `-m "(unit or sqlite) and not mysql and not broker and not slow"`. `unit`: the test is under
# tests/unit. `sqlite`: its id names SQLite (the `sqlite` parameter of a dialect, or its name).
# `mysql` and `broker`: a fixture it uses, directly or through others, needs MariaDB or a broker, or a
# parameter picks MySQL as its dialect; a test that opens MariaDB in its body carries `mysql` itself.
UNIT = Path(__file__).parent / "unit"
MYSQL_FIXTURES = {"mariadb", "mysql_db", "aiomysql_db"}
MYSQL_PARAMETERS = {"mysql", "aiomysql"}
BROKER_FIXTURES = {"broker"}


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        callspec = getattr(item, "callspec", None)
        parameters = list(callspec.params.values()) if callspec is not None else []
        if item.path.is_relative_to(UNIT):
            item.add_marker(pytest.mark.unit)
        if "sqlite" in item.name:
            item.add_marker(pytest.mark.sqlite)
        if fixtures & MYSQL_FIXTURES or any(isinstance(p, str) and p in MYSQL_PARAMETERS for p in parameters):
            item.add_marker(pytest.mark.mysql)
        if fixtures & BROKER_FIXTURES:
            item.add_marker(pytest.mark.broker)


T = TypeVar("T")
# Ids 10,000 apart: a test may use a block of consecutive users without meeting another test's.
_user_ids = itertools.count(random.randint(10_000, 10_000_000) * 100_000, 10_000)


@pytest.fixture
def user_id() -> int:
    """A user no other test touches, so tests share one database without interfering."""
    return next(_user_ids)


@pytest.fixture(scope="session")
def mariadb() -> Iterator[MariaDbDatabase]:
    database = MariaDbDatabase().create()
    yield database
    database.drop()


@pytest.fixture(scope="session")
async def mysql_db(mariadb: MariaDbDatabase) -> AsyncIterator[Database]:
    db = Database(build_engine(mariadb.url, pool_size=10), build_engine(mariadb.url, 10, autocommit=True))
    yield db
    await db.dispose()


@pytest.fixture(scope="session")
async def sqlite_db(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Database]:
    url = f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('sqlite') / 'memory.db'}"
    upgrade_schema(url)
    db = Database(build_engine(url, pool_size=1))
    yield db
    await db.dispose()


@pytest.fixture(scope="session")
async def aiomysql_db(mariadb: MariaDbDatabase) -> AsyncIterator[Database]:
    """The same MariaDB database through the other MySQL driver (`mysql_db` uses asyncmy)."""
    url = mariadb.url.replace("mysql+asyncmy://", "mysql+aiomysql://")
    db = Database(build_engine(url, pool_size=10), build_engine(url, 10, autocommit=True))
    yield db
    await db.dispose()


@pytest.fixture(params=["mysql", "aiomysql", "sqlite"])
def any_db(request: pytest.FixtureRequest) -> Database:
    """Runs a test once per dialect and MySQL driver (aiomysql, asyncmy): one code path serves all."""
    return request.getfixturevalue(f"{request.param}_db")  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def llm_server() -> Iterator[ScriptedLlm]:
    server = ScriptedLlm().start()
    yield server
    server.stop()


@pytest.fixture
def llm(llm_server: ScriptedLlm) -> ScriptedLlm:
    llm_server.reset()
    return llm_server


@pytest.fixture(scope="session")
def broker() -> Iterator[Broker]:
    started = session_broker().start()
    yield started
    started.stop()


async def eventually(
    probe: Callable[[], Awaitable[T]], until: Callable[[T], bool], timeout_s: float = 20.0
) -> T:
    """Poll `probe` until `until(value)` holds; the last value is returned either way for the assert."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    value = await probe()
    while not until(value) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.1)
        value = await probe()
    return value


def said(marker: str) -> str:
    """A user message long enough to reach the model, carrying a marker the scripted model matches."""
    return f"请记住这个长期偏好({marker}):以后所有的报告都用中文来写。"


def event_payload(user_id: int, session_id: int, **overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "eventId": f"evt-{user_id}-{session_id}-{random.randrange(10**12)}",
        "occurredAt": "2026-12-02T10:00:00Z",
        "sessionId": session_id,
        "userId": user_id,
        "phase": "COMPLETED",
        "sessionType": "MAIN",
        "channel": "WEB",
        "projectKey": None,
        "lastUserMessage": "请记住:以后所有的报告都用中文来写,并且附上摘要。",
        "lastAssistantMessage": "好的,我会用中文撰写报告并附上摘要。",
    }
    base.update(overrides)
    return base
