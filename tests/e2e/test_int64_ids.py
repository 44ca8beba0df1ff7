"""Ids above 2^53 through the live HTTP server, read by a JavaScript client (Node's `fetch` and
`JSON.parse`), and ids in paths and queries held to the event's rule."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.adapters.db.database import Database
from service.adapters.db.engine import build_engine
from service.config import Settings
from service.core.events import BIGINT_MAX, ID_PATTERN
from service.core.model import USER_GROUP, Source
from service.core.normalize import dedup_hash
from service.core.records import HistoryAction, HistoryActor, HistoryEntry
from tests.support.live_http import live_server
from tests.support.pool import items
from tests.support.processes import OUTPUT, MariaDbDatabase
from tests.support.tokens import INTERNAL, SECRET, bearer, token

pytestmark = pytest.mark.mysql

NODE = shutil.which("node") or "/usr/bin/node"
SCRIPT = Path(__file__).with_name("int64_round_trip.mjs")
USER = 2**53 + 1  # 9007199254740993: JSON.parse reads a number …993 as …992
SESSION = 2**53 + 3  # 9007199254740995, read as …996 (the console's history drawer showed that)
FIRST_ROW = 2**53 + 9  # memory_item's and memory_history's AUTO_INCREMENT in this database
ID_FIELDS = {"id", "userId", "originSessionId"}
SEEDED = ["用中文写周报", "结论放在最前面", "测试用 Vitest"]
ID_COLUMNS = {
    ("memory_item", "id"),
    ("memory_item", "user_id"),
    ("memory_item", "origin_session_id"),
    ("memory_history", "id"),
    ("memory_history", "memory_id"),
    ("memory_history", "user_id"),
    ("memory_history", "session_id"),
}


@pytest.fixture(scope="module")
def big_ids() -> Iterator[MariaDbDatabase]:
    """A database of its own whose row ids start above 2^53."""
    database = MariaDbDatabase().create()
    with database.server.connect(database=database.name, autocommit=True) as conn, conn.cursor() as cur:
        for table in ("memory_item", "memory_history"):
            cur.execute(f"ALTER TABLE {table} AUTO_INCREMENT={FIRST_ROW}")
    yield database
    database.drop()


@pytest.fixture(scope="module")
async def big_db(big_ids: MariaDbDatabase) -> AsyncIterator[Database]:
    db = Database(build_engine(big_ids.url, pool_size=2), build_engine(big_ids.url, 2, autocommit=True))
    yield db
    await db.dispose()


@pytest.fixture(scope="module")
async def port(big_ids: MariaDbDatabase) -> AsyncIterator[int]:
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None, database_url=big_ids.url, jwt_secret=SECRET, internal_token=INTERNAL
    )
    async with live_server(settings) as bound:
        yield bound


async def seed_with_session(db: Database) -> list[int]:
    """The user's memories, each written by session SESSION, each with an insert in its history."""
    ids = []
    async with db.transaction() as uow:
        for content in SEEDED:
            digest = dedup_hash(USER_GROUP.scope, USER_GROUP.project_key, content)
            row = await uow.memories.insert(USER, USER_GROUP, content, digest, Source.AUTO, SESSION, db.now())
            entry = HistoryEntry(
                HistoryAction.INSERT, HistoryActor.AUTO, new_content=content, session_id=SESSION
            )
            await uow.memories.record(USER, row, entry, db.now())
            ids.append(row)
        await uow.accounts.mark_processed(f"big-{USER}", USER, SESSION, "extracted", db.now())
        await uow.commit()
    return ids


async def run_node(spec: dict[str, Any]) -> dict[str, Any]:
    """The client in its own process; the server answers from this test's event loop meanwhile."""
    child = await asyncio.create_subprocess_exec(
        NODE, str(SCRIPT), json.dumps(spec), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(child.communicate(), timeout=60)
    assert child.returncode == 0, err.decode()
    return json.loads(out)  # type: ignore[no-any-return]


def test_every_id_column_is_bigint(big_ids: MariaDbDatabase) -> None:
    with big_ids.server.connect(database=big_ids.name) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT table_name, column_name, data_type FROM information_schema.columns"
            " WHERE table_schema = DATABASE()"
        )
        types = {(t, c): kind for t, c, kind in cur.fetchall()}
    assert {column: types[column] for column in ID_COLUMNS} == dict.fromkeys(ID_COLUMNS, "bigint")


async def test_a_javascript_client_reads_and_sends_back_every_id_exactly(big_db: Database, port: int) -> None:
    seeded = await seed_with_session(big_db)
    assert min(seeded) >= FIRST_ROW
    spec = {
        "base": f"http://127.0.0.1:{port}",
        "user": str(USER),
        "seeded": [str(i) for i in seeded],
        "userToken": token(USER),
        "adminToken": token(1, ["memory:read"]),
        "internalToken": INTERNAL,
    }

    answer = await run_node(spec)

    rows = {i.content: i.id for i in await items(big_db, USER)}
    created = rows["Node 客户端改过的记忆"]  # created, then edited through the id Node read
    first, second, third = seeded
    assert third not in rows.values()  # deleted through the id Node sent
    memory_ids = [str(i) for i in (first, second, third)]
    expected: dict[str, dict[str, list[str]]] = {
        "list": {"id": memory_ids[::-1], "originSessionId": [str(SESSION)] * 3},
        "get": {"id": [str(first)], "originSessionId": [str(SESSION)]},
        "create": {"id": [str(created)]},
        "patch": {"id": [str(created), str(second)], "originSessionId": [str(SESSION)]},
        "history": {"originSessionId": [str(SESSION)]},
        "delete": {"id": [str(third)]},
        "admin list": {"id": [str(created), str(first)], "originSessionId": [str(SESSION)]},
        "admin history": {"originSessionId": [str(SESSION)]},
        "admin extractions": {"userId": [str(USER)]},
    }
    seen: dict[str, dict[str, list[str]]] = {}
    for entry in answer["seen"]:
        assert entry["type"] == "string", entry
        field = entry["field"].rsplit(".", 1)[1]
        seen.setdefault(entry["endpoint"], {}).setdefault(field, []).append(entry["value"])
    assert seen == expected
    assert answer["created"] == str(created) and created > 2**53
    # The injection answers no id; the userId the client sent reached this user, not …992.
    assert sorted(answer["injected"]) == sorted(["Node 客户端改过的记忆", SEEDED[0]])
    count = sum(len(values) for fields in seen.values() for values in fields.values())
    OUTPUT.mkdir(parents=True, exist_ok=True)
    (OUTPUT / "int64-round-trip.json").write_text(
        json.dumps({"idsChecked": count, "endpoints": sorted([*seen, "injection"])}, indent=2) + "\n"
    )


