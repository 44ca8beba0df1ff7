"""Stored text holds no control or direction character.

Every entrance now keeps C0 and C1 controls (other than the whitespace the identity rule folds) and
the bidi embeddings, overrides and isolates (U+202A–U+202E, U+2066–U+2069) out of stored text
(`service/core/normalize.py`); rows written before may hold them. This revision removes them
(`strip_hostile`) from:

- `memory_item.content` and `project_key`; a PROJECT row whose key has then nothing visible left
  becomes a USER row, as an event's fact under such a key is stored now, and a row whose content has
  nothing visible left is deleted, with a `delete` history row (actor `migration`);
- `memory_history.old_content` and `new_content`, which the history endpoint returns;
- `memory_user_project.project_key`, which the project list returns (a key with nothing visible left
  is dropped).

Then every `dedup_hash` is recomputed, and rows of one user that now share one are folded by
migration 0002's precedence (`merge_twins`), with the same history rows: a key that differed only by
a direction mark, or a content only by a NUL, made two rows of one fact.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-04
"""

from __future__ import annotations

import importlib.util
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op

from service.core.normalize import has_visible_text, hostile_character, strip_hostile

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

BATCH = 2_000


def _lifecycle() -> ModuleType:
    """Migration 0002, whose tables, rehash and twin precedence this revision reuses as they are."""
    path = Path(__file__).with_name("0002_lifecycle.py")
    spec = importlib.util.spec_from_file_location("_migration_0002", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


project = sa.table(
    "memory_user_project",
    sa.column("user_id", sa.BigInteger),
    sa.column("project_key", sa.String),
    sa.column("first_seen_at", sa.DateTime),
)


def upgrade() -> None:
    conn = op.get_bind()
    lifecycle = _lifecycle()
    _clean_history(conn, lifecycle.history)
    _clean_items(conn, lifecycle)
    _clean_projects(conn)
    lifecycle._rehash(conn)


def _clean(text: str) -> str:
    """`text` without control and direction characters, trimmed if any were removed."""
    return strip_hostile(text).strip() if hostile_character(text) is not None else text


def _clean_history(conn: sa.Connection, history: sa.TableClause) -> None:
    last = 0
    while rows := conn.execute(
        sa.select(history.c.id, history.c.old_content, history.c.new_content)
        .where(history.c.id > last)
        .order_by(history.c.id)
        .limit(BATCH)
    ).all():
        last = rows[-1].id
        for row in rows:
            old, new = (None if text is None else _clean(text) for text in (row.old_content, row.new_content))
            if (old, new) != (row.old_content, row.new_content):
                conn.execute(
                    history.update().where(history.c.id == row.id).values(old_content=old, new_content=new)
                )


def _clean_items(conn: sa.Connection, lifecycle: ModuleType) -> None:
    item = lifecycle.item
    now = datetime.now(UTC).replace(tzinfo=None)
    for row in conn.execute(sa.select(item)).mappings().all():
        content, key = _clean(row["content"]), _clean(row["project_key"])
        if not has_visible_text(content):
            conn.execute(item.delete().where(item.c.id == row["id"]))
            lifecycle._record(conn, dict(row), "delete", content, None, now)
            continue
        scope = "PROJECT" if row["scope"] == "PROJECT" and has_visible_text(key) else "USER"
        cleaned = {"content": content, "project_key": key if scope == "PROJECT" else "", "scope": scope}
        if cleaned != {name: row[name] for name in cleaned}:
            conn.execute(item.update().where(item.c.id == row["id"]).values(**cleaned))


def _clean_projects(conn: sa.Connection) -> None:
    rows = conn.execute(sa.select(project)).all()
    present = {(r.user_id, r.project_key) for r in rows}
    for row in rows:
        key = _clean(row.project_key)
        if key == row.project_key and has_visible_text(key):
            continue
        conn.execute(
            project.delete().where(project.c.user_id == row.user_id, project.c.project_key == row.project_key)
        )
        if has_visible_text(key) and (row.user_id, key) not in present:
            conn.execute(
                project.insert().values(user_id=row.user_id, project_key=key, first_seen_at=row.first_seen_at)
            )
            present.add((row.user_id, key))


def downgrade() -> None:
    """The removed characters are not put back."""
