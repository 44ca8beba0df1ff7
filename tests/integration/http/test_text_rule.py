"""No stored or returned field holds a control or direction character, whatever Unicode a user types
or a model answers: the API refuses it (400), the extraction strips it, a projectKey holding one (or
any line break, format or invisible character) is no project. The rows are read back from MariaDB
and every string of every answer is checked; error messages never echo such characters either."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.adapters.db.database import Database
from service.core.model import MAX_MANUAL_CONTENT_CHARS, MAX_PROJECT_KEY_CHARS, Group, Scope
from service.core.normalize import hostile_character, identifier_problem, key_problem, text_problem, trim
from service.core.project_keys import RobotKeys
from tests.conftest import said
from tests.integration.conftest import HandlerFactory, make_event
from tests.integration.http.conftest import As, internal_headers
from tests.support.pool import history, items, seed, set_capture
from tests.support.scripted_llm import ScriptedLlm

_users = itertools.count(random.randint(10_000, 10_000_000) * 100_000 + 7_000_000_000_000)


def strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


def project_keys(value: object) -> Iterator[str]:
    """Every `projectKey` an answer carries."""
    if isinstance(value, dict):
        for name, item in value.items():
            if name == "projectKey" and isinstance(item, str):
                yield item
            else:
                yield from project_keys(item)
    elif isinstance(value, list):
        for item in value:
            yield from project_keys(item)


async def answers(me: As, admin: As, http: httpx.AsyncClient, key: str) -> list[object]:
    """Every read the API offers over the user's memories."""
    listed = (await me.get("/api/v1/memory", params={"pageSize": 100})).json()
    trails = [(await me.get(f"/api/v1/memory/{i['id']}/history")).json() for i in listed["data"]["items"]]
    audit = await admin.get("/api/v1/admin/memory", params={"userId": me.user_id, "pageSize": 100})
    injection = await http.get(
        "/internal/v1/memory/injection",
        params={"userId": me.user_id, "projectKey": key},
        headers=internal_headers(),
    )
    projects = await me.get("/api/v1/memory/projects")
    return [listed, *trails, audit.json(), injection.json(), projects.json()]


@settings(
    max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(typed=st.text(max_size=40), edited=st.text(max_size=40), key=st.text(max_size=12))
async def test_no_stored_or_returned_field_holds_a_control_or_direction_character(
    http: httpx.AsyncClient,
    mysql_db: Database,
    make_handler: HandlerFactory,
    llm: ScriptedLlm,
    typed: str,
    edited: str,
    key: str,
) -> None:
    user = next(_users)
    me, admin = As(http, user), As(http, user + 1, ["memory:read"])
    created = await me.post("/api/v1/memory", {"scope": "USER", "content": typed})
    assert created.status_code == (400 if text_problem(trim(typed), MAX_MANUAL_CONTENT_CHARS) else 201)
    project = await me.post("/api/v1/memory", {"scope": "PROJECT", "content": "项目事实", "projectKey": key})
    assert project.status_code == (400 if key_problem(trim(key), MAX_PROJECT_KEY_CHARS) else 201)
    if created.status_code == 201:
        edit = await me.patch(f"/api/v1/memory/{created.json()['data']['id']}", {"content": edited})
        assert edit.status_code in {200, 400, 409}

    # The machine's entrance: the model answers the same texts for a session under `key`.
    await set_capture(mysql_db, user)
    llm.script(f"m{user}", [{"type": "project", "content": typed}, {"type": "user", "content": edited}])
    await make_handler(mysql_db).handle(make_event(user, 1, projectKey=key, lastUserMessage=said(f"m{user}")))

    read = await answers(me, admin, http, key)
    for answer in read:
        assert all(hostile_character(text) is None for text in strings(answer)), answer
    keys = [*(k for answer in read for k in project_keys(answer)), *read[-1]["data"]]  # type: ignore[index]
    assert all(identifier_problem(k) is None for k in keys), keys
    rows = await items(mysql_db, user)
    for row in rows:
        assert hostile_character(row.content) is None and identifier_problem(row.project_key) is None
    assert {r.project_key for r in rows if r.scope == "PROJECT"} <= {RobotKeys().project(key)}
    for entry in await history(mysql_db, user):
        assert hostile_character(entry["old_content"] or "") is None
        assert hostile_character(entry["new_content"] or "") is None


async def test_the_injected_memories_carry_the_text_the_prompt_shows(
    http: httpx.AsyncClient, mysql_db: Database, user_id: int
) -> None:
    """A row written before the text rule (or by hand) is injected as the prompt renders it."""
    await seed(mysql_db, user_id, "报告\u202e用\x00中文\n写", age_minutes=2)
    await seed(mysql_db, user_id, "测试用 ```Vitest```", group=Group(Scope.PROJECT, "mao"), age_minutes=1)
    response = await http.get(
        "/internal/v1/memory/injection",
        params={"userId": user_id, "projectKey": "mao"},
        headers=internal_headers(),
    )
    data = response.json()["data"]
    contents = [m["content"] for m in data["memories"]]
    assert contents == ["测试用 '''Vitest'''", "报告用 中文 写"]
    assert data["prompt"].split("\n")[2:] == [f"- [项目:mao] {contents[0]}", f"- [用户] {contents[1]}"]


async def test_a_project_key_with_a_line_break_or_an_invisible_character_is_refused(me: As) -> None:
    for key in ["ma\no", "ma\to", "ma\x1co", "ma\x85o", "ma\u2028o", "ma\u200bo", "mao\ufe0f"]:
        body = {"scope": "PROJECT", "content": "该仓库测试用 Vitest", "projectKey": key}
        refused = await me.post("/api/v1/memory", body)
        assert refused.status_code == 400, key
        assert refused.json()["message"].startswith(
            "PROJECT.projectKey: Value error, must not contain control"
        )


async def test_controls_str_isspace_counts_as_whitespace_are_refused(me: As) -> None:
    for content in ["a\x1cb", "a\x85b", "\x1f报告"]:
        refused = await me.post("/api/v1/memory", {"scope": "USER", "content": content})
        assert refused.status_code == 400, content
        assert "must not contain control or direction characters" in refused.json()["message"]


async def test_invisible_only_content_is_blank_and_an_invisible_twin_is_a_duplicate(me: As) -> None:
    for invisible in ["\u034f", "\ufe0f" * 3, "\u3164", "\u115f", "\U000e0100", "\u180b", "\u17b4", "\u2800"]:
        blank = await me.post("/api/v1/memory", {"scope": "USER", "content": invisible})
        assert (
            blank.status_code == 400
            and blank.json()["message"] == "USER.content: Value error, must not be blank"
        )
    await me.create("报告用中文写")
    twin = await me.post("/api/v1/memory", {"scope": "USER", "content": "报告\u034f用中文写"})
    assert (twin.status_code, twin.json()["code"]) == (409, 40900)


async def test_an_error_message_never_echoes_control_direction_or_invisible_characters(me: As) -> None:
    hostile = "k\u202e\n\x00\u200b" + "x" * 500
    unknown_key = await me.post("/api/v1/memory", {"scope": "USER", "content": "a", hostile: 1})
    unknown_tag = await me.post("/api/v1/memory", {"scope": hostile, "content": "a"})
    for refused in (unknown_key, unknown_tag):
        message = refused.json()["message"]
        assert refused.status_code == 400 and message.isprintable() and "x" * 41 not in message, message
    assert unknown_key.json()["message"] == "USER.k " + "x" * 35 + "…: Extra inputs are not permitted"