NOT_CANONICAL = ["+5", "05", " 5", "5.0", "1e3", "0", "-5", "5 ", "0x5", "٥", str(BIGINT_MAX + 1)]


@pytest.fixture
async def http(port: int) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        yield client


def refused(response: httpx.Response, name: str) -> None:
    assert response.status_code == 400, response.text
    envelope = response.json()
    assert envelope["code"] == 40000 and envelope["data"] is None, envelope
    assert envelope["message"].startswith(f"{name}: "), envelope


@pytest.mark.parametrize("sent", NOT_CANONICAL)
async def test_an_id_not_in_canonical_decimal_is_refused_in_paths_and_queries(
    http: httpx.AsyncClient, sent: str
) -> None:
    me, admin, internal = bearer(token(USER)), bearer(token(1, ["memory:read"])), bearer(INTERNAL)
    path = httpx.URL(f"/api/v1/memory/{sent}").raw_path.decode()  # " 5" as %205, as a client sends it
    refused(await http.get(path, headers=me), "memory_id")
    refused(await http.get(f"{path}/history", headers=me), "memory_id")
    refused(await http.patch(path, headers=me, json={"status": "ACTIVE"}), "memory_id")
    refused(await http.delete(path, headers=me), "memory_id")
    query = {"userId": sent}
    for url in ("/api/v1/admin/memory", "/api/v1/admin/memory/extractions", "/api/v1/admin/memory/1/history"):
        refused(await http.get(url, params=query, headers=admin), "userId")
    refused(await http.get("/internal/v1/memory/injection", params=query, headers=internal), "userId")
    erase = httpx.URL(f"/internal/v1/memory/users/{sent}").raw_path.decode()
    refused(await http.delete(erase, headers=internal), "userId")


@pytest.mark.parametrize("form", [int, str], ids=["number", "string"])
async def test_an_id_as_a_number_or_its_decimal_string_is_taken(
    http: httpx.AsyncClient, big_db: Database, form: type
) -> None:
    """A query parameter's value is text either way: the client's int and str forms send the same
    digits, and the largest id is still an id."""
    user = USER + 2 + 2 * (form is str)  # users of their own, above 2^53
    async with big_db.transaction() as uow:
        digest = dedup_hash(USER_GROUP.scope, USER_GROUP.project_key, "某条记忆")
        row = await uow.memories.insert(user, USER_GROUP, "某条记忆", digest, Source.AUTO, None, big_db.now())
        await uow.commit()
    admin = bearer(token(1, ["memory:read"]))
    listed = await http.get("/api/v1/admin/memory", params={"userId": form(user)}, headers=admin)
    assert [i["id"] for i in listed.json()["data"]["items"]] == [str(row)]
    mine = await http.get(f"/api/v1/memory/{form(row)}", headers=bearer(token(user)))
    assert mine.json()["data"]["id"] == str(row)
    largest = await http.get(f"/api/v1/memory/{form(BIGINT_MAX)}", headers=bearer(token(user)))
    assert (largest.status_code, largest.json()["code"]) == (404, 40400)


async def test_the_openapi_document_shows_every_id_as_a_decimal_string(http: httpx.AsyncClient) -> None:
    document = (await http.get("/openapi.json")).json()
    id_string = {"type": "string", "pattern": ID_PATTERN}
    shown = {}
    for name, schema in document["components"]["schemas"].items():
        for field in ID_FIELDS & set(schema.get("properties", {})):
            prop = schema["properties"][field]
            options = [o for o in prop.get("anyOf", [prop]) if o.get("type") != "null"]
            shown[f"{name}.{field}"] = [{k: o.get(k) for k in id_string} for o in options]
    assert shown == {
        "MemoryItem.id": [id_string],
        "MemoryItem.originSessionId": [id_string],
        "HistoryItem.originSessionId": [id_string],
        "Deleted.id": [id_string],
        "ExtractionUsage.userId": [id_string],
        "UserErased.userId": [id_string],
    }
    operations = [o for path in document["paths"].values() for o in path.values()]
    parameters = [p for o in operations for p in o.get("parameters", [])]
    ids = [p for p in parameters if p["name"] in {"memory_id", "userId"}]
    # The memory's get, patch, delete and history; the admin list, history (two) and extractions;
    # the injection; the erasure.
    assert len(ids) == 10
    for parameter in ids:
        assert {"type": "string", "pattern": ID_PATTERN} in [
            {k: o.get(k) for k in ("type", "pattern")} for o in parameter["schema"]["oneOf"]
        ]
