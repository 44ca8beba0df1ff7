"""Deletion that deletes (issue 38): a user's delete takes a memory's words out of every table and
every answer, and an erasure removes everything the service keeps for a user. On both dialects,
through the real API app, extraction handler and consolidator."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest

from service.adapters.db.database import Database
from service.adapters.db.engine import build_engine, upgrade_schema
from service.adapters.db.erasure_repository import ERASED_TABLES
from service.adapters.db.tables import metadata
from service.adapters.llm_client import LlmClient
from service.adapters.metrics import Metrics
from service.app.consolidation import Consolidator
from service.app.extraction import Extracted
from service.bootstrap import build_service
from service.config import Settings
from service.core.consolidation import RunResult, Thresholds
from service.core.model import DismissedBy, Status
from service.core.outcomes import Outcome
from service.entrypoints.process import Mode
from tests.conftest import said
from tests.integration.conftest import DEFAULT_MODEL, HandlerFactory, make_event
from tests.integration.http.conftest import As, internal_headers
from tests.support.pool import items, seed
from tests.support.processes import ROOT, MariaDbDatabase
from tests.support.scripted_llm import ScriptedLlm
from tests.support.stored import every_stored_text, rows_of_user
from tests.support.tokens import INTERNAL, SECRET

ADMIN = ["memory:read"]


@dataclass
class World:
    """The API app over one database, and that database for the handler, consolidator and scans."""

    http: httpx.AsyncClient
    db: Database
    url: str


@pytest.fixture(params=["mysql", "sqlite"])
async def world(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[World]:
    if request.param == "mysql":
        url = request.getfixturevalue("mariadb").url
    else:
        url = f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('erasure') / 'memory.db'}"
        upgrade_schema(url)
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None, database_url=url, jwt_secret=SECRET, internal_token=INTERNAL
    )
    service = build_service(settings, Mode.API)
    transport = httpx.ASGITransport(app=service.http)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        yield World(client, service.db, url)
    await service.db.dispose()


@dataclass
class Lifecycle:
    merged_id: int
    sources: list[int]
    texts: list[str]


async def extract(
    make_handler: HandlerFactory, llm: ScriptedLlm, db: Database, user_id: int, answer: object
) -> None:
    llm.reset()
    llm.script(f"step{user_id}", [answer])
    event = make_event(user_id, 7, lastUserMessage=said(f"step{user_id}"), projectKey="proj-erase")
    assert (await make_handler(db).handle(event))[0] is Outcome.EXTRACTED


async def lifecycle(
    world: World, make_handler: HandlerFactory, llm: ScriptedLlm, llm_client: LlmClient, me: As
) -> Lifecycle:
    """A memory through insert, touch, update, merge (consolidation) and edit; its texts."""
    user, db = me.user_id, world.db
    a1, a2, b1, m1, m2 = (f"秘密{user}-{name}" for name in ("甲一", "甲二", "乙一", "合一", "合二"))
    response = await me.patch("/api/v1/memory/settings", {"autoCaptureEnabled": True})
    assert response.status_code == 200, response.text
    await extract(make_handler, llm, db, user, {"type": "user", "action": "insert", "content": a1})
    await extract(make_handler, llm, db, user, {"type": "user", "action": "touch", "existingId": 1})
    await extract(
        make_handler, llm, db, user, {"type": "user", "action": "update", "existingId": 1, "content": a2}
    )
    await extract(make_handler, llm, db, user, {"type": "user", "action": "insert", "content": b1})
    sources = [i.id for i in await items(db, user)]
    llm.reset()
    llm.script(b1, [{"op": "merge", "sourceIds": [1, 2], "content": m1}])
    consolidator = Consolidator(db, llm_client, Metrics(), Thresholds(user_target=1))
    assert await consolidator.run(Extracted(user, None, DEFAULT_MODEL, 1, 2)) == [RunResult.APPLIED]
    [merged] = [i for i in await items(db, user) if i.id not in sources]
    assert merged.content == m1 and len(await items(db, user)) == 1
    response = await me.patch(f"/api/v1/memory/{merged.id}", {"content": m2})
    assert response.status_code == 200, response.text
    return Lifecycle(merged.id, sources, [a1, a2, b1, m1, m2])


async def every_answer(world: World, me: As, ids: list[int]) -> list[str]:
    """Every HTTP answer about the user: theirs, the admin's audit, the injection."""
    admin = As(world.http, me.user_id + 1, ADMIN)
    user = {"userId": me.user_id}
    answers = [
        await me.get("/api/v1/memory", params={"pageSize": 100}),
        await me.get("/api/v1/memory/projects"),
        await me.get("/api/v1/memory/settings"),
        await admin.get("/api/v1/admin/memory", params={**user, "pageSize": 100}),
        await admin.get("/api/v1/admin/memory/extractions", params=user),
        await world.http.get("/internal/v1/memory/injection", params=user, headers=internal_headers()),
        await world.http.get(
            "/internal/v1/memory/injection",
            params={**user, "projectKey": "proj-erase"},
            headers=internal_headers(),
        ),
    ]
    for memory_id in ids:
        answers.append(await me.get(f"/api/v1/memory/{memory_id}/history"))
        answers.append(await admin.get(f"/api/v1/admin/memory/{memory_id}/history", params=user))
    return [r.text for r in answers]


