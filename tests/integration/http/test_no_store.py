"""No answer of the API or the internal API may be kept in a browser's disk cache, where the next
user of the profile would find another user's memories after sign-out: every one of them, errors
included, says `Cache-Control: no-store`. On the real uvicorn configuration."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from service.adapters.db.engine import upgrade_schema
from service.config import Settings
from tests.support.live_http import live_server
from tests.support.tokens import INTERNAL, SECRET, bearer, token


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    url = f"sqlite+aiosqlite:///{tmp_path / 'memory.db'}"
    upgrade_schema(url)
    settings = Settings(_env_file=None, database_url=url, jwt_secret=SECRET, internal_token=INTERNAL)  # type: ignore[call-arg]
    async with live_server(settings) as port, httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
        yield http


async def test_every_api_and_internal_answer_is_no_store(client: httpx.AsyncClient) -> None:
    me = bearer(token(42))
    created = await client.post("/api/v1/memory", headers=me, json={"scope": "USER", "content": "机密记忆"})
    answers = [
        created,
        await client.get("/api/v1/memory", headers=me),
        await client.get(f"/api/v1/memory/{created.json()['data']['id']}/history", headers=me),
        await client.get(
            "/api/v1/admin/memory", headers=bearer(token(1, ["memory:read"])), params={"userId": 42}
        ),
        await client.get("/internal/v1/memory/injection", headers=bearer(INTERNAL), params={"userId": 42}),
        await client.get("/api/v1/memory"),  # 401
        await client.post("/api/v1/console/session", json={"code": "stale"}),  # 401
        await client.post("/api/v1/memory", headers=me, content=b"x" * 70_000),  # 413
    ]
    assert [a.status_code for a in answers] == [201, 200, 200, 200, 200, 401, 401, 413]
    for answer in answers:
        assert answer.headers.get_list("cache-control") == ["no-store"], answer.request.url


async def test_the_console_files_may_be_cached(client: httpx.AsyncClient) -> None:
    assert "cache-control" not in (await client.get("/console/console.js")).headers
