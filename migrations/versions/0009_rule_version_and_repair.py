"""The text rule's version in the database; the released 0002's folds repaired; old pods' rows folded.

- `memory_system_setting` row `memory.textRuleVersion` = "3" (0002's rule was 1, 0005's 2, 0006's
  3), written first: a writer checks it in every transaction that holds a user's lock and writes
  nothing under another version (`Database`, docs/operations.md "Rolling updates"). A later
  revision that changes the rule updates this row before it re-cleans and re-hashes, in the same
  transaction, so that a pod of the previous release waits for it and then stops writing.
- The first released migration 0002 kept the oldest of a group of twins, deleted the others
  without moving their history, recorded each deletion as a `merge` (actor `migration`, old content
  the deleted twin's text, new content the kept one's) under the deleted twin's own id, and
  derived `dismissed_by` from the last history entry of any kind. Its damage is repaired where the
  history shows it:
  - a row dismissed for `USER` whose last status change (a dismiss, demote or restore) was a
    demotion becomes `CAPACITY` (an edit after the demotion never was a rejection), unless a fold
    moved twins' trails under it (a `merge` by `migration`): their entries interleave;
  - a fact with such an orphan `merge` (the last entry of an id no row holds) is folded again by
    0002's precedence (`merge_twins`): each deleted twin as its own trail (since its creation) had
    it, the kept row as its trail before the migration had it. Its state is set by the precedence,
    a user's MANUAL twin that gave way to a machine-made one gives the kept row its text and makes
    it MANUAL (an `edit` by `migration`), and the deleted twins' trails move under the kept row.
    The kept row is the user's one live row whose identity is the `merge`'s new content. Left as
    they are: a `merge` whose old content is another fact once cleaned (a NUL the released rule
    read as a space: no twin's, whose state is not the kept row's to take), and a fact with none or
    several kept rows, or whose kept row the user acted on since the migration, or that a later fold
    merged again: the user's later word stands, and a trail that mixes twins no longer tells their
    states apart.
- Migration 0005's cleaning, re-hash and fold run once more: rows that pods of the previous release
  wrote under an older rule while 0005 or 0006 ran become one with their twins.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from types import ModuleType
from typing import Any

import sqlalchemy as sa
from alembic import op

from service.adapters.db.engine import migration
from service.core.normalize import identity, strip_hostile

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

RULE = "3"  # the rule of this revision's time, never the code's later one
SOURCES = {
    ("create", "user"): "MANUAL",
    ("insert", "auto"): "AUTO",
    ("merge", "consolidator"): "CONSOLIDATED",
}
STATES = {"dismiss": ("DISMISSED", "USER"), "demote": ("DISMISSED", "CAPACITY"), "restore": ("ACTIVE", None)}

setting = sa.table(
    "memory_system_setting",
    sa.column("setting_key", sa.String),
    sa.column("value", sa.String),
    sa.column("updated_at", sa.DateTime),
)


def upgrade() -> None:
    conn = op.get_bind()
    now = datetime.now(UTC).replace(tzinfo=None)
    conn.execute(setting.delete().where(setting.c.setting_key == "memory.textRuleVersion"))
    conn.execute(setting.insert().values(setting_key="memory.textRuleVersion", value=RULE, updated_at=now))
    lifecycle = migration("0002_lifecycle.py")
    _repair_dismissed_by(conn, lifecycle)
    for kept, merges in _orphans_by_fact(conn, lifecycle).items():
        _refold(conn, lifecycle, kept, merges, now)
    migration("0005_stored_text.py").upgrade()


def _repair_dismissed_by(conn: sa.Connection, lifecycle: ModuleType) -> None:
    item, history = lifecycle.item, lifecycle.history
    last_status_change = (
        sa.select(history.c.action)
        .where(
            history.c.user_id == item.c.user_id,
            history.c.memory_id == item.c.id,
            history.c.action.in_(tuple(STATES)),
        )
        .order_by(history.c.id.desc())
        .limit(1)
        .scalar_subquery()
    )
    folded = sa.exists().where(
        history.c.memory_id == item.c.id, history.c.action == "merge", history.c.actor == "migration"
    )
    conn.execute(
        item.update()
        .where(item.c.dismissed_by == "USER", last_status_change == "demote", ~folded)
        .values(dismissed_by="CAPACITY")
    )


def _orphans_by_fact(conn: sa.Connection, lifecycle: ModuleType) -> dict[int, list[Any]]:
    """The released 0002's `merge` rows, by the id of the one live row that holds their fact."""
    item, history = lifecycle.item, lifecycle.history
    later = history.alias("later")
    orphans = conn.execute(
        sa.select(history)
        .where(
            history.c.action == "merge",
            history.c.actor == "migration",
            ~sa.exists().where(item.c.id == history.c.memory_id),
            ~sa.exists().where(later.c.memory_id == history.c.memory_id, later.c.id > history.c.id),
        )
        .order_by(history.c.id)
    ).all()
    facts: dict[int, list[Any]] = {}
    pools: dict[int, list[Any]] = {}
    for orphan in orphans:
        if orphan.user_id not in pools:
            pools[orphan.user_id] = conn.execute(
                sa.select(item).where(item.c.user_id == orphan.user_id)
            ).all()
        wanted = _identity(orphan.new_content or "")
        if _identity(orphan.old_content or "") != wanted:
            continue  # twins to the released fold's rule only ("pnpm\x009", "pnpm 9"): two facts
        holders = [row.id for row in pools[orphan.user_id] if _identity(row.content) == wanted]
        if len(holders) == 1:
            facts.setdefault(holders[0], []).append(orphan)
    return facts


