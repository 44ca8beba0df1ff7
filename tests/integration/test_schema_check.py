"""A database without the code's schema is refused at start and reported by /readyz, not waited out
as an outage (every event would fail on it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from service.adapters.db.database import Database
from service.adapters.db.engine import SCHEMA_HEAD, SchemaNotCurrent, build_engine, upgrade_schema
from service.bootstrap import build_service
from service.config import Settings
from service.entrypoints.process import Mode
from tests.support.processes import MariaDbDatabase


@pytest.mark.mysql  # a database of its own on MariaDB
async def test_a_database_behind_the_code_or_without_a_schema_is_named_as_such(tmp_path: Path) -> None:
    behind = MariaDbDatabase().create("0002")
    empty = Database(build_engine(f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}", 1))
    old = Database(build_engine(behind.url, 1))
    try:
        with pytest.raises(SchemaNotCurrent, match=rf"schema revision 0002; this code needs {SCHEMA_HEAD}"):
            await old.require_current_schema(SCHEMA_HEAD)
        with pytest.raises(SchemaNotCurrent, match="has no schema") as missing:
            await empty.require_current_schema(SCHEMA_HEAD)
        assert missing.value.found is None and "mao-memory migrate" in str(missing.value)
        upgrade_schema(behind.url)
        await old.require_current_schema(SCHEMA_HEAD)  # migrated: accepted
    finally:
        await old.dispose()
        await empty.dispose()
        behind.drop()


@pytest.mark.parametrize("mode", ["run", "api"])
def test_the_service_refuses_to_start_before_migrate(tmp_path: Path, mode: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "service.main", mode],
        env={
            **os.environ,
            "MEMORY_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'fresh.db'}",
            "MEMORY_HTTP_PORT": "0",
            "MEMORY_OPS_PORT": "0",
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "the database has no schema" in result.stderr and "run `mao-memory migrate` first" in result.stderr


async def test_readyz_fails_while_the_schema_is_behind(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'old.db'}"
    upgrade_schema(url, "0002")
    service = build_service(Settings(_env_file=None, database_url=url), Mode.API)  # type: ignore[call-arg]
    app = service.http
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as client:
            behind = await client.get("/readyz")
            upgrade_schema(url)
            current = await client.get("/readyz")
    finally:
        await service.db.dispose()
    assert behind.status_code == 503 and behind.json()["checks"] == {"database": "fail"}
    assert current.status_code == 200 and current.json()["checks"] == {"database": "ok"}
