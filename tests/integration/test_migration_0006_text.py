"""Migration 0006 applies the sharpened text rule to a database already at revision 0005, on both
dialects: project keys and event ids lose controls (line breaks included), format and invisible
characters, contents lose U+001C–U+001F and U+0085, a content of invisible characters alone is
deleted, and texts that differed only by an invisible character fold into one memory."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy import create_engine

from service.adapters.db.engine import sync_url, upgrade_schema
from service.core.model import Scope
from service.core.normalize import dedup_hash, hostile_character, identifier_problem
from tests.support.processes import MariaDbDatabase

DAY0 = datetime(2026, 12, 1, 9, 0)
USER = 600


@dataclass(frozen=True)
class Old:
    id: int
    scope: str
    project_key: str
    content: str
    source: str
    event_id: str | None = None
    day: int = 0


# What revision 0005's rule let through.
ROWS = [
    # A key with a line break, and one with a zero-width space: both are the project "mao".
    Old(1, "PROJECT", "ma\no", "该仓库测试用 Vitest", "AUTO", event_id="ev-1\u202e\x00\n<script>"),
    Old(2, "PROJECT", "mao\u200b", "用 pnpm 管理依赖", "AUTO", event_id="\u200b"),
    Old(3, "PROJECT", "mao", "用 pnpm 管理依赖", "MANUAL", day=1),
    # A key of a variation selector alone: no project, the fact is the user's.
    Old(4, "PROJECT", "\ufe0f", "周报周一发", "AUTO"),
    # A content that differed from its twin by a combining grapheme joiner alone.
    Old(5, "USER", "", "报告\u034f用中文写", "AUTO"),
    Old(6, "USER", "", "报告用中文写", "MANUAL", day=1),
    # Controls str.isspace counts as whitespace, and a content of invisible characters only.
    Old(7, "USER", "", "a\x1cb\x85c", "MANUAL"),
    Old(8, "USER", "", "\u3164\ufe0f\u2800", "MANUAL"),
]
PROJECTS = ["ma\no", "mao\u200b", "mao", "\ufe0f", "beta\t"]


def _seed(conn: sa.Connection) -> None:
    items, trail = [], []
    for row in ROWS:
        at = DAY0 + timedelta(days=row.day)
        items.append(
            dict(
                id=row.id, user_id=USER, scope=row.scope, project_key=row.project_key, content=row.content,
                source=row.source, status="ACTIVE", dismissed_by=None, dedup_hash=f"by-0005-{row.id}",
                origin_session_id=None, created_at=at, updated_at=at,
            )
        )  # fmt: skip
        action, actor = ("insert", "auto") if row.source == "AUTO" else ("create", "user")
        trail.append(dict(memory_id=row.id, user_id=USER, action=action, actor=actor, old_content=None,
                          new_content=row.content, event_id=row.event_id, created_at=at))  # fmt: skip
    conn.execute(sa.table("memory_item", *map(sa.column, items[0])).insert(), items)
    conn.execute(sa.table("memory_history", *map(sa.column, trail[0])).insert(), trail)
    seen = [dict(user_id=USER, project_key=key, first_seen_at=DAY0) for key in PROJECTS]
    conn.execute(sa.table("memory_user_project", *map(sa.column, seen[0])).insert(), seen)


@dataclass
class Migrated:
    items: dict[int, sa.RowMapping]
    history: list[sa.RowMapping]
    projects: set[str]


@pytest.fixture(scope="module", params=["mysql", "sqlite"])
def migrated(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Migrated]:
    database = None
    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('text') / 'old.db'}"
        upgrade_schema(url, "0005")
    else:
        database = MariaDbDatabase().create("0005")
        url = database.url
    engine = create_engine(sync_url(url))
    try:
        with engine.begin() as conn:
            _seed(conn)
        upgrade_schema(url)
        with engine.connect() as conn:
            items = conn.execute(sa.text("SELECT * FROM memory_item ORDER BY id")).mappings().all()
            trail = conn.execute(sa.text("SELECT * FROM memory_history ORDER BY id")).mappings().all()
            projects = conn.execute(sa.text("SELECT project_key FROM memory_user_project")).scalars().all()
        yield Migrated({row["id"]: row for row in items}, list(trail), set(projects))
    finally:
        engine.dispose()
        if database is not None:
            database.drop()


def state(migrated: Migrated, row_id: int) -> tuple[object, ...]:
    row = migrated.items[row_id]
    return row["scope"], row["project_key"], row["content"], row["source"], row["status"]


def test_keys_and_event_ids_are_identifiers_and_contents_hold_no_control(migrated: Migrated) -> None:
    keys = [r["project_key"] for r in migrated.items.values()] + list(migrated.projects)
    assert [k for k in keys if identifier_problem(k) is not None] == []
    assert migrated.projects == {"mao", "beta"}
    assert state(migrated, 1) == ("PROJECT", "mao", "该仓库测试用 Vitest", "AUTO", "ACTIVE")
    assert state(migrated, 4) == ("USER", "", "周报周一发", "AUTO", "ACTIVE")
    assert state(migrated, 7) == ("USER", "", "abc", "MANUAL", "ACTIVE")
    texts = [r["content"] for r in migrated.items.values()]
    texts += [h[c] or "" for h in migrated.history for c in ("old_content", "new_content")]
    assert [t for t in texts if hostile_character(t) is not None] == []
    assert {h["event_id"] for h in migrated.history} == {"ev-1<script>", None}  # "\u200b" left nothing


def test_a_content_of_invisible_characters_alone_is_deleted(migrated: Migrated) -> None:
    assert 8 not in migrated.items
    [deleted] = [h for h in migrated.history if h["memory_id"] == 8 and h["action"] == "delete"]
    assert deleted["actor"] == "migration"


def test_texts_apart_by_an_invisible_character_fold_into_one_memory(migrated: Migrated) -> None:
    # The user's own rows survive their machine-made twins.
    assert 2 not in migrated.items and 5 not in migrated.items
    assert state(migrated, 3) == ("PROJECT", "mao", "用 pnpm 管理依赖", "MANUAL", "ACTIVE")
    assert state(migrated, 6) == ("USER", "", "报告用中文写", "MANUAL", "ACTIVE")
    for row in migrated.items.values():
        assert row["dedup_hash"] == dedup_hash(Scope(row["scope"]), row["project_key"], row["content"])
