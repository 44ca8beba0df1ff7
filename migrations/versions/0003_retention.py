"""Exact event ids and bounded storage.

- `memory_event_ledger.event_id` becomes VARBINARY on MySQL: `utf8mb4_bin` is a PAD SPACE
  collation, so ids differing only by trailing spaces were one event there and two in SQLite. Rows
  unique under the padded comparison are unique byte for byte, so the conversion cannot collide.
- `idx_ledger_processed_at`: retention deletes the oldest ledger rows in batches.
- `memory_history.repeat_count` / `last_at`: retention folds consecutive touches into one row.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

Timestamp = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql")


def upgrade() -> None:
    if op.get_bind().dialect.name == "mysql":
        op.alter_column(
            "memory_event_ledger",
            "event_id",
            existing_type=sa.String(128),
            type_=mysql.VARBINARY(512),
            existing_nullable=False,
        )
    op.create_index("idx_ledger_processed_at", "memory_event_ledger", ["processed_at"])
    with op.batch_alter_table("memory_history") as batch:
        batch.add_column(sa.Column("repeat_count", sa.Integer, nullable=False, server_default="1"))
        batch.add_column(sa.Column("last_at", Timestamp, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("memory_history") as batch:
        batch.drop_column("last_at")
        batch.drop_column("repeat_count")
    op.drop_index("idx_ledger_processed_at", "memory_event_ledger")
    if op.get_bind().dialect.name == "mysql":
        op.alter_column(
            "memory_event_ledger",
            "event_id",
            existing_type=mysql.VARBINARY(512),
            type_=sa.String(128),
            existing_nullable=False,
        )
