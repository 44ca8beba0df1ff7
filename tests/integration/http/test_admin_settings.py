"""`/api/v1/admin/memory/settings`: the D10 extraction model, read with memory:read, set with memory:admin."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import httpx
import pytest
from aiokafka import ConsumerRecord
from structlog.testing import capture_logs

from service.adapters.db.database import Database
from service.adapters.metrics import Metrics
from service.bootstrap import build_service
from service.entrypoints.consumer import EventProcessor, Received, decode_record
from service.entrypoints.process import Mode
from tests.conftest import event_payload, said
from tests.integration.conftest import DEFAULT_MODEL, HandlerFactory, make_event
from tests.integration.http.conftest import As, settings_over
from tests.support.dead_letters import RecordingDeadLetters
from tests.support.pool import set_capture
from tests.support.processes import MariaDbDatabase
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


async def current(admin: As) -> dict[str, object]:
    return (await admin.get("/api/v1/admin/memory/settings")).json()["data"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("name", ["gtp-4o-mini", "qwen2.5:3b", "nosuchprovider/model"])
async def test_a_name_litellm_maps_to_no_provider_is_400_and_the_setting_unchanged(
    admin: As, name: str
) -> None:
    assert (await put(admin, "openai/before")).status_code == 200
    refused = await put(admin, name)
    assert refused.status_code == 400 and refused.json()["code"] == 40000 and refused.json()["data"] is None
    message = refused.json()["message"]
    assert f"litellm maps '{name}' to no provider" in message and "openai/gpt-4o-mini" in message
    assert await current(admin) == {
        "extractionModelId": "openai/before",
        "effectiveModel": "openai/before",
        "rejections": None,
    }


@pytest.fixture
async def probing(mariadb: MariaDbDatabase, llm: ScriptedLlm) -> AsyncIterator[As]:
    """The API app with the scripted model server as MEMORY_LLM_API_BASE and a 1 s call timeout, so
    a probe's deadline is 1 s."""
    settings = settings_over(mariadb, llm_api_base=llm.api_base, llm_api_key="k", llm_timeout_s="1")
    service = build_service(settings, Mode.API)
    transport = httpx.ASGITransport(app=service.http)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        caller = As(client, 9, ["memory:read", "memory:admin"])
        yield caller
        await put(caller, "")
    await service.llm.stop()
    await service.db.dispose()


async def put_probed(admin: As, value: str) -> httpx.Response:
    return await admin.client.put(
        "/api/v1/admin/memory/settings",
        headers=admin.headers,
        json={"extractionModelId": value, "probe": True},
    )


async def test_a_probe_the_model_fails_is_400_with_the_failure_kind(probing: As, llm: ScriptedLlm) -> None:
    """`openai/qwen2.5:3bb` is a valid name on an OpenAI-compatible server: only a call finds the typo."""
    llm.script("Reply: OK", status=404, only_if=lambda r: r.model == "qwen2.5:3bb")
    llm.script("Reply: OK", "OK", delay_s=3, only_if=lambda r: r.model == "slow-to-load")
    assert (await put(probing, "openai/qwen2.5:3b")).status_code == 200
    refused = await put_probed(probing, "openai/qwen2.5:3bb")
    assert refused.status_code == 400 and refused.json()["code"] == 40000
    expected = "'openai/qwen2.5:3bb' failed a test call (rejected): HTTP 404"
    assert refused.json()["message"].startswith(expected)
    slow = await put_probed(probing, "openai/slow-to-load")
    assert slow.status_code == 400 and "failed a test call (timeout)" in slow.json()["message"]
    assert (await current(probing))["extractionModelId"] == "openai/qwen2.5:3b"
    [asked, _] = [r for r in llm.requests if r.model in {"qwen2.5:3bb", "slow-to-load"}]
    assert asked.body["max_tokens"] == 8 and "response_format" not in asked.body


async def test_a_probe_the_model_answers_sets_it(probing: As, llm: ScriptedLlm) -> None:
    answered = await put_probed(probing, "openai/qwen2.5:3b")
    assert answered.status_code == 200 and answered.json()["data"] == {
        "extractionModelId": "openai/qwen2.5:3b",
        "effectiveModel": "openai/qwen2.5:3b",
        "rejections": None,
    }
    assert [r.model for r in llm.requests] == ["qwen2.5:3b"]
    assert (await put(probing, "openai/qwen2.5:3bb")).status_code == 200  # unprobed: the name is valid
    assert len(llm.requests) == 1


async def test_events_dead_lettered_as_model_rejected_are_counted_until_the_model_is_set_again(
    admin: As, mysql_db: Database, make_handler: HandlerFactory, llm: ScriptedLlm, user_id: int
) -> None:
    """Every replica adds to one count in the database; the admin sees it in the settings answer."""
    await set_capture(mysql_db, user_id)
    llm.script(f"m{user_id}", status=404, only_if=lambda r: r.model == "missing-model")
    assert (await put(admin, "openai/missing-model")).status_code == 200
    dead = RecordingDeadLetters()
    processor = EventProcessor(make_handler(mysql_db), dead, Metrics())  # type: ignore[arg-type]
    for session in (1, 2):
        payload = event_payload(user_id, session, lastUserMessage=said(f"m{user_id}"))
        raw = json.dumps(payload).encode()
        record = ConsumerRecord("t", 0, session, 0, 0, b"1", raw, None, 1, len(raw), [])
        await processor(Received(record, decode_record(record)))
    assert dead.reasons() == ["model_rejected"] * 2

    rejections = (await current(admin))["rejections"]
    assert isinstance(rejections, dict)
    assert (rejections["count"], rejections["lastErrorKind"]) == (2, "HTTP 404")
    assert "scripted failure" in rejections["lastError"]
    at = datetime.fromisoformat(rejections["lastAt"])
    assert abs((at - datetime.now(UTC)).total_seconds()) < 60
    assert (await put(admin, "openai/missing-model")).json()["data"]["rejections"] is None
    assert (await current(admin))["rejections"] is None
