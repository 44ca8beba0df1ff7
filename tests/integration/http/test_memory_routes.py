"""Seed section 8, P1 route points, over HTTP against MariaDB."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from service.adapters.db.database import Database
from service.bootstrap import build_service
from service.config import Settings
from service.core.model import Status
from service.entrypoints.process import Mode
from tests.integration.http.conftest import As
from tests.support.pool import items, remember_projects, seed_many
from tests.support.tokens import bearer, token


def envelope_error(response: httpx.Response, status: int, code: int) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["code"] == code and body["data"] is None and body["message"]


async def test_create_returns_the_manual_item_in_the_envelope(me: As) -> None:
    response = await me.post("/api/v1/memory", {"scope": "USER", "content": "  报告用中文写  "})
    assert response.status_code == 201, response.text
    body = response.json()
    assert (body["code"], body["message"]) == (0, "success")
    item = body["data"]
    assert (item["scope"], item["content"], item["source"], item["status"], item["projectKey"]) == (
        "USER",
        "报告用中文写",
        "MANUAL",
        "ACTIVE",
        None,
    )
    assert item["originSessionId"] is None and item["createdAt"].endswith("Z")


async def test_content_of_500_characters_is_accepted_and_501_refused(me: As) -> None:
    await me.create("字" * 500)
    envelope_error(await me.post("/api/v1/memory", {"scope": "USER", "content": "字" * 501}), 400, 40000)
    envelope_error(await me.post("/api/v1/memory", {"scope": "USER", "content": "   "}), 400, 40000)


async def test_project_memory_needs_a_project_key_of_at_most_128(me: As) -> None:
    envelope_error(await me.post("/api/v1/memory", {"scope": "PROJECT", "content": "x"}), 400, 40000)
    envelope_error(
        await me.post("/api/v1/memory", {"scope": "PROJECT", "content": "x", "projectKey": "k" * 129}),
        400,
        40000,
    )
    item = await me.create("用 Vitest", "PROJECT", "k" * 128)
    assert item["projectKey"] == "k" * 128


async def test_user_memory_ignores_a_project_key(me: As) -> None:
    item = await me.create("偏好", "USER", "mao")
    assert item["projectKey"] is None


@pytest.mark.parametrize(
    "body",
    [
        {"scope": "TEAM", "content": "x"},
        {"content": "x"},
        {"scope": "USER"},
        {"scope": "USER", "content": 5},
        [],
    ],
)
async def test_bad_bodies_are_400_with_the_envelope(me: As, body: object) -> None:
    envelope_error(await me.post("/api/v1/memory", body), 400, 40000)


async def test_duplicate_content_after_normalization_is_409_40900(me: As) -> None:
    await me.create("报告 用中文")
    envelope_error(
        await me.post("/api/v1/memory", {"scope": "USER", "content": " 报告\n用中文 "}), 409, 40900
    )
    # The same words in a project scope are another memory.
    await me.create("报告 用中文", "PROJECT", "mao")


async def test_the_201st_active_memory_is_409_40901(me: As, mysql_db: Database) -> None:
    await seed_many(mysql_db, me.user_id, [f"事实{i}" for i in range(200)])
    envelope_error(await me.post("/api/v1/memory", {"scope": "USER", "content": "再一条"}), 409, 40901)


async def test_list_pages_newest_first_with_total(me: As) -> None:
    for i in range(5):
        await me.create(f"第{i}条")
    first = (await me.get("/api/v1/memory", params={"page": 1, "pageSize": 2})).json()["data"]
    third = (await me.get("/api/v1/memory", params={"page": 3, "pageSize": 2})).json()["data"]
    assert first["total"] == 5 and (first["page"], first["pageSize"]) == (1, 2)
    assert [i["content"] for i in first["items"]] == ["第4条", "第3条"]
    assert [i["content"] for i in third["items"]] == ["第0条"]


async def test_list_filters_by_scope_project_and_status(me: As) -> None:
    user_item = await me.create("用户级")
    await me.create("项目级", "PROJECT", "mao")
    await me.create("别的项目", "PROJECT", "other")
    await me.patch(f"/api/v1/memory/{user_item['id']}", {"status": "DISMISSED"})

    async def contents(**params: str) -> list[str]:
        data = (await me.get("/api/v1/memory", params=params)).json()["data"]
        return sorted(i["content"] for i in data["items"])

    assert await contents(scope="PROJECT") == ["别的项目", "项目级"]
    assert await contents(scope="PROJECT", projectKey="mao") == ["项目级"]
    assert await contents(status="DISMISSED") == ["用户级"]
    assert await contents(status="ACTIVE", scope="USER") == []


@pytest.mark.parametrize(
    "params",
    [{"page": 0}, {"pageSize": 101}, {"pageSize": 0}, {"scope": "X"}, {"status": "GONE"}, {"page": "a"}],
)
async def test_bad_paging_or_filters_are_400(me: As, params: dict[str, object]) -> None:
    envelope_error(await me.get("/api/v1/memory", params=params), 400, 40000)


async def test_dismiss_and_restore_both_ways(me: As) -> None:
    item = await me.create("可忽略")
    dismissed = (await me.patch(f"/api/v1/memory/{item['id']}", {"status": "DISMISSED"})).json()["data"]
    restored = (await me.patch(f"/api/v1/memory/{item['id']}", {"status": "ACTIVE"})).json()["data"]
    assert (dismissed["status"], restored["status"]) == ("DISMISSED", "ACTIVE")


async def test_restoring_at_200_active_is_409_40901(me: As, mysql_db: Database) -> None:
    item = await me.create("先忽略")
    await me.patch(f"/api/v1/memory/{item['id']}", {"status": "DISMISSED"})
    await seed_many(mysql_db, me.user_id, [f"事实{i}" for i in range(200)])
    envelope_error(await me.patch(f"/api/v1/memory/{item['id']}", {"status": "ACTIVE"}), 409, 40901)


async def test_edit_rehashes_and_a_collision_is_409(me: As) -> None:
    first = await me.create("原文")
    await me.create("已有")
    edited = (await me.patch(f"/api/v1/memory/{first['id']}", {"content": "改后"})).json()["data"]
    assert edited["content"] == "改后"
    envelope_error(await me.patch(f"/api/v1/memory/{first['id']}", {"content": " 已有 "}), 409, 40900)
    # The old wording is free again: the hash moved with the content.
    await me.create("原文")


async def test_editing_a_dismissed_memory_keeps_it_dismissed(me: As) -> None:
    item = await me.create("原文")
    await me.patch(f"/api/v1/memory/{item['id']}", {"status": "DISMISSED"})
    edited = (await me.patch(f"/api/v1/memory/{item['id']}", {"content": "新文"})).json()["data"]
    assert (edited["content"], edited["status"]) == ("新文", "DISMISSED")


async def test_editing_an_auto_memory_makes_it_manual(me: As, mysql_db: Database) -> None:
    [row_id] = await seed_many(mysql_db, me.user_id, ["模型写的"])
    edited = (await me.patch(f"/api/v1/memory/{row_id}", {"content": "我改的"})).json()["data"]
    assert (edited["source"], edited["content"]) == ("MANUAL", "我改的")


async def test_empty_patch_is_400(me: As) -> None:
    item = await me.create("x")
    envelope_error(await me.patch(f"/api/v1/memory/{item['id']}", {}), 400, 40000)


async def test_delete_is_physical_and_history_survives(me: As, mysql_db: Database) -> None:
    item = await me.create("要删的")
    await me.patch(f"/api/v1/memory/{item['id']}", {"content": "要删的(改)"})
    response = await me.delete(f"/api/v1/memory/{item['id']}")
    assert response.status_code == 200 and response.json()["data"] == {"id": item["id"]}
    assert await items(mysql_db, me.user_id) == []
    trail = (await me.get(f"/api/v1/memory/{item['id']}/history")).json()["data"]
    assert [(h["action"], h["actor"]) for h in trail] == [
        ("create", "user"),
        ("edit", "user"),
        ("delete", "user"),
    ]
    # The trail keeps what happened and when, never the words (issue 38).
    assert all(h["oldContent"] is None and h["newContent"] is None and h["contentErased"] for h in trail)
    # D3: the same content can be created again after a delete.
    await me.create("要删的(改)")


async def test_another_users_memory_is_404_for_every_operation(me: As, other: As) -> None:
    item = await me.create("我的")
    url = f"/api/v1/memory/{item['id']}"
    envelope_error(await other.patch(url, {"content": "偷改"}), 404, 40400)
    envelope_error(await other.patch(url, {"status": "DISMISSED"}), 404, 40400)
    envelope_error(await other.delete(url), 404, 40400)
    envelope_error(await other.get(f"{url}/history"), 404, 40400)
    envelope_error(await other.get(url), 404, 40400)
    assert (await other.get("/api/v1/memory")).json()["data"]["total"] == 0
    mine = (await me.get("/api/v1/memory")).json()["data"]["items"]
    assert [(i["content"], i["status"]) for i in mine] == [("我的", Status.ACTIVE.value)]


async def test_the_owner_reads_one_memory_until_it_is_deleted(me: As) -> None:
    item = await me.create("单独读取的记忆", "PROJECT", "alpha")
    url = f"/api/v1/memory/{item['id']}"
    read = await me.get(url)
    assert read.status_code == 200 and read.json() == {"code": 0, "message": "success", "data": item}
    await me.delete(url)
    envelope_error(await me.get(url), 404, 40400)
    envelope_error(await me.get("/api/v1/memory/999999999999"), 404, 40400)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b'{"scope": "USER", "content": "x",}', "Expecting property name enclosed in double quotes"),
        (b"{'scope': 'USER'}", "Expecting property name enclosed in double quotes"),
        (b'{"scope": "USER"', "Expecting ',' delimiter"),
    ],
)
async def test_a_malformed_json_body_is_400_with_a_readable_message(me: As, body: bytes, reason: str) -> None:
    response = await me.client.post(
        "/api/v1/memory", content=body, headers={**me.headers, "content-type": "application/json"}
    )
    envelope_error(response, 400, 40000)
    message = response.json()["message"]
    assert message.startswith(f"the request body is not valid JSON: {reason} at character ")


async def test_the_interactive_api_page_is_served_and_can_be_switched_off(
    http: httpx.AsyncClient, tmp_path: Path
) -> None:
    page = await http.get("/docs")
    assert page.status_code == 200 and "swagger-ui" in page.text and "/openapi.json" in page.text
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None, database_url=f"sqlite+aiosqlite:///{tmp_path / 'off.db'}", api_docs=False
    )
    service = build_service(settings, Mode.API)
    app = service.http
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as off:
            envelope_error(await off.get("/docs"), 404, 40400)
            assert (await off.get("/openapi.json")).status_code == 200  # the schema stays
    finally:
        await service.db.dispose()


async def test_unknown_ids_and_routes_answer_in_the_envelope(me: As) -> None:
    envelope_error(await me.delete("/api/v1/memory/999999999999"), 404, 40400)
    envelope_error(await me.get("/api/v1/nothing-here"), 404, 40400)
    envelope_error(await me.post("/api/v1/memory/settings", {}), 405, 40500)
    envelope_error(await me.delete("/api/v1/memory/abc"), 400, 40000)
    envelope_error(await me.delete(f"/api/v1/memory/{2**63}"), 400, 40000)


async def test_settings_default_off_and_patch_persists(me: As) -> None:
    assert (await me.get("/api/v1/memory/settings")).json()["data"] == {"autoCaptureEnabled": False}
    patched = await me.patch("/api/v1/memory/settings", {"autoCaptureEnabled": True})
    assert patched.json()["data"] == {"autoCaptureEnabled": True}
    assert (await me.get("/api/v1/memory/settings")).json()["data"] == {"autoCaptureEnabled": True}
    envelope_error(await me.patch("/api/v1/memory/settings", {"autoCaptureEnabled": "yes"}), 400, 40000)


async def test_projects_come_from_events_and_project_memories_without_robot_keys(
    me: As, mysql_db: Database
) -> None:
    await remember_projects(mysql_db, me.user_id, "zeta", "WEIXIN")
    await me.create("项目事实", "PROJECT", "alpha")
    await me.create("机器人", "PROJECT", "FEISHU")
    assert (await me.get("/api/v1/memory/projects")).json()["data"] == ["alpha", "zeta"]


async def test_oversized_body_is_413_with_the_envelope(me: As) -> None:
    response = await me.client.post(
        "/api/v1/memory", headers=me.headers, content=b'{"scope":"USER","content":"' + b"x" * 70_000 + b'"}'
    )
    envelope_error(response, 413, 41300)


@pytest.mark.parametrize(
    ("method", "url", "body"),
    [
        ("POST", "/api/v1/memory", b'{"scope":"USER","content":"a \\ud800 b"}'),
        ("POST", "/api/v1/memory", b'{"scope":"USER","content":"a \xed\xa0\x80 b"}'),
        ("POST", "/api/v1/memory", b'{"scope":"PROJECT","projectKey":"p\\udfff","content":"ok"}'),
        ("PATCH", "/api/v1/memory/{id}", b'{"content":"\\udc00"}'),
        ("PATCH", "/api/v1/memory/settings", b'{"autoCaptureEnabled":true,"\\ud83d":1}'),
        ("PUT", "/api/v1/admin/memory/settings", b'{"extractionModelId":"m\\ud800"}'),
    ],
)
async def test_a_lone_surrogate_anywhere_in_a_body_is_400_and_stores_nothing(
    me: As, mysql_db: Database, method: str, url: str, body: bytes
) -> None:
    """Escaped (\\ud800) or as raw UTF-8 bytes of a surrogate, which Python's JSON decoder lets through."""
    item = await me.create("原来的内容")
    headers = {**me.headers, **bearer(token(me.user_id, ["memory:admin", "memory:read"]))}
    response = await me.client.request(
        method,
        url.format(id=item["id"]),
        content=body,
        headers={**headers, "content-type": "application/json"},
    )
    envelope_error(response, 400, 40000)
    assert "Unicode" in response.json()["message"]
    assert [i.content for i in await items(mysql_db, me.user_id)] == ["原来的内容"]


async def test_sql_metacharacters_are_plain_data(me: As) -> None:
    hostile = "'; DROP TABLE memory_item; -- \" OR 1=1 /* %_ \\"
    item = await me.create(hostile, "PROJECT", "p'; DELETE FROM memory_item; --")
    listed = (await me.get("/api/v1/memory", params={"projectKey": "p'; DELETE FROM memory_item; --"})).json()
    assert [i["content"] for i in listed["data"]["items"]] == [hostile] and item["content"] == hostile


async def test_concurrent_creates_of_one_content_one_wins(me: As) -> None:
    responses = await asyncio.gather(
        *(me.post("/api/v1/memory", {"scope": "USER", "content": "同时创建"}) for _ in range(5))
    )
    assert sorted(r.status_code for r in responses) == [201, 409, 409, 409, 409]
