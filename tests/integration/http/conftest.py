from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from service.bootstrap import build_service
from service.config import Settings
from service.entrypoints.process import Mode
from tests.support.processes import MariaDbDatabase
from tests.support.tokens import INTERNAL, SECRET, bearer, token


def settings_over(mariadb: MariaDbDatabase, **extra: str) -> Settings:
    return Settings(  # type: ignore[call-arg]
        _env_file=None, database_url=mariadb.url, jwt_secret=SECRET, internal_token=INTERNAL, **extra
    )


@pytest.fixture(scope="session")
async def http(mariadb: MariaDbDatabase) -> AsyncIterator[httpx.AsyncClient]:
    """The API app in this process over MariaDB, spoken to through HTTP semantics (ASGI transport)."""
    service = build_service(settings_over(mariadb, robot_project_keys="WEIXIN,FEISHU"), Mode.API)
    app = service.http
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as client:
        yield client
    await service.db.dispose()


class As:
    """Requests on behalf of one user."""

    def __init__(self, client: httpx.AsyncClient, user_id: int, permissions: list[str] | None = None) -> None:
        self.client = client
        self.user_id = user_id
        self.headers = bearer(token(user_id, permissions))

    async def get(self, url: str, **kw: object) -> httpx.Response:
        return await self.client.get(url, headers=self.headers, **kw)  # type: ignore[arg-type]

    async def post(self, url: str, json: object) -> httpx.Response:
        return await self.client.post(url, headers=self.headers, json=json)

    async def patch(self, url: str, json: object) -> httpx.Response:
        return await self.client.patch(url, headers=self.headers, json=json)

    async def delete(self, url: str) -> httpx.Response:
        return await self.client.delete(url, headers=self.headers)

    async def create(
        self, content: str, scope: str = "USER", project_key: str | None = None
    ) -> dict[str, object]:
        body = {"scope": scope, "content": content, **({"projectKey": project_key} if project_key else {})}
        response = await self.post("/api/v1/memory", body)
        assert response.status_code == 201, response.text
        return response.json()["data"]  # type: ignore[no-any-return]


@pytest.fixture
def me(http: httpx.AsyncClient, user_id: int) -> As:
    return As(http, user_id)


@pytest.fixture
def other(http: httpx.AsyncClient, user_id: int) -> As:
    return As(http, user_id + 10**12)


def internal_headers() -> dict[str, str]:
    return bearer(INTERNAL)
