"""Migration 0002 folds rows that the identity rule makes twins without losing a user's word.

One revision-0001 database per dialect holds every ordered pair of realistic old rows as lookalike
twins (one user per pair, the older written on day 0, the newer on day 5), written the way revision
0001 wrote them: no `dismissed_by` yet, only the history that 0002 derives it from. After `upgrade
head` each pair is one row in the state the precedence of 0002's docstring gives, with both twins'
history under it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy import create_engine

from service.adapters.db.engine import sync_url, upgrade_schema
from service.core.model import Scope
from service.core.normalize import dedup_hash
from tests.support.processes import MariaDbDatabase

DAY0 = datetime(2026, 10, 1, 9, 0)
# Render the same; revision 0001 hashed them apart (it only folded whitespace).
OLDER_TEXT, NEWER_TEXT, THIRD_TEXT = "报告写成中文!", "报告写成中文！", "报告写成\u200b中文!"

Event = tuple[str, str, int]  # history action, actor, day

# Each kind as revision 0001 left it: (source, status, history from the row's first day). Only AUTO
# rows were ever demoted there, nothing but the user changed a MANUAL row's status, and a user's edit
# made a row MANUAL and kept its status.
KINDS: dict[str, tuple[str, str, list[Event]]] = {
    "A": ("AUTO", "ACTIVE", [("insert", "auto", 0)]),
    "AR": ("AUTO", "DISMISSED", [("insert", "auto", 0), ("dismiss", "user", 2)]),
    "AD": ("AUTO", "DISMISSED", [("insert", "auto", 0), ("demote", "auto", 2)]),
    # Demoted for room, then restored by the user: their word that the fact holds.
    "AT": ("AUTO", "ACTIVE", [("insert", "auto", 0), ("demote", "auto", 2), ("restore", "user", 4)]),
    # Demoted for room, then edited by the user without restoring it: never rejected.
    "AE": ("MANUAL", "DISMISSED", [("insert", "auto", 0), ("demote", "auto", 2), ("edit", "user", 4)]),
    "C": ("CONSOLIDATED", "ACTIVE", [("merge", "consolidator", 0)]),
    "CR": ("CONSOLIDATED", "DISMISSED", [("merge", "consolidator", 0), ("dismiss", "user", 2)]),
    "M": ("MANUAL", "ACTIVE", [("create", "user", 0)]),
    "MR": ("MANUAL", "DISMISSED", [("create", "user", 0), ("dismiss", "user", 2)]),
}

# Row: the older twin's kind; column: the newer twin's. Cell: the survivor (o older, n newer) and its
# state (A ACTIVE, U dismissed by the user, C dismissed for capacity). The older twin's dismissal or
# demotion is on day 2 and its restore or edit on day 4, before the newer twin is written; the newer
# twin's on days 7 and 9.
EXPECTED = """
        A   AR  AD  AT  AE  C   CR  M   MR
    A   oA  nU  oA  oA  nA  oA  nU  nA  nU
    AR  oU  oU  oU  nA  nU  oU  oU  nA  nU
    AD  nA  nU  oC  nA  nC  nA  nU  nA  nU
    AT  oA  nU  oA  oA  nA  oA  nU  nA  nU
    AE  oA  oU  oC  oA  oC  oA  oU  nA  nU
    C   oA  nU  oA  oA  nA  oA  nU  nA  nU
    CR  oU  oU  oU  nA  nU  oU  oU  nA  nU
    M   oA  oU  oA  oA  oA  oA  oU  oA  nU
    MR  oU  oU  oU  oA  oU  oU  oU  nA  oU
