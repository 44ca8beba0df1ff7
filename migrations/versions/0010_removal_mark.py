"""A user's delete reaches the prompt layouts every process holds.

- `memory_user_state.removal_mark`: a random number drawn when the lock row is made and again on
  each delete of a memory. The read round reads it with the comparison set, and a process uses a
  prompt layout it holds for the user (core/prompt_layout.py) only under the mark it was built
  under: the frozen blocks of a held layout still list rows since gone, so after a delete (on any
  replica) or an erasure (which removes the row), the next prompt is laid out afresh and no longer
  carries the deleted words. Rows made before get 0, which a new row's mark never is.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("memory_user_state") as batch:
        batch.add_column(sa.Column("removal_mark", sa.BigInteger, nullable=True))
    op.execute("UPDATE memory_user_state SET removal_mark = 0")


def downgrade() -> None:
    with op.batch_alter_table("memory_user_state") as batch:
        batch.drop_column("removal_mark")
