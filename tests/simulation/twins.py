"""Lookalike twins from before the identity rule, and what migration 0002 must make of them.

Revision 0001 hashed trimmed, whitespace-folded text, so rows differing only by full-width
punctuation, invisible characters or NFKC forms could live side by side. `seed_twins` writes such
sets into a revision-0001 database (every pair of row kinds, in both orders, and a few triples),
each row with the history revision 0001 would have written. `check_twins` is pure: the sets as
seeded, the rows after the upgrade and the migration's history rows, against the precedence:

1. a MANUAL twin is never deleted for a machine-made one (the survivor is MANUAL);
2. a user's dismissal is never lost, unless the user wrote the fact as MANUAL ACTIVE after it;
3. no ACTIVE fact disappears;
4. otherwise (every twin alike) the oldest survives.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from service.adapters.db.engine import sync_url, upgrade_schema
from service.core.model import Scope
from service.core.normalize import dedup_hash, normalize
from tests.simulation.model import wording

# (source, status, dismissed_by); a MANUAL row is never demoted for room (D14).
KINDS = [
    (source, status, why)
    for source in ("AUTO", "CONSOLIDATED", "MANUAL")
    for status, why in (("ACTIVE", None), ("DISMISSED", "USER"), ("DISMISSED", "CAPACITY"))
    if not (source == "MANUAL" and why == "CAPACITY")
]
FULL_WIDTH_DIGITS = str.maketrans("0123456789", "０１２３４５６７８９")
# Each family: three texts of one identity whose revision-0001 hashes differ.
VARIANTS = {
    "full-width": lambda t: [t, t.replace(":", "：").replace(",", "，"), t.translate(FULL_WIDTH_DIGITS)],
    "zero-width": lambda t: [t, "\ufeff" + t, t.replace("的", "\u200b的", 1)],
    "whitespace": lambda t: [
        t.replace(":", ": "),
        t.replace(":", ": \u2060 \u3000"),
        " " + t.replace(":", ":\u200b ") + "\u200b",
    ],
    "nfkc": lambda t: [
        t,
        t.replace("中文", "中\u2f42"),
        t.replace("中文", "中\u2f42").replace(":", "\ufe55"),
    ],
}
FIRST_FACT = 300  # facts the simulated user mentions now and then, so twins meet the model too
SEEDED_BEFORE = datetime(2026, 12, 1)


@dataclass(frozen=True)
class TwinRow:
    id: int
    user_id: int
    scope: str
    project_key: str
    content: str
    source: str
    status: str
    dismissed_by: str | None
    created_at: datetime
    updated_at: datetime
    dedup_hash: str = ""

    @property
    def state(self) -> tuple[str, str | None]:
        return self.status, self.dismissed_by


@dataclass
class TwinMigration:
    """What the upgrade was given and what it made of it."""

    sets: list[list[TwinRow]]
    problems: list[str] = field(default_factory=list)

    @property
    def ids(self) -> set[int]:
        return {r.id for rows in self.sets for r in rows}

    @property
    def folded(self) -> int:
        return sum(len(rows) - 1 for rows in self.sets)


def twin_sets(user_id: int) -> Iterator[list[TwinRow]]:
    """Every ordered pair of row kinds and eight triples, each set in one group, one variant family."""
    combos = [*itertools.product(KINDS, repeat=2)]
    combos += [(KINDS[i], KINDS[(i + 3) % 8], KINDS[(i + 5) % 8]) for i in range(8)]
    families = list(VARIANTS.values())
    for n, kinds in enumerate(combos):
        scope, key = ("USER", "") if n // len(families) % 2 == 0 else ("PROJECT", "alpha")
        texts = families[n % len(families)](wording(user_id, FIRST_FACT + n, n))
        start = SEEDED_BEFORE - timedelta(days=30) + timedelta(hours=3 * n)
        yield [
            _row(user_id, scope, key, text, kind, start + timedelta(hours=k))
            for k, (text, kind) in enumerate(zip(texts, kinds, strict=False))
        ]


def _row(
    user_id: int, scope: str, key: str, text: str, kind: tuple[str, str, str | None], created: datetime
) -> TwinRow:
    source, status, why = kind
    updated = created + timedelta(minutes=30) if status == "DISMISSED" else created
    return TwinRow(0, user_id, scope, key, text, source, status, why, created, updated)


def seed_twins(url: str, users: list[int]) -> TwinMigration:
    """Twins for each user in a revision-0001 database at `url`, with the history 0001 wrote."""
    engine = sa.create_engine(sync_url(url))
    seeded: list[list[TwinRow]] = []
    try:
        with engine.begin() as conn:
            for user_id in users:
                for rows in twin_sets(user_id):
                    seeded.append([_insert(conn, row) for row in rows])
    finally:
        engine.dispose()
    return TwinMigration(seeded)


def _old_hash(row: TwinRow) -> str:
    """Revision 0001's rule: trim and fold whitespace, nothing else."""
    payload = f"{row.scope}|{row.project_key}|{normalize(row.content)}"
    return hashlib.sha1(payload.encode("utf-8")).hexdigest()


def _table_0001(name: str, columns: str) -> sa.TableClause:
    return sa.table(name, *(sa.column(c) for c in columns.split()))


# The two tables as revision 0001 has them (no `dismissed_by`, no retention columns).
ITEM_0001 = _table_0001(
    "memory_item",
    "id user_id scope project_key content source status dedup_hash origin_session_id created_at updated_at",
)
HISTORY_0001 = _table_0001(
    "memory_history", "memory_id user_id action actor old_content new_content created_at"
)


