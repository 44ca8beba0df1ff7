# The first released migration 0002 (commit 94cead0), kept as shipped: tests/integration/
# test_migration_0009_repair.py builds databases the way it left them. Not a migration of this tree.
"""Lifecycle: why a row is dismissed, ids never reused, one identity rule, consolidation due time.

- `memory_item.dismissed_by`: a DISMISSED row whose last change was a D14 demotion is CAPACITY,
  every other DISMISSED row USER.
- SQLite: `memory_item` and `memory_history` get AUTOINCREMENT; both dialects' counters start past
  every id any history row names, so a deleted memory's trail never shows up under a new one.
- Every `dedup_hash` is recomputed with the identity rule (NFKC, invisible characters removed,
  whitespace folded). Rows that now collide keep the oldest; each other one is deleted with a
  `merge` history row (actor `migration`). A kept row dismissed for capacity whose twin was ACTIVE
  is restored, so no active fact disappears.
- `memory_user_state.consolidation_due_at` replaces `last_consolidated_at` (last run + 24 h).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-03
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from service.core.model import Scope
from service.core.normalize import dedup_hash

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

Timestamp = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql")
COOLDOWN = timedelta(hours=24)

item = sa.table(
    "memory_item",
    sa.column("id", sa.BigInteger),
    sa.column("user_id", sa.BigInteger),
    sa.column("scope", sa.String),
    sa.column("project_key", sa.String),
    sa.column("content", sa.Text),
    sa.column("status", sa.String),
    sa.column("dismissed_by", sa.String),
    sa.column("dedup_hash", sa.String),
    sa.column("created_at", Timestamp),
    sa.column("updated_at", Timestamp),
)
history = sa.table(
    "memory_history",
    sa.column("id", sa.BigInteger),
    sa.column("memory_id", sa.BigInteger),
    sa.column("user_id", sa.BigInteger),
    sa.column("action", sa.String),
    sa.column("actor", sa.String),
    sa.column("old_content", sa.Text),
    sa.column("new_content", sa.Text),
    sa.column("created_at", Timestamp),
)


def upgrade() -> None:
    conn = op.get_bind()
    sqlite = conn.dialect.name == "sqlite"
    recreate = "always" if sqlite else "auto"
    with op.batch_alter_table(
        "memory_item", recreate=recreate, table_kwargs={"sqlite_autoincrement": True}
    ) as batch:
        batch.add_column(sa.Column("dismissed_by", sa.String(16), nullable=True))
    with op.batch_alter_table(
        "memory_history", recreate=recreate, table_kwargs={"sqlite_autoincrement": True}
    ) as batch:
        pass
    _backfill_dismissed_by(conn)
    _advance_id_counter(conn, sqlite)
    _rehash(conn)
    _consolidation_due_at()


def _backfill_dismissed_by(conn: sa.Connection) -> None:
    last_action = (
        sa.select(history.c.action)
        .where(history.c.user_id == item.c.user_id, history.c.memory_id == item.c.id)
        .order_by(history.c.id.desc())
        .limit(1)
        .scalar_subquery()
    )
    conn.execute(
        item.update()
        .where(item.c.status == "DISMISSED")
        .values(dismissed_by=sa.case((last_action == "demote", "CAPACITY"), else_="USER"))
    )


def _advance_id_counter(conn: sa.Connection, sqlite: bool) -> None:
    highest = conn.scalar(sa.select(sa.func.coalesce(sa.func.max(item.c.id), 0)))
    named = conn.scalar(sa.select(sa.func.coalesce(sa.func.max(history.c.memory_id), 0)))
    top = max(int(highest or 0), int(named or 0))
    if sqlite:
        conn.execute(sa.text("DELETE FROM sqlite_sequence WHERE name = 'memory_item'"))
        conn.execute(
            sa.text("INSERT INTO sqlite_sequence (name, seq) VALUES ('memory_item', :top)"), {"top": top}
        )
    else:
        # MySQL never lowers the counter below max(id) + 1, so this only ever moves it forward.
        conn.execute(sa.text(f"ALTER TABLE memory_item AUTO_INCREMENT = {top + 1}"))


def _rehash(conn: sa.Connection) -> None:
    rows = (
        conn.execute(sa.select(item).order_by(item.c.user_id, item.c.created_at, item.c.id)).mappings().all()
    )
    kept: dict[tuple[int, str], dict[str, Any]] = {}
    losers: list[tuple[dict[str, Any], dict[str, Any]]] = []
    changed: list[tuple[int, str]] = []
    for row in rows:
        digest = dedup_hash(Scope(row["scope"]), row["project_key"], row["content"])
        first = kept.setdefault((row["user_id"], digest), dict(row))
        if first["id"] != row["id"]:
            losers.append((dict(row), first))
        elif digest != row["dedup_hash"]:
            changed.append((row["id"], digest))
    now = datetime.now(UTC).replace(tzinfo=None)
    for loser, winner in losers:
        conn.execute(item.delete().where(item.c.id == loser["id"]))
        _record(conn, loser, "merge", loser["content"], winner["content"], now)
        if loser["status"] == "ACTIVE" and winner.get("dismissed_by") == "CAPACITY":
            conn.execute(
                item.update()
                .where(item.c.id == winner["id"])
                .values(status="ACTIVE", dismissed_by=None, updated_at=now)
            )
            _record(conn, winner, "restore", winner["content"], None, now)
            winner["dismissed_by"] = None
    # Two passes: a row's new hash may still be another row's old one until that row is updated.
    for row_id, _ in changed:
        conn.execute(item.update().where(item.c.id == row_id).values(dedup_hash=f"rehash-{row_id}"[:40]))
    for row_id, digest in changed:
        conn.execute(item.update().where(item.c.id == row_id).values(dedup_hash=digest))


def _record(
    conn: sa.Connection, row: dict[str, Any], action: str, old: str | None, new: str | None, now: datetime
) -> None:
    conn.execute(
        history.insert().values(
            memory_id=row["id"],
            user_id=row["user_id"],
            action=action,
            actor="migration",
            old_content=old,
            new_content=new,
            created_at=now,
        )
    )


def _consolidation_due_at() -> None:
    with op.batch_alter_table("memory_user_state") as batch:
        batch.add_column(sa.Column("consolidation_due_at", Timestamp, nullable=True))
    state = sa.table(
        "memory_user_state",
        sa.column("user_id", sa.BigInteger),
        sa.column("last_consolidated_at", Timestamp),
        sa.column("consolidation_due_at", Timestamp),
    )
    conn = op.get_bind()
    runs = conn.execute(
        sa.select(state.c.user_id, state.c.last_consolidated_at).where(
            state.c.last_consolidated_at.is_not(None)
        )
    ).all()
    for user_id, last in runs:
        conn.execute(
            state.update().where(state.c.user_id == user_id).values(consolidation_due_at=last + COOLDOWN)
        )
    with op.batch_alter_table("memory_user_state") as batch:
        batch.drop_column("last_consolidated_at")


def downgrade() -> None:
    with op.batch_alter_table("memory_user_state") as batch:
        batch.add_column(sa.Column("last_consolidated_at", Timestamp, nullable=True))
        batch.drop_column("consolidation_due_at")
    with op.batch_alter_table("memory_item") as batch:
        batch.drop_column("dismissed_by")
