"""`/api/v1/admin/memory/settings`: the D10 extraction model, read with memory:read, set with memory:admin."""

from __future__ import annotations

import httpx
import pytest
from structlog.testing import capture_logs

from service.adapters.db.database import Database
from tests.integration.conftest import DEFAULT_MODEL, HandlerFactory, make_event
from tests.integration.http.conftest import As
from tests.support.pool import set_capture
from tests.support.scripted_llm import ScriptedLlm


@pytest.fixture
async def admin(http: httpx.AsyncClient) -> As:
    caller = As(http, 9, ["memory:read", "memory:admin"])
    yield caller
    await caller.client.put(
        "/api/v1/admin/memory/settings", headers=caller.headers, json={"extractionModelId": ""}
    )


async def put(admin: As, value: object) -> httpx.Response:
    return await admin.client.put(
        "/api/v1/admin/memory/settings", headers=admin.headers, json={"extractionModelId": value}
    )


async def test_empty_by_default_falls_back_to_the_default_model(admin: As) -> None:
    data = (await admin.get("/api/v1/admin/memory/settings")).json()["data"]
    assert data["extractionModelId"] == "" and data["effectiveModel"]


async def test_a_chosen_model_is_used_by_the_next_extraction_without_restart(
    admin: As, mysql_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int
) -> None:
    handler = make_handler(mysql_db)
    await set_capture(mysql_db, user_id)
    response = await put(admin, "openai/admin-picked")
    assert response.status_code == 200 and response.json()["data"]["effectiveModel"] == "openai/admin-picked"
    await handler.handle(make_event(user_id, 1, lastUserMessage=f"请记住 m{user_id} 这是足够长的一句话"))
    await put(admin, "")
    await handler.handle(make_event(user_id, 2, lastUserMessage=f"请记住 m{user_id} 这是足够长的一句话"))
    assert [c.model for c in llm.calls(f"m{user_id}")] == [
        "admin-picked",
        DEFAULT_MODEL.removeprefix("openai/"),
    ]


@pytest.mark.parametrize("value", ["  ", "has space", "x" * 129, "-leading", 5, None, "a\nb"])
async def test_invalid_model_names_are_400(admin: As, value: object) -> None:
    response = await put(admin, value)
    assert response.status_code == 400 and response.json()["code"] == 40000
    assert (await admin.get("/api/v1/admin/memory/settings")).json()["data"]["extractionModelId"] == ""


async def test_writing_needs_memory_admin_and_every_change_is_audited(
    http: httpx.AsyncClient, admin: As
) -> None:
    reader = As(http, 8, ["memory:read"])
    refused = await reader.client.put(
        "/api/v1/admin/memory/settings", headers=reader.headers, json={"extractionModelId": "openai/x"}
    )
    assert refused.status_code == 403
    with capture_logs() as logs:
        assert (await put(admin, "openai/y")).status_code == 200
    [entry] = [e for e in logs if e["event"] == "admin_setting_changed"]
    assert (entry["caller"], entry["old"], entry["new"]) == (9, "", "openai/y")
