"""Migration 0005 removes control and direction characters from stored text, on both dialects.

Rows are written at revision 0004 the way the service wrote them before the text rule (the API
stored what was typed, an event's projectKey was only trimmed), each with its history, then
upgraded to head: contents, keys, history and the project list come back clean, every hash is the
identity rule's, and rows that became twins are folded by migration 0002's precedence.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy import create_engine

from service.adapters.db.engine import sync_url, upgrade_schema
from service.core.model import Scope
from service.core.normalize import dedup_hash, hostile_character
from tests.support.old_pools import database_at
from tests.support.processes import MariaDbDatabase

DAY0 = datetime(2026, 11, 1, 9, 0)
USER = 500


@dataclass(frozen=True)
class Old:
    id: int
    scope: str
    project_key: str
    content: str
    source: str
    status: str = "ACTIVE"
    dismissed_by: str | None = None
    day: int = 0


MADE = {"AUTO": ("insert", "auto"), "MANUAL": ("create", "user"), "CONSOLIDATED": ("merge", "consolidator")}
ROWS = [
    # A project key that differed by a direction mark: the model's row and the user's are one fact.
    Old(1, "PROJECT", "mao\u202e", "该仓库测试用 Vitest", "AUTO"),
    Old(2, "PROJECT", "mao", "该仓库测试用 Vitest", "MANUAL", day=1),
    # A NUL the identity rule read as a space: the user's rejection of the fact stands.
    Old(3, "USER", "", "报告\x00用中文", "AUTO", "DISMISSED", "USER"),
    Old(4, "USER", "", "报告用中文", "AUTO", day=5),
    # A key with nothing visible left: the fact is the user's, beside its capacity-demoted twin.
    Old(5, "PROJECT", "\u2066\u2069", "周报\u202e周一发", "CONSOLIDATED", day=2),
    Old(6, "USER", "", "周报周一发", "AUTO", "DISMISSED", "CAPACITY"),
    # Nothing visible at all.
    Old(7, "USER", "", "\u202e\x00\u200b", "MANUAL"),
    # Clean rows stay exactly as they were, whitespace and invisible marks included.
    Old(8, "USER", "", " 输出\u200b用中文\n", "MANUAL"),
    Old(9, "PROJECT", "beta", "用 pnpm\x1b[31m 管理依赖", "AUTO", day=3),
]
PROJECTS = ["mao\u202e", "mao", "\u2066", "beta\x00"]


def _at(day: int) -> datetime:
    return DAY0 + timedelta(days=day)


def _seed(conn: sa.Connection) -> None:
    items, trail = [], []
    for row in ROWS:
        # The hash revision 0004 stored: the identity rule over the key as it was.
        digest = dedup_hash(Scope(row.scope), row.project_key, row.content)
        changed = _at(row.day + 2) if row.status == "DISMISSED" else _at(row.day)
        items.append(
            dict(
                id=row.id, user_id=USER, scope=row.scope, project_key=row.project_key, content=row.content,
                source=row.source, status=row.status, dismissed_by=row.dismissed_by, dedup_hash=digest,
                origin_session_id=None, created_at=_at(row.day), updated_at=changed,
            )
        )  # fmt: skip
        action, actor = MADE[row.source]
        trail.append(dict(memory_id=row.id, user_id=USER, action=action, actor=actor, old_content=None,
                          new_content=row.content, created_at=_at(row.day)))  # fmt: skip
        if row.status == "DISMISSED":
            action, actor = ("dismiss", "user") if row.dismissed_by == "USER" else ("demote", "auto")
            trail.append(dict(memory_id=row.id, user_id=USER, action=action, actor=actor,
                              old_content=row.content, new_content=None, created_at=changed))  # fmt: skip
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
        upgrade_schema(url, "0004")
    else:
        database = MariaDbDatabase().create("0004")
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


def test_no_stored_text_keeps_a_control_or_direction_character(migrated: Migrated) -> None:
    texts = [r["content"] for r in migrated.items.values()] + [
        r["project_key"] for r in migrated.items.values()
    ]
    texts += [h[c] or "" for h in migrated.history for c in ("old_content", "new_content")]
    texts += list(migrated.projects)
    assert [t for t in texts if hostile_character(t) is not None] == []
    assert migrated.projects == {"mao", "beta"}


def test_every_hash_is_the_identity_rules(migrated: Migrated) -> None:
    for row in migrated.items.values():
        assert row["dedup_hash"] == dedup_hash(Scope(row["scope"]), row["project_key"], row["content"])


def state(migrated: Migrated, row_id: int) -> tuple[object, ...]:
    row = migrated.items[row_id]
    return row["scope"], row["project_key"], row["content"], row["source"], row["status"], row["dismissed_by"]


def actions(migrated: Migrated, row_id: int) -> list[tuple[str, str | None]]:
    return [(h["action"], h["old_content"]) for h in migrated.history if h["memory_id"] == row_id]


def test_rows_that_became_twins_fold_by_the_precedence_of_0002(migrated: Migrated) -> None:
    # The user's own row survives its machine-made twin, under the cleaned key.
    assert 1 not in migrated.items
    assert state(migrated, 2) == ("PROJECT", "mao", "该仓库测试用 Vitest", "MANUAL", "ACTIVE", None)
    assert actions(migrated, 2) == [("insert", None), ("create", None), ("merge", "该仓库测试用 Vitest")]
    # The rejection stands: no MANUAL row of the fact was written after it.
    assert 4 not in migrated.items
    assert state(migrated, 3) == ("USER", "", "报告用中文", "AUTO", "DISMISSED", "USER")
    assert ("merge", "报告用中文") in actions(migrated, 3)
    # No active fact disappears: the key-less project row becomes the USER fact and stays ACTIVE.
    assert 6 not in migrated.items
    assert state(migrated, 5) == ("USER", "", "周报周一发", "CONSOLIDATED", "ACTIVE", None)
    assert ("merge", "周报周一发") in actions(migrated, 5)


def test_a_row_with_nothing_visible_left_is_deleted_with_its_trail_kept(migrated: Migrated) -> None:
    assert 7 not in migrated.items
    assert [a for a, _ in actions(migrated, 7)] == ["create", "delete"]
    [deleted] = [h for h in migrated.history if h["memory_id"] == 7 and h["action"] == "delete"]
    assert deleted["actor"] == "migration"


def test_clean_rows_are_untouched_and_dirty_ones_lose_only_the_characters(migrated: Migrated) -> None:
    assert state(migrated, 8) == ("USER", "", " 输出\u200b用中文\n", "MANUAL", "ACTIVE", None)
    assert state(migrated, 9) == ("PROJECT", "beta", "用 pnpm[31m 管理依赖", "AUTO", "ACTIVE", None)
    assert actions(migrated, 9) == [("insert", None)]
    [made] = [h for h in migrated.history if h["memory_id"] == 9]
    assert made["new_content"] == "用 pnpm[31m 管理依赖"


@pytest.mark.parametrize("dialect", ["mysql", "sqlite"])
def test_a_cleaned_key_the_database_already_holds_is_not_added_twice(dialect: str, tmp_path: Path) -> None:
    """ "mao\\u200e" cleans to "mao", which MariaDB's collation holds already as "mao " (trailing
    spaces compare equal): the upgrade keeps one and does not stop on a duplicate key."""
    with database_at(dialect, "0004", tmp_path) as url:
        engine = create_engine(sync_url(url))
        try:
            with engine.begin() as conn:
                seen = [
                    dict(user_id=USER, project_key=key, first_seen_at=DAY0) for key in ("mao ", "mao\u200e")
                ]
                conn.execute(sa.table("memory_user_project", *map(sa.column, seen[0])).insert(), seen)
            upgrade_schema(url)
            with engine.connect() as conn:
                keys = conn.execute(sa.text("SELECT project_key FROM memory_user_project")).scalars().all()
                mao = conn.execute(
                    sa.text("SELECT count(*) FROM memory_user_project WHERE project_key = 'mao'")
                )
                assert mao.scalar() == 1
        finally:
            engine.dispose()
    assert [key for key in keys if hostile_character(key) is not None] == []
