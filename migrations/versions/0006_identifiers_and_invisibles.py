"""The text rule, sharpened again: identifiers, invisible characters, controls str.isspace counts.

Since revision 0005:

- a project key and an event id are identifiers: no control (tab and line breaks included), format,
  line or paragraph separator, or invisible character;
- U+001C–U+001F and U+0085 are controls, no longer whitespace;
- the characters that render as nothing (Default_Ignorable_Code_Point, and U+2800) are invisible: a
  text of them alone is blank, and a text with them is the same memory as without them.

Rows written under revision 0005 may break the new rule, and hashes made before may tell apart two
texts that now are one. This revision runs migration 0005 again, with the rule as it stands: keys,
event ids and contents cleaned, every hash recomputed and new twins folded by migration 0002's
precedence.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-05
"""

from __future__ import annotations

from service.adapters.db.engine import migration

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    migration("0005_stored_text.py").upgrade()


def downgrade() -> None:
    """The removed characters are not put back, and folded twins stay folded."""
