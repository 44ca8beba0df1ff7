"""Table definitions (SQLAlchemy Core), shared by the queries and the migrations' intent.

Seed 5.1's `memory_item` and `user_memory_preference`, plus the service's own bookkeeping.
Timestamps are UTC, set by the service (not by the database) so both dialects behave the same, and
kept to the microsecond so the list order `updated_at DESC, id DESC` is stable.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql

from service.core.model import MAX_MODEL_NAME_CHARS

metadata = sa.MetaData()


class _Utf8VarBinary(mysql.VARBINARY):
    """VARBINARY holding UTF-8 text: bound as text (the server compares a character string with a
    binary column byte for byte; aiomysql cannot escape `bytes` under PyMySQL 1.2), read back as str."""

    cache_ok = True

    def bind_processor(self, dialect: sa.Dialect) -> None:
        return None

    def result_processor(self, dialect: sa.Dialect, coltype: object) -> Any:
        return lambda value: value.decode() if isinstance(value, bytes) else value


def exact_string(length: int) -> sa.types.TypeEngine[str]:
    """Text compared byte for byte on both dialects: MySQL's `utf8mb4_bin` pads with spaces, so "e1"
    and "e1 " would be one key there and two in SQLite; VARBINARY (room for `length` characters of
    UTF-8) has no padding, and SQLite's default BINARY collation none either."""
    return sa.String(length).with_variant(_Utf8VarBinary(length * 4), "mysql")


BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
Timestamp = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql")
MYSQL_OPTS: dict[str, Any] = {
    "mysql_engine": "InnoDB",
    "mysql_charset": "utf8mb4",
    "mysql_collate": "utf8mb4_bin",
}

memory_item = sa.Table(
    "memory_item",
    metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column("user_id", sa.BigInteger, nullable=False),
    sa.Column("scope", sa.String(16), nullable=False),
    sa.Column("project_key", sa.String(128), nullable=False, server_default=""),
    sa.Column("content", sa.Text, nullable=False),
    sa.Column("source", sa.String(16), nullable=False, server_default="MANUAL"),
    sa.Column("status", sa.String(16), nullable=False, server_default="ACTIVE"),
    # USER or CAPACITY while DISMISSED, NULL while ACTIVE.
    sa.Column("dismissed_by", sa.String(16), nullable=True),
    sa.Column("dedup_hash", sa.CHAR(40), nullable=False),
    sa.Column("origin_session_id", sa.BigInteger, nullable=True),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("updated_at", Timestamp, nullable=False),
    sa.UniqueConstraint("user_id", "dedup_hash", name="uk_memory_dedup"),
    sa.Index("idx_memory_user", "user_id", "scope", "status", "updated_at"),
    sa.Index("idx_memory_project", "user_id", "project_key", "status", "updated_at"),
    sa.Index("idx_memory_recent", "user_id", "updated_at"),
    # Ids are never reused: a deleted memory's history must never show up under a new one.
    sqlite_autoincrement=True,
    **MYSQL_OPTS,
)

user_memory_preference = sa.Table(
    "user_memory_preference",
    metadata,
    sa.Column("user_id", sa.BigInteger, primary_key=True, autoincrement=False),
    # D9 as adjusted on 2026-10-02: capture is off until the user turns it on.
    sa.Column("auto_capture_enabled", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("updated_at", Timestamp, nullable=False),
    **MYSQL_OPTS,
)

memory_event_ledger = sa.Table(
    "memory_event_ledger",
    metadata,
    sa.Column("event_id", exact_string(128), primary_key=True),
    sa.Column("user_id", sa.BigInteger, nullable=False),
    sa.Column("session_id", sa.BigInteger, nullable=False),
    sa.Column("outcome", sa.String(32), nullable=False),
    sa.Column("processed_at", Timestamp, nullable=False),
    # Retention deletes the oldest rows in batches.
    sa.Index("idx_ledger_processed_at", "processed_at"),
    # A user's extractions of the last 24 hours: the daily budget and the admin audit count them.
    sa.Index("idx_ledger_user_processed_at", "user_id", "processed_at"),
    **MYSQL_OPTS,
)

memory_user_project = sa.Table(
    "memory_user_project",
    metadata,
    sa.Column("user_id", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("project_key", sa.String(128), primary_key=True),
    sa.Column("first_seen_at", Timestamp, nullable=False),
    **MYSQL_OPTS,
)

memory_user_state = sa.Table(
    "memory_user_state",
    metadata,
    # The per-user lock row (SELECT … FOR UPDATE) and when consolidation may run next (D15): the
    # cooldown after a call, or the shorter back-off after a failed one.
    sa.Column("user_id", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("consolidation_due_at", Timestamp, nullable=True),
    # A random number drawn when the row is made and again when the user deletes a memory: a prompt
    # layout held since another mark (or none: the user erased) may list words no longer stored
    # (core/prompt_layout.py). NULL only on a row a release before the column made.
    sa.Column("removal_mark", sa.BigInteger, nullable=True),
    **MYSQL_OPTS,
)

memory_system_setting = sa.Table(
    "memory_system_setting",
    metadata,
    sa.Column("setting_key", sa.String(128), primary_key=True),
    sa.Column("value", sa.String(512), nullable=False, server_default=""),
    sa.Column("updated_at", Timestamp, nullable=False),
    **MYSQL_OPTS,
)

memory_history = sa.Table(
    "memory_history",
    metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column("memory_id", sa.BigInteger, nullable=False),
    sa.Column("user_id", sa.BigInteger, nullable=False),
    sa.Column("action", sa.String(16), nullable=False),
    sa.Column("actor", sa.String(16), nullable=False),
    sa.Column("old_content", sa.Text, nullable=True),
    sa.Column("new_content", sa.Text, nullable=True),
    sa.Column("event_id", sa.String(128), nullable=True),
    sa.Column("session_id", sa.BigInteger, nullable=True),
    sa.Column("model", sa.String(MAX_MODEL_NAME_CHARS), nullable=True),
    sa.Column("created_at", Timestamp, nullable=False),
    # Retention folds a run of consecutive touches into its first row: how many, and the last one's time.
    sa.Column("repeat_count", sa.Integer, nullable=False, server_default="1"),
    sa.Column("last_at", Timestamp, nullable=True),
    # When the user's delete erased this row's texts (both NULL since); NULL while they stand.
    sa.Column("content_erased_at", Timestamp, nullable=True),
    sa.Index("idx_history_item", "user_id", "memory_id", "id"),
    # The inserts of the last days: where the model-quality figures start (`quality_repository`).
    sa.Index("idx_history_action_time", "action", "created_at"),
    sqlite_autoincrement=True,
    **MYSQL_OPTS,
)

EXTRACTION_MODEL_SETTING = "memory.extractionModelId"
# Events dead-lettered as `model_rejected` since the model was last set (`core.model_rejections`).
MODEL_REJECTIONS_SETTING = "memory.extractionModelId.rejections"
# The text rule the stored hashes follow (`normalize.TEXT_RULE_VERSION`), written by the migrations.
TEXT_RULE_SETTING = "memory.textRuleVersion"