"""
STATES = {"A": ("ACTIVE", None), "U": ("DISMISSED", "USER"), "C": ("DISMISSED", "CAPACITY")}


def _cells() -> dict[tuple[str, str], str]:
    header, *lines = EXPECTED.strip().splitlines()
    return {
        (older, newer): cell
        for older, *cells in (line.split() for line in lines)
        for newer, cell in zip(header.split(), cells, strict=True)
    }


CELLS = _cells()
PAIRS = sorted(CELLS)


@dataclass(frozen=True)
class Row:
    id: int
    source: str
    status: str
    content: str
    events: list[Event]
    created_day: int | None = None  # when not the first event's: a reused id's trail starts earlier

    @property
    def own_events(self) -> list[Event]:
        """The row's trail without a deleted row's that held its id first."""
        return [e for e in self.events if self.created_day is None or e[2] >= self.created_day]

    @property
    def state(self) -> tuple[str, str | None]:
        """(status, dismissed_by) as 0002 derives it: CAPACITY when the last status change was a
        demotion, else USER."""
        if self.status == "ACTIVE":
            return "ACTIVE", None
        changes = [action for action, _, _ in self.events if action in ("dismiss", "demote", "restore")]
        return "DISMISSED", "CAPACITY" if changes[-1:] == ["demote"] else "USER"


def kind(row_id: int, name: str, content: str, first_day: int) -> Row:
    source, status, events = KINDS[name]
    return Row(row_id, source, status, content, [(a, who, first_day + d) for a, who, d in events])


def twins(first_id: int, older: str, newer: str) -> list[Row]:
    return [kind(first_id, older, OLDER_TEXT, 0), kind(first_id + 1, newer, NEWER_TEXT, 5)]


def pair_user(pair: tuple[str, str]) -> int:
    return 100 + PAIRS.index(pair)


def scenarios() -> dict[int, list[Row]]:
    """Every ordered pair, plus cases whose history decides: user id → that user's twins."""
    users = {pair_user(pair): twins(pair_user(pair) * 10, *pair) for pair in PAIRS}
    # Revision 0001 touched a MANUAL row on an exact hit: that moved `updated_at` to day 9, after
    # the newer twin's rejection, but the user wrote the fact on day 0.
    users[1] = [
        Row(11, "MANUAL", "ACTIVE", OLDER_TEXT, [("create", "user", 0), ("touch", "auto", 9)]),
        kind(12, "AR", NEWER_TEXT, 5),
    ]
    # The user dismissed and then restored the MANUAL row on day 9: a newer word than the rejection.
    users[2] = [
        Row(
            21,
            "MANUAL",
            "ACTIVE",
            OLDER_TEXT,
            [("create", "user", 0), ("dismiss", "user", 1), ("restore", "user", 9)],
        ),
        kind(22, "AR", NEWER_TEXT, 5),
    ]
    # Three twins: a capacity demotion, an active fact, and the user's own row they dismissed later.
    users[3] = [kind(31, "AD", OLDER_TEXT, 0), kind(32, "A", NEWER_TEXT, 3), kind(33, "MR", THIRD_TEXT, 5)]
    # Revision 0001's SQLite gave the id of a row the user dismissed and deleted (days 3 and 4) to a new
    # AUTO lookalike on day 6: that trail is not the user's word on the new row.
    reused = [("insert", "auto", 0), ("dismiss", "user", 3), ("delete", "user", 4), ("insert", "auto", 6)]
    users[4] = [kind(41, "AR", OLDER_TEXT, 0), Row(42, "AUTO", "ACTIVE", NEWER_TEXT, reused, created_day=6)]
    return users


@dataclass
class Migrated:
    items: dict[int, list[sa.RowMapping]]  # by user
    history: dict[int, list[sa.RowMapping]]  # by user, oldest first


def _at(day: int) -> datetime:
    return DAY0 + timedelta(days=day)


def _seed(conn: sa.Connection, users: dict[int, list[Row]]) -> None:
    items, trail = [], []
    for user_id, rows in users.items():
        for row in rows:
            items.append(
                dict(
                    id=row.id,
                    user_id=user_id,
                    scope="USER",
                    project_key="",
                    content=row.content,
                    source=row.source,
                    status=row.status,
                    dedup_hash=hashlib.sha1(f"USER||{row.content}".encode()).hexdigest(),
                    origin_session_id=None,
                    created_at=_at(row.events[0][2] if row.created_day is None else row.created_day),
                    updated_at=_at(row.events[-1][2]),
                )
            )
            trail += [
                dict(memory_id=row.id, user_id=user_id, action=action, actor=actor, created_at=_at(day))
                for action, actor, day in row.events
            ]
    conn.execute(sa.table("memory_item", *map(sa.column, items[0])).insert(), items)
    conn.execute(sa.table("memory_history", *map(sa.column, trail[0])).insert(), trail)


