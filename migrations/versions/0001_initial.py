"""Memory tables of seed 5.1, the event ledger, projects, per-user state, settings and history.

Revision ID: 0001
Revises:
Create Date: 2026-12-02
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
Timestamp = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql")
OPTS = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}


def upgrade() -> None:
    op.create_table(
        "memory_item",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("user_id", sa.BigInteger, nullable=False),
        sa.Column("scope", sa.String(16), nullable=False),
        sa.Column("project_key", sa.String(128), nullable=False, server_default=""),
        sa.Column("content", sa.Text, nullable=False),
        sa.Column("source", sa.String(16), nullable=False, server_default="MANUAL"),
        sa.Column("status", sa.String(16), nullable=False, server_default="ACTIVE"),
        sa.Column("dedup_hash", sa.CHAR(40), nullable=False),
        sa.Column("origin_session_id", sa.BigInteger, nullable=True),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("updated_at", Timestamp, nullable=False),
        sa.UniqueConstraint("user_id", "dedup_hash", name="uk_memory_dedup"),
        **OPTS,
    )
    op.create_index("idx_memory_user", "memory_item", ["user_id", "scope", "status", "updated_at"])
    op.create_index("idx_memory_project", "memory_item", ["user_id", "project_key", "status", "updated_at"])
    op.create_index("idx_memory_recent", "memory_item", ["user_id", "updated_at"])

    op.create_table(
        "user_memory_preference",
        sa.Column("user_id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("auto_capture_enabled", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("updated_at", Timestamp, nullable=False),
        **OPTS,
    )
    op.create_table(
        "memory_event_ledger",
        sa.Column("event_id", sa.String(128), primary_key=True),
        sa.Column("user_id", sa.BigInteger, nullable=False),
        sa.Column("session_id", sa.BigInteger, nullable=False),
        sa.Column("outcome", sa.String(32), nullable=False),
        sa.Column("processed_at", Timestamp, nullable=False),
        **OPTS,
    )
    op.create_table(
        "memory_user_project",
        sa.Column("user_id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("project_key", sa.String(128), primary_key=True),
        sa.Column("first_seen_at", Timestamp, nullable=False),
        **OPTS,
    )
    op.create_table(
        "memory_user_state",
        sa.Column("user_id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("last_consolidated_at", Timestamp, nullable=True),
        **OPTS,
    )
    settings = op.create_table(
        "memory_system_setting",
        sa.Column("setting_key", sa.String(128), primary_key=True),
        sa.Column("value", sa.String(512), nullable=False, server_default=""),
        sa.Column("updated_at", Timestamp, nullable=False),
        **OPTS,
    )
    # Seed V130 / D10: empty means "use MEMORY_DEFAULT_MODEL".
    op.bulk_insert(
        settings,
        [
            {
                "setting_key": "memory.extractionModelId",
                "value": "",
                "updated_at": datetime.now(UTC).replace(tzinfo=None),
            }
        ],
    )
    op.create_table(
        "memory_history",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("memory_id", sa.BigInteger, nullable=False),
        sa.Column("user_id", sa.BigInteger, nullable=False),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("actor", sa.String(16), nullable=False),
        sa.Column("old_content", sa.Text, nullable=True),
        sa.Column("new_content", sa.Text, nullable=True),
        sa.Column("event_id", sa.String(128), nullable=True),
        sa.Column("session_id", sa.BigInteger, nullable=True),
        sa.Column("model", sa.String(128), nullable=True),
        sa.Column("created_at", Timestamp, nullable=False),
        **OPTS,
    )
    op.create_index("idx_history_item", "memory_history", ["user_id", "memory_id", "id"])


def downgrade() -> None:
    for table in (
        "memory_history",
        "memory_system_setting",
        "memory_user_state",
        "memory_user_project",
        "memory_event_ledger",
        "user_memory_preference",
        "memory_item",
    ):
        op.drop_table(table)
