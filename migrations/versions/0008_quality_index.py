"""Each extraction model's memories of the last 90 days, found without reading the whole history.

- `idx_history_action_time`: the model-quality figures (`core.model_quality`) start from the
  history's `insert` rows created since a time, refreshed every few minutes; without it each
  refresh scans every history row.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-08
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("idx_history_action_time", "memory_history", ["action", "created_at"])


def downgrade() -> None:
    op.drop_index("idx_history_action_time", "memory_history")
