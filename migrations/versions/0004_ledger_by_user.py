"""A user's extractions of the last 24 hours, counted on every extraction.

- `idx_ledger_user_processed_at`: the per-user extraction budget
  (`MEMORY_EXTRACTIONS_PER_USER_PER_DAY`) counts the user's ledger rows since a time in the read
  round of every event, and the admin audit shows the same count.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-04
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("idx_ledger_user_processed_at", "memory_event_ledger", ["user_id", "processed_at"])


def downgrade() -> None:
    op.drop_index("idx_ledger_user_processed_at", "memory_event_ledger")
