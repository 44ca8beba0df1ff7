"""A deleted memory's words leave the service: a history row whose texts were erased says when.

- `memory_history.content_erased_at`: set, with `old_content` and `new_content` made NULL, on every
  history row of a memory the user deletes and of the rows it was merged from. A row that never had
  a text keeps NULL here, so the history can tell "no text" from "text deleted by the user".

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("memory_history") as batch:
        batch.add_column(
            sa.Column(
                "content_erased_at", sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql"), nullable=True
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("memory_history") as batch:
        batch.drop_column("content_erased_at")