def _identity(text: str) -> str:
    return identity(strip_hostile(text))


def _refold(
    conn: sa.Connection, lifecycle: ModuleType, kept_id: int, merges: list[Any], now: datetime
) -> None:
    item, history = lifecycle.item, lifecycle.history
    kept = conn.execute(sa.select(item).where(item.c.id == kept_id)).mappings().one()
    when = min(m.created_at for m in merges)
    trail = _trail(conn, lifecycle, kept_id)
    since = [e for e in trail if e.created_at >= when]
    if any(e.actor == "user" or (e.action == "merge" and e.actor == "migration") for e in since):
        return
    before = _replay(lifecycle, kept_id, _own([e for e in trail if e.created_at < when]), kept["created_at"])
    # Each deleted twin's trail without the orphan `merge` that ends it.
    folded = {
        m.memory_id: _replay(lifecycle, m.memory_id, _own(_trail(conn, lifecycle, m.memory_id)[:-1]))
        for m in merges
    }
    if before is None or None in folded.values():
        return
    merge = lifecycle.merge_twins([before, *folded.values()])
    survivor = folded.get(merge.survivor, before)
    row = dict(kept)
    if survivor.source == "MANUAL" and kept["source"] != "MANUAL":
        text = next(m.old_content for m in merges if m.memory_id == survivor.id)
        conn.execute(item.update().where(item.c.id == kept_id).values(source="MANUAL", content=text))
        lifecycle._record(conn, row, "edit", kept["content"], text, now)
        row["content"] = text
    status, dismissed_by = merge.state
    if (kept["status"], kept["dismissed_by"]) != merge.state:
        conn.execute(
            item.update()
            .where(item.c.id == kept_id)
            .values(status=status, dismissed_by=dismissed_by, updated_at=merge.rejected_at or now)
        )
        lifecycle._record(
            conn, row, "restore" if status == "ACTIVE" else "dismiss", row["content"], None, now
        )
    conn.execute(
        history.update()
        .where(history.c.user_id == kept["user_id"], history.c.memory_id.in_(folded))
        .values(memory_id=kept_id)
    )


def _trail(conn: sa.Connection, lifecycle: ModuleType, memory_id: int) -> list[Any]:
    history = lifecycle.history
    return list(
        conn.execute(sa.select(history).where(history.c.memory_id == memory_id).order_by(history.c.id))
    )


def _own(trail: Sequence[Any]) -> list[Any]:
    """The trail of the row that last held the id: revision 0001's SQLite gave a deleted row's id to
    a new one, whose trail starts after that delete (or a consolidation's drop)."""
    ends = [i for i, e in enumerate(trail) if e.action in ("delete", "drop")]
    return list(trail[ends[-1] + 1 :] if ends else trail)


def _replay(lifecycle: ModuleType, row_id: int, trail: Sequence[Any], created: datetime | None = None) -> Any:
    """The twin a trail describes, as 0002's precedence reads it; None for a trail with no creation."""
    made = [SOURCES[(e.action, e.actor)] for e in trail[:1] if (e.action, e.actor) in SOURCES]
    if not made:
        return None
    source, state, spoken = made[0], ("ACTIVE", None), None
    for entry in trail:
        state = STATES.get(entry.action, state)
        source = "MANUAL" if (entry.action, entry.actor) == ("edit", "user") else source
        if entry.actor == "user" and entry.action in ("create", "edit", "restore"):
            spoken = entry.created_at
    row = {
        "id": row_id, "source": source, "status": state[0], "dismissed_by": state[1],
        "created_at": created or trail[0].created_at, "updated_at": trail[-1].created_at,
    }  # fmt: skip
    return lifecycle.Twin.of(row, spoken)


def downgrade() -> None:
    """The repaired states and the folded rows stay; the rule's version goes."""
    op.get_bind().execute(setting.delete().where(setting.c.setting_key == "memory.textRuleVersion"))