def _insert(conn: sa.Connection, row: TwinRow) -> TwinRow:
    old_hash = _old_hash(row)
    fields = {
        "user_id": row.user_id, "scope": row.scope, "project_key": row.project_key, "content": row.content,
        "source": row.source, "status": row.status, "dedup_hash": old_hash,
        "origin_session_id": None, "created_at": row.created_at, "updated_at": row.updated_at,
    }  # fmt: skip
    conn.execute(ITEM_0001.insert(), fields)
    seeded = replace(
        row, id=int(conn.scalar(sa.select(sa.func.max(ITEM_0001.c.id))) or 0), dedup_hash=old_hash
    )
    conn.execute(HISTORY_0001.insert(), _trail(seeded))
    return seeded


MADE_BY = {
    "AUTO": ("insert", "auto"),
    "MANUAL": ("create", "user"),
    "CONSOLIDATED": ("merge", "consolidator"),
}


def _trail(row: TwinRow) -> list[dict[str, Any]]:
    """The history revision 0001 wrote for the row: how it was made, and how it was dismissed."""
    action, actor = MADE_BY[row.source]
    trail = [
        {
            "action": action,
            "actor": actor,
            "old_content": None,
            "new_content": row.content,
            "created_at": row.created_at,
        }
    ]
    if row.status == "DISMISSED":
        action, actor = ("dismiss", "user") if row.dismissed_by == "USER" else ("demote", "auto")
        trail.append(
            {
                "action": action,
                "actor": actor,
                "old_content": row.content,
                "new_content": None,
                "created_at": row.updated_at,
            }
        )
    return [{"memory_id": row.id, "user_id": row.user_id, **entry} for entry in trail]


def migrate_twins(directory: Path, users: list[int]) -> tuple[str, TwinMigration]:
    """A SQLite database at revision 0001 holding the users' twins, upgraded to head and checked."""
    url = f"sqlite+aiosqlite:///{directory / 'sim.db'}"
    upgrade_schema(url, "0001")
    migration = seed_twins(url, users)
    upgrade_schema(url)
    engine = sa.create_engine(sync_url(url))
    try:
        with engine.connect() as conn:
            after = {r["id"]: dict(r) for r in conn.execute(sa.text("SELECT * FROM memory_item")).mappings()}
            trail = [dict(r) for r in conn.execute(sa.text("SELECT * FROM memory_history")).mappings()]
    finally:
        engine.dispose()
    migration.problems = check_twins(migration.sets, after, [h for h in trail if h["actor"] == "migration"])
    return url, migration


def expected_state(rows: list[TwinRow]) -> tuple[str, str | None]:
    """The fact's state after the merge: rules 2 and 3 of the module's precedence."""
    rejected = [r.updated_at for r in rows if r.state == ("DISMISSED", "USER")]
    written = [r.created_at for r in rows if r.source == "MANUAL" and r.status == "ACTIVE"]
    if rejected and not (written and max(written) > max(rejected)):
        return "DISMISSED", "USER"
    if any(r.status == "ACTIVE" for r in rows):
        return "ACTIVE", None
    return "DISMISSED", "CAPACITY"


def check_twins(
    sets: list[list[TwinRow]], after: dict[int, dict[str, Any]], migration_trail: list[dict[str, Any]]
) -> list[str]:
    """Every rule of the precedence, for every set; an empty list means the upgrade kept them all."""
    problems: list[str] = []
    for rows in sets:
        problems += [f"twins {[r.id for r in rows]}: {p}" for p in _check_set(rows, after, migration_trail)]
    return problems


def _check_set(
    rows: list[TwinRow], after: dict[int, dict[str, Any]], trail: list[dict[str, Any]]
) -> list[str]:
    survivors = [r for r in rows if r.id in after]
    if len(survivors) != 1:
        return [f"{len(survivors)} rows survive, not one"]
    kept, now = survivors[0], after[survivors[0].id]
    problems = []
    if (now["content"], now["source"]) != (kept.content, kept.source):
        problems.append(f"the survivor {kept.id} was rewritten: {now['content']!r} {now['source']}")
    if now["dedup_hash"] != dedup_hash(Scope(kept.scope), kept.project_key, kept.content):
        problems.append(f"the survivor {kept.id} keeps an old hash")
    manual = [r for r in rows if r.source == "MANUAL"]
    if manual and kept.source != "MANUAL":
        problems.append(f"MANUAL {[r.id for r in manual]} deleted for a machine-made row")
    if (now["status"], now["dismissed_by"]) != (want := expected_state(rows)):
        problems.append(f"the fact is {now['status']}/{now['dismissed_by']}, the precedence says {want}")
    alike = len({(r.source, r.state) for r in rows}) == 1
    if alike and kept != min(rows, key=lambda r: (r.created_at, r.id)):
        problems.append(f"{kept.id} survives, not the oldest")
    said = {(h["action"], h["old_content"]) for h in trail if h["memory_id"] in {r.id for r in rows}}
    problems += [
        f"folding {r.id} left no merge in the history"
        for r in rows
        if r is not kept and ("merge", r.content) not in said
    ]
    if (now["status"], now["dismissed_by"]) != kept.state:
        action = "restore" if now["status"] == "ACTIVE" else "dismiss"
        if not any(h["memory_id"] == kept.id and h["action"] == action for h in trail):
            problems.append(f"{kept.id} became {now['status']} without a {action} in the history")
    return problems