async def test_a_deleted_memory_leaves_no_word_in_any_table_or_answer(
    world: World, make_handler: HandlerFactory, llm: ScriptedLlm, llm_client: LlmClient, user_id: int
) -> None:
    me = As(world.http, user_id)
    kept = f"留下{user_id}"
    story = await lifecycle(world, make_handler, llm, llm_client, me)
    await me.create(kept)
    ids = [story.merged_id, *story.sources]
    before = "\n".join(await every_stored_text(world.db))
    assert all(text in before for text in story.texts)  # the scan sees what is there

    response = await me.delete(f"/api/v1/memory/{story.merged_id}")
    assert response.status_code == 200, response.text

    stored = "\n".join(await every_stored_text(world.db))
    answered = "\n".join(await every_answer(world, me, ids))
    assert [t for t in story.texts if t in stored] == []
    assert [t for t in story.texts if t in answered] == []
    assert kept in stored and kept in answered  # another memory's words stay
    mine = (await me.get(f"/api/v1/memory/{story.merged_id}/history")).json()["data"]
    admin = As(world.http, user_id + 1, ADMIN)
    audit = (
        await admin.get(f"/api/v1/admin/memory/{story.merged_id}/history", params={"userId": user_id})
    ).json()["data"]
    assert audit == mine
    assert [(h["action"], h["actor"]) for h in mine] == [
        ("merge", "consolidator"),
        ("edit", "user"),
        ("delete", "user"),
    ]
    assert all(h["contentErased"] and h["contentErasedAt"] == mine[-1]["createdAt"] for h in mine)
    assert all(h["oldContent"] is None and h["newContent"] is None for h in mine)
    assert mine[0]["model"] == DEFAULT_MODEL
    source = (await me.get(f"/api/v1/memory/{story.sources[0]}/history")).json()["data"]
    assert [h["action"] for h in source] == ["insert", "touch", "update", "merge"]
    assert all(h["contentErased"] and h["eventId"] for h in source[:3])
    print("user's history of the deleted memory:", json.dumps(mine, ensure_ascii=False, indent=1))
    print("admin's history of a row it was merged from:", json.dumps(source, ensure_ascii=False, indent=1))


async def test_deleting_a_memory_keeps_the_words_of_rows_it_was_not_built_from(
    world: World, user_id: int
) -> None:
    """A dismissal keeps the words (the model must not offer the fact again); a delete of another
    memory leaves them alone."""
    me = As(world.http, user_id)
    gone, dismissed = await me.create(f"删{user_id}"), await me.create(f"拒{user_id}")
    await me.patch(f"/api/v1/memory/{dismissed['id']}", {"status": "DISMISSED"})
    await me.delete(f"/api/v1/memory/{gone['id']}")
    assert (await me.delete(f"/api/v1/memory/{gone['id']}")).status_code == 404  # a second click

    history = (await me.get(f"/api/v1/memory/{dismissed['id']}/history")).json()["data"]
    assert [(h["action"], h["contentErased"]) for h in history] == [("create", False), ("dismiss", False)]
    assert history[1]["oldContent"] == f"拒{user_id}"