@pytest.fixture(scope="module", params=["mysql", "sqlite"])
def migrated(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Migrated]:
    """The scenarios written at revision 0001, then upgraded to head, as read back."""
    database = None
    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('twins') / 'old.db'}"
        upgrade_schema(url, "0001")
    else:
        database = MariaDbDatabase().create("0001")
        url = database.url
    engine = create_engine(sync_url(url))
    try:
        with engine.begin() as conn:
            _seed(conn, scenarios())
        upgrade_schema(url)
        with engine.connect() as conn:
            items = conn.execute(sa.text("SELECT * FROM memory_item ORDER BY id")).mappings().all()
            trail = conn.execute(sa.text("SELECT * FROM memory_history ORDER BY id")).mappings().all()
        result = Migrated({}, {})
        for item in items:
            result.items.setdefault(item["user_id"], []).append(item)
        for entry in trail:
            result.history.setdefault(entry["user_id"], []).append(entry)
        yield result
    finally:
        engine.dispose()
        if database is not None:
            database.drop()


def assert_folded(migrated: Migrated, user_id: int, survivor_id: int, state: tuple[str, str | None]) -> None:
    """One row left, `survivor_id` unchanged but for its state and hash, every twin's history under
    it followed by one `merge` per folded twin, and the state change recorded when there was one."""
    twins = {row.id: row for row in scenarios()[user_id]}
    survivor = twins[survivor_id]
    [row] = migrated.items[user_id]
    assert (row["id"], row["source"], row["content"]) == (survivor_id, survivor.source, survivor.content)
    assert (row["status"], row["dismissed_by"]) == state
    assert row["dedup_hash"] == dedup_hash(Scope.USER, "", survivor.content)
    trail = [h for h in migrated.history[user_id] if h["memory_id"] == survivor_id]
    old = [(h["action"], h["actor"]) for h in trail if h["actor"] != "migration"]
    assert sorted(old) == sorted((a, who) for twin in twins.values() for a, who, _ in twin.own_events)
    new = [(h["action"], h["old_content"], h["new_content"]) for h in trail if h["actor"] == "migration"]
    merges = [("merge", t.content, survivor.content) for t in twins.values() if t.id != survivor_id]
    if state == survivor.state:
        assert new == merges
    else:
        assert new == [*merges, ("restore" if state[0] == "ACTIVE" else "dismiss", survivor.content, None)]


@pytest.mark.parametrize("pair", PAIRS, ids=[f"{o}+{n}" for o, n in PAIRS])
def test_twins_fold_into_the_survivor_the_precedence_names(migrated: Migrated, pair: tuple[str, str]) -> None:
    user_id = pair_user(pair)
    cell = CELLS[pair]
    who, state = cell[0], cell[1]
    survivor_id = user_id * 10 + (0 if who == "o" else 1)
    assert_folded(migrated, user_id, survivor_id, STATES[state])


def test_a_machine_touch_on_a_manual_row_is_not_the_users_word(migrated: Migrated) -> None:
    assert_folded(migrated, 1, 11, ("DISMISSED", "USER"))


def test_restoring_a_manual_row_after_the_twins_rejection_keeps_the_fact_active(migrated: Migrated) -> None:
    assert_folded(migrated, 2, 21, ("ACTIVE", None))


def test_three_twins_fold_into_the_users_row_carrying_the_rejection(migrated: Migrated) -> None:
    assert_folded(migrated, 3, 33, ("DISMISSED", "USER"))


def test_a_deleted_rows_trail_under_a_reused_id_is_not_the_users_word(migrated: Migrated) -> None:
    assert_folded(migrated, 4, 41, ("DISMISSED", "USER"))
    gone = [(h["memory_id"], h["action"]) for h in migrated.history[4] if h["memory_id"] != 41]
    [(gone_id, _), *_] = gone  # the deleted row's trail keeps an id of its own, which no row holds
    assert gone == [(gone_id, "insert"), (gone_id, "dismiss"), (gone_id, "delete")]
    assert gone_id > max(row["id"] for rows in migrated.items.values() for row in rows)


def test_the_twins_are_twins() -> None:
    """The scenarios' premise: distinct under revision 0001's hash, one identity under 0002's."""
    texts = (OLDER_TEXT, NEWER_TEXT, THIRD_TEXT)
    assert len({hashlib.sha1(f"USER||{t}".encode()).hexdigest() for t in texts}) == 3
    assert len({dedup_hash(Scope.USER, "", t) for t in texts}) == 1
