"""Lifecycle: why a row is dismissed, ids never reused, one identity rule, consolidation due time.

- `memory_item.dismissed_by`: a DISMISSED row whose last status change (a dismiss, demote or restore;
  an edit or a touch changes none) was a D14 demotion is CAPACITY, every other DISMISSED row USER. A
  row demoted for room that the user then edited without restoring it (revision 0001 made it MANUAL
  and kept it DISMISSED) was never rejected.
- SQLite: `memory_item` and `memory_history` get AUTOINCREMENT; both dialects' counters start past
  every id any history row names, so a deleted memory's trail never shows up under a new one.
  Revision 0001's SQLite did reuse ids: a live row's id whose history starts before the row's
  creation holds a deleted row's trail first. That trail moves to an id of its own (past every
  other), a gone memory's, before anything below reads the history: it is no word on the new row,
  and no fold carries it along.
- Every `dedup_hash` is recomputed with the identity rule (NFKC, invisible characters removed,
  whitespace folded) over the text as the upgrade leaves it: migration 0005's cleaning first (a NUL
  or a key's direction mark removed, a key with nothing visible made the USER scope's), so that each
  fact folds once, here, and 0005 finds no new twins (`_digest_at_head`). Rows of one user that now
  share a hash ("twins") become one row: the survivor.
  Each other twin is deleted, its history rows move under the survivor, and the survivor gets a
  `merge` history row (actor `migration`, old content = the twin's text). A change of the survivor's
  state is recorded as `dismiss` or `restore` (actor `migration`). The precedence never loses a
  user's word:

  | the fact's state: the first line that holds                          | state                |
  |----------------------------------------------------------------------|----------------------|
  | a twin was dismissed by the user and no ACTIVE twin was written or   | DISMISSED (USER)     |
  | restored by the user after that dismissal: a rejection stands unless |                      |
  | the user's own newer word says otherwise                             |                      |
  | a twin is ACTIVE: no active fact disappears                          | ACTIVE               |
  | every twin was dismissed for capacity                                | DISMISSED (CAPACITY) |

  | the survivor: each line narrows the one before                                              |
  |---------------------------------------------------------------------------------------------|
  | the MANUAL twins if there are any (a user's row never gives way to a machine-made one and   |
  | stays MANUAL), else every twin                                                              |
  | of those, the ones already in the state above                                               |
  | of those, the oldest (created_at, then id)                                                  |

  A twin was dismissed at its `updated_at` (the machine never changes a dismissed row), and a
  survivor left DISMISSED (USER) gets the latest such time, never the migration's clock: a later
  fold (migrations 0005, 0006) weighs the rejection by when the user made it. The user's word on an
  ACTIVE twin is their latest create, edit or restore entry in its history, and for a MANUAL
  twin its creation too; never its `updated_at`, which revision 0001 also moved when the machine
  touched a row on an exact hit, nor an entry in the trail of a deleted row whose id revision
  0001's SQLite gave to a new one (moved away above). A machine-made twin the user never restored
  carries no word of theirs. Folded in two steps, a survivor this fold restored (a MANUAL row
  dismissed for room, whose twin was ACTIVE) would bring its own words to 0005's fold, where the
  precedence reads only ACTIVE twins'; and two texts the identity rule reads alike but that clean
  apart ("pnpm\\x009", "pnpm 9") would lose one fact's row. `dismissed_by` is derived before the
  merge (above), so all of this holds on a revision-0001 database. Two MANUAL twins cannot both
  stay, `(user_id, dedup_hash)` being unique: one survives by the lines above and the other is
  deleted. Nothing the user said is lost: the two texts differ only by compatibility forms,
  invisible characters and what 0005 removes, the survivor carries the user's latest decision about
  the fact, and the deleted row's exact text (the `merge` row's old content) and whole history are
  in the survivor's history.
- `memory_user_state.consolidation_due_at` replaces `last_consolidated_at` (last run + 24 h).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, NamedTuple

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from service.adapters.db.engine import migration
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
    sa.column("source", sa.String),
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
    recreate: Literal["always", "auto"] = "always" if sqlite else "auto"
    with op.batch_alter_table(
        "memory_item", recreate=recreate, table_kwargs={"sqlite_autoincrement": True}
    ) as batch:
        batch.add_column(sa.Column("dismissed_by", sa.String(16), nullable=True))
    with op.batch_alter_table(
        "memory_history", recreate=recreate, table_kwargs={"sqlite_autoincrement": True}
    ) as batch:
        pass
    _rehome_earlier_trails(conn)
    _backfill_dismissed_by(conn)
    _advance_id_counter(conn, sqlite)
    _rehash(conn)
    _consolidation_due_at()


def _rehome_earlier_trails(conn: sa.Connection) -> None:
    earlier = sa.exists().where(
        history.c.user_id == item.c.user_id,
        history.c.memory_id == item.c.id,
        history.c.created_at < item.c.created_at,
    )
    reused = conn.execute(sa.select(item.c.id, item.c.user_id).where(earlier)).all()
    top = max(
        int(conn.scalar(sa.select(sa.func.coalesce(sa.func.max(item.c.id), 0))) or 0),
        int(conn.scalar(sa.select(sa.func.coalesce(sa.func.max(history.c.memory_id), 0))) or 0),
    )
    for gone, (row_id, user_id) in enumerate(reused, start=top + 1):
        # Compared in SQL, column to column: SQLite holds times as text, in the format they came in.
        created = sa.select(item.c.created_at).where(item.c.id == row_id).scalar_subquery()
        conn.execute(
            history.update()
            .where(
                history.c.user_id == user_id, history.c.memory_id == row_id, history.c.created_at < created
            )
            .values(memory_id=gone)
        )


def _backfill_dismissed_by(conn: sa.Connection) -> None:
    last_status_change = (
        sa.select(history.c.action)
        .where(
            history.c.user_id == item.c.user_id,
            history.c.memory_id == item.c.id,
            history.c.action.in_(("dismiss", "demote", "restore")),
        )
        .order_by(history.c.id.desc())
        .limit(1)
        .scalar_subquery()
    )
    conn.execute(
        item.update()
        .where(item.c.status == "DISMISSED")
        .values(dismissed_by=sa.case((last_status_change == "demote", "CAPACITY"), else_="USER"))
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
    digest_of = _digest_at_head()
    twins: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for row in rows:
        twins.setdefault((row["user_id"], digest_of(row)), []).append(dict(row))
    now = datetime.now(UTC).replace(tzinfo=None)
    changed: list[tuple[int, str]] = []
    for (user_id, digest), group in twins.items():
        kept = group[0] if len(group) == 1 else _fold(conn, user_id, group, now)
        if kept["dedup_hash"] != digest:
            changed.append((kept["id"], digest))
    # Two passes: a row's new hash may still be another row's old one until that row is updated.
    for row_id, _ in changed:
        conn.execute(item.update().where(item.c.id == row_id).values(dedup_hash=f"rehash-{row_id}"[:40]))
    for row_id, digest in changed:
        conn.execute(item.update().where(item.c.id == row_id).values(dedup_hash=digest))


def _digest_at_head() -> Callable[[Mapping[str, Any]], str]:
    """A row's hash by the identity of its text as the upgrade leaves it: migration 0005's cleaning
    (a NUL or a direction mark removed, a key with nothing visible made USER) and then the identity
    rule. A row 0005 deletes as blank keeps the identity of its text as it is."""
    cleaned_hash = migration("0005_stored_text.py").cleaned_hash

    def digest(row: Mapping[str, Any]) -> str:
        kept: str | None = cleaned_hash(row)
        return kept or dedup_hash(Scope(row["scope"]), row["project_key"], row["content"])

    return digest


State = tuple[str, str | None]  # (status, dismissed_by)


class Twin(NamedTuple):
    """A row of a group that now shares one hash, as the merge precedence sees it."""

    id: int
    source: str
    status: str
    dismissed_by: str | None
    created_at: datetime
    updated_at: datetime
    spoken_at: datetime | None  # the user's latest create, edit or restore entry on the row

    @classmethod
    def of(cls, row: dict[str, Any], spoken_at: datetime | None) -> Twin:
        return cls(
            row["id"], row["source"], row["status"], row["dismissed_by"],
            row["created_at"], row["updated_at"], spoken_at,
        )  # fmt: skip

    @property
    def state(self) -> State:
        return self.status, self.dismissed_by


class Merge(NamedTuple):
    survivor: int
    state: State
    folded: tuple[int, ...]
    rejected_at: datetime | None  # when the user made the rejection a DISMISSED (USER) state keeps


ACTIVE: State = ("ACTIVE", None)
USER_DISMISSED: State = ("DISMISSED", "USER")
CAPACITY_DISMISSED: State = ("DISMISSED", "CAPACITY")


def merge_twins(twins: Sequence[Twin]) -> Merge:
    """The precedence of the module's tables: which twin survives, and in which state."""
    rejected = [t.updated_at for t in twins if t.state == USER_DISMISSED]
    said = [at for t in twins if (at := _said_active(t)) is not None]
    if rejected and not (said and max(said) > max(rejected)):
        state = USER_DISMISSED
    elif any(t.status == "ACTIVE" for t in twins):
        state = ACTIVE
    else:
        state = CAPACITY_DISMISSED
    pool = [t for t in twins if t.source == "MANUAL"] or list(twins)
    survivor = min(pool, key=lambda t: (t.state != state, t.created_at, t.id))
    folded = tuple(t.id for t in twins if t.id != survivor.id)
    return Merge(survivor.id, state, folded, max(rejected) if state == USER_DISMISSED else None)


