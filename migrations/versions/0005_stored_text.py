"""Stored text holds no control or direction character.

Every entrance now keeps C0 and C1 controls (other than the whitespace the identity rule folds) and
the bidi embeddings, overrides and isolates (U+202A–U+202E, U+2066–U+2069) out of stored text, and
any control, format, line-break or invisible character out of identifiers (`service/core/normalize.py`);
rows written before may hold them. This revision removes them, by the rule as it stands (migration
0006 runs it again where 0005 ran under an earlier one), from:

- `memory_item.content` (`strip_hostile`) and `project_key` (`strip_identifier`); a PROJECT row whose
  key has then nothing visible left becomes a USER row, as an event's fact under such a key is stored
  now, and a row whose content has nothing visible left is deleted, with a `delete` history row
  (actor `migration`);
- `memory_history.old_content`, `new_content` and `event_id`, which the history endpoint returns (an
  event id with nothing left becomes null);
- `memory_user_project.project_key`, which the project list returns (a key with nothing visible left
  is dropped).

Then every `dedup_hash` is recomputed, and rows of one user that now share one are folded by
migration 0002's precedence (`merge_twins`), with the same history rows: a key that differed only by
a direction mark, or a content only by a NUL or an invisible character, made two rows of one fact.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from types import ModuleType
from typing import Any

import sqlalchemy as sa
from alembic import op

from service.adapters.db.engine import migration
from service.core.model import Scope
from service.core.normalize import (
    dedup_hash,
    has_visible_text,
    hostile_character,
    strip_hostile,
    strip_identifier,
    trim,
)

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

BATCH = 2_000


# The history columns the endpoints return (migration 0002's table clause has no event_id).
trail = sa.table(
    "memory_history",
    sa.column("id", sa.BigInteger),
    sa.column("old_content", sa.Text),
    sa.column("new_content", sa.Text),
    sa.column("event_id", sa.String),
)
project = sa.table(
    "memory_user_project",
    sa.column("user_id", sa.BigInteger),
    sa.column("project_key", sa.String),
    sa.column("first_seen_at", sa.DateTime),
)


def upgrade() -> None:
    conn = op.get_bind()
    lifecycle = migration("0002_lifecycle.py")  # its tables, rehash and twin precedence, as they are
    _clean_history(conn)
    _clean_items(conn, lifecycle)
    _clean_projects(conn)
    lifecycle._rehash(conn)


def _clean(text: str) -> str:
    """`text` without control and direction characters, trimmed if any were removed."""
    return trim(strip_hostile(text)) if hostile_character(text) is not None else text


def _clean_key(text: str) -> str:
    """An identifier without what an identifier must not hold, trimmed if anything was removed."""
    stripped = strip_identifier(text)
    return trim(stripped) if stripped != text else text


def _clean_history(conn: sa.Connection) -> None:
    last = 0
    while rows := conn.execute(
        sa.select(trail.c.id, trail.c.old_content, trail.c.new_content, trail.c.event_id)
        .where(trail.c.id > last)
        .order_by(trail.c.id)
        .limit(BATCH)
    ).all():
        last = rows[-1].id
        for row in rows:
            old, new = (None if text is None else _clean(text) for text in (row.old_content, row.new_content))
            event_id = row.event_id and (_clean_key(row.event_id) or None)
            if (old, new, event_id) != (row.old_content, row.new_content, row.event_id):
                conn.execute(
                    trail.update()
                    .where(trail.c.id == row.id)
                    .values(old_content=old, new_content=new, event_id=event_id)
                )


def cleaned(row: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(scope, project key, content) as this revision leaves a `memory_item` row; None: deleted."""
    content, key = _clean(row["content"]), _clean_key(row["project_key"])
    if not has_visible_text(content):
        return None
    if row["scope"] == "PROJECT" and has_visible_text(key):
        return "PROJECT", key, content
    return "USER", "", content


def cleaned_hash(row: Mapping[str, Any]) -> str | None:
    """The row's hash once cleaned; None for a row this revision deletes."""
    if (kept := cleaned(row)) is None:
        return None
    scope, key, content = kept
    return dedup_hash(Scope(scope), key, content)


def _clean_items(conn: sa.Connection, lifecycle: ModuleType) -> None:
    item = lifecycle.item
    now = datetime.now(UTC).replace(tzinfo=None)
    for row in conn.execute(sa.select(item)).mappings().all():
        if (kept := cleaned(row)) is None:
            conn.execute(item.delete().where(item.c.id == row["id"]))
            lifecycle._record(conn, dict(row), "delete", _clean(row["content"]), None, now)
            continue
        scope, key, content = kept
        values = {"scope": scope, "project_key": key, "content": content}
        if values != {name: row[name] for name in values}:
            conn.execute(item.update().where(item.c.id == row["id"]).values(**values))


def _clean_projects(conn: sa.Connection) -> None:
    for row in conn.execute(sa.select(project)).all():
        key = _clean_key(row.project_key)
        if key == row.project_key and has_visible_text(key):
            continue
        conn.execute(
            project.delete().where(project.c.user_id == row.user_id, project.c.project_key == row.project_key)
        )
        # Asked of the database, whose collation decides which keys are one (MariaDB's ignores
        # trailing spaces: "mao" is already there when "mao " is).
        present = sa.select(project.c.user_id).where(
            project.c.user_id == row.user_id, project.c.project_key == key
        )
        if has_visible_text(key) and conn.execute(present).first() is None:
            conn.execute(
                project.insert().values(user_id=row.user_id, project_key=key, first_seen_at=row.first_seen_at)
            )


def downgrade() -> None:
    """The removed characters are not put back."""