async def test_erasing_a_user_removes_every_row_and_a_second_erasure_answers_zeros(
    world: World, make_handler: HandlerFactory, llm: ScriptedLlm, llm_client: LlmClient, user_id: int
) -> None:
    me, neighbour = As(world.http, user_id), As(world.http, user_id + 2)
    story = await lifecycle(world, make_handler, llm, llm_client, me)
    await me.create(f"手写{user_id}")  # ACTIVE, MANUAL
    rejected = await me.create(f"拒绝{user_id}")
    await me.patch(f"/api/v1/memory/{rejected['id']}", {"status": "DISMISSED"})
    await seed(
        world.db, user_id, f"收起{user_id}", status=Status.DISMISSED, dismissed_by=DismissedBy.CAPACITY
    )
    deleted = await me.create(f"已删{user_id}")
    await me.delete(f"/api/v1/memory/{deleted['id']}")
    await neighbour.create(f"邻居{user_id}")
    before = await rows_of_user(world.db, user_id)
    assert all(before[table.name] > 0 for _, table in ERASED_TABLES), before

    response = await world.http.delete(f"/internal/v1/memory/users/{user_id}", headers=internal_headers())

    assert response.status_code == 200, response.text
    removed = response.json()["data"]
    print("erasure's answer:", json.dumps(removed))
    assert removed["removed"] == {name: before[table.name] for name, table in ERASED_TABLES}
    assert set(removed["removed"]) == {
        "history",
        "memories",
        "capturePreference",
        "projects",
        "ledger",
        "userState",
    }
    assert all(n == 0 for n in (await rows_of_user(world.db, user_id)).values())
    stored = "\n".join(await every_stored_text(world.db))
    assert not any(t in stored for t in story.texts) and f"邻居{user_id}" in stored
    admin = As(world.http, user_id + 1, ADMIN)
    listed = (await admin.get("/api/v1/admin/memory", params={"userId": user_id})).json()["data"]
    assert listed["total"] == 0 and listed["items"] == []
    history = await admin.get(f"/api/v1/admin/memory/{story.merged_id}/history", params={"userId": user_id})
    assert history.status_code == 404
    assert (await me.get("/api/v1/memory/settings")).json()["data"]["autoCaptureEnabled"] is False

    again = await world.http.delete(f"/internal/v1/memory/users/{user_id}", headers=internal_headers())
    assert again.status_code == 200
    assert set(again.json()["data"]["removed"].values()) == {0}
    metrics = (await world.http.get("/metrics")).text
    assert "\nmao_memory_user_erasures_total 2.0\n" in metrics


async def test_erasure_needs_the_internal_token_and_a_valid_user_id(world: World, user_id: int) -> None:
    me = As(world.http, user_id)
    await me.create(f"留着{user_id}")
    assert (await me.delete(f"/internal/v1/memory/users/{user_id}")).status_code == 401  # a user's JWT
    assert (await world.http.delete(f"/internal/v1/memory/users/{user_id}")).status_code == 401
    for bad in ("0", "-1", "abc", str(2**63)):
        response = await world.http.delete(f"/internal/v1/memory/users/{bad}", headers=internal_headers())
        assert response.status_code == 400, (bad, response.text)
    assert len(await items(world.db, user_id)) == 1


def test_erase_user_command_prints_what_it_removed_and_logs_counts_only(
    mariadb: MariaDbDatabase, user_id: int
) -> None:
    env = {"MEMORY_DATABASE_URL": mariadb.url, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}

    def erase(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(  # noqa: PLW1510 (the exit status is asserted)
            [sys.executable, "-m", "service.main", "erase-user", *args],
            env={**os.environ, **env},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )

    async def seeded() -> None:
        db = Database(build_engine(mariadb.url, 1))
        await seed(db, user_id, f"命令行{user_id}")
        await db.dispose()

    asyncio.run(seeded())
    first = erase(str(user_id))
    assert first.returncode == 0, first.stderr
    lines = [json.loads(line) for line in first.stdout.splitlines()]
    assert lines[-1] == {
        "userId": user_id,
        "removed": {
            "history": 0,
            "memories": 1,
            "capturePreference": 0,
            "projects": 0,
            "ledger": 0,
            "userState": 0,
        },
    }
    [logged] = [line for line in lines if line.get("event") == "user_erased"]
    assert logged["user_id"] == user_id and logged["memories"] == 1
    assert f"命令行{user_id}" not in first.stdout + first.stderr
    second = erase(str(user_id))
    assert second.returncode == 0 and set(json.loads(second.stdout.splitlines()[-1])["removed"].values()) == {
        0
    }
    assert erase("0").returncode == 2 and erase("x").returncode == 2


def test_every_table_with_a_user_column_is_erased() -> None:
    """A new per-user table must join the erasure, or this fails."""
    per_user = {t.name for t in metadata.sorted_tables if "user_id" in t.c}
    assert per_user == {table.name for _, table in ERASED_TABLES}