def _said_active(twin: Twin) -> datetime | None:
    """When the user last said an ACTIVE twin holds: by writing it (MANUAL) or restoring it."""
    if twin.state != ACTIVE:
        return None
    if twin.source == "MANUAL":
        return max(twin.created_at, twin.spoken_at or twin.created_at)
    return twin.spoken_at


def _fold(conn: sa.Connection, user_id: int, group: list[dict[str, Any]], now: datetime) -> dict[str, Any]:
    """Applies `merge_twins` to one group; returns the survivor as it was read."""
    by_id = {row["id"]: row for row in group}
    spoken = _spoken(conn, user_id, by_id)
    merge = merge_twins([Twin.of(row, spoken.get(row["id"])) for row in group])
    survivor = by_id[merge.survivor]
    for twin_id in merge.folded:
        conn.execute(
            history.update()
            .where(history.c.user_id == user_id, history.c.memory_id == twin_id)
            .values(memory_id=survivor["id"])
        )
        conn.execute(item.delete().where(item.c.id == twin_id))
        _record(conn, survivor, "merge", by_id[twin_id]["content"], survivor["content"], now)
    status, dismissed_by = merge.state
    moved = (survivor["status"], survivor["dismissed_by"]) != merge.state
    at = merge.rejected_at or now
    if moved or (merge.rejected_at is not None and survivor["updated_at"] != at):
        conn.execute(
            item.update()
            .where(item.c.id == survivor["id"])
            .values(status=status, dismissed_by=dismissed_by, updated_at=at)
        )
    if moved:
        action = "restore" if status == "ACTIVE" else "dismiss"
        _record(conn, survivor, action, survivor["content"], None, now)
    return survivor


def _spoken(conn: sa.Connection, user_id: int, by_id: dict[int, dict[str, Any]]) -> dict[int, datetime]:
    """Each twin's latest create, edit or restore by the user (a reused id's earlier trail has
    moved away: `_rehome_earlier_trails`)."""
    return dict(
        conn.execute(
            sa.select(history.c.memory_id, sa.func.max(history.c.created_at))
            .where(
                history.c.user_id == user_id,
                history.c.memory_id.in_(by_id),
                history.c.actor == "user",
                history.c.action.in_(("create", "edit", "restore")),
            )
            .group_by(history.c.memory_id)
        ).all()
    )


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
