"""No stored or returned field holds a control or direction character, whatever Unicode a user types
or a model answers: the API refuses it (400), the extraction strips it, a projectKey holding one is
no project. The rows are read back from MariaDB and every string of every answer is checked."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.adapters.db.database import Database
from service.core.model import MAX_MANUAL_CONTENT_CHARS, MAX_PROJECT_KEY_CHARS, Group, Scope
from service.core.normalize import hostile_character, text_problem
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
    assert created.status_code == (400 if text_problem(typed.strip(), MAX_MANUAL_CONTENT_CHARS) else 201)
    project = await me.post("/api/v1/memory", {"scope": "PROJECT", "content": "项目事实", "projectKey": key})
    assert project.status_code == (400 if text_problem(key.strip(), MAX_PROJECT_KEY_CHARS) else 201)
    if created.status_code == 201:
        edit = await me.patch(f"/api/v1/memory/{created.json()['data']['id']}", {"content": edited})
        assert edit.status_code in {200, 400, 409}

    # The machine's entrance: the model answers the same texts for a session under `key`.
    await set_capture(mysql_db, user)
    llm.script(f"m{user}", [{"type": "project", "content": typed}, {"type": "user", "content": edited}])
    await make_handler(mysql_db).handle(make_event(user, 1, projectKey=key, lastUserMessage=said(f"m{user}")))

    for answer in await answers(me, admin, http, key):
        assert all(hostile_character(text) is None for text in strings(answer)), answer
    rows = await items(mysql_db, user)
    for row in rows:
        assert hostile_character(row.content) is None and hostile_character(row.project_key) is None
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
