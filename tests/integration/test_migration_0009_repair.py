"""Migration 0009 repairs what the first released migration 0002 left, where the history shows it.

Each database is written at revision 0001, migrated by the released 0002 (`tests/support/
released_0002.py`, run as Alembic ran it, then stamped 0002), and upgraded to head on both dialects.
The released fold kept the oldest twin and left each deleted twin's trail under its own id, ended by
an orphan `merge`; 0009 folds such facts again by the precedence of today's 0002.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from alembic.migration import MigrationContext
from alembic.operations import Operations
from sqlalchemy import create_engine

from service.adapters.db.engine import sync_url, upgrade_schema
from tests.support import released_0002
from tests.support.old_pools import OldRow, at, database_at, read_table, write

TEXT, LOOKALIKE = "周报周一发", "周报\u200b周一发"  # one identity, two hashes in revision 0001
MADE = [("insert", "auto", 0)]
ROWS = [
    # The released fold kept the model's older row ACTIVE: the user's rejection (day 7) was lost.
    OldRow(10, 1, TEXT, "AUTO", "ACTIVE", MADE),
    OldRow(11, 1, LOOKALIKE, "AUTO", "DISMISSED", [("insert", "auto", 5), ("dismiss", "user", 7)]),
    # It kept the model's older row over the user's own: the fact is the user's again, in their words.
    OldRow(20, 2, TEXT, "AUTO", "ACTIVE", MADE),
    OldRow(21, 2, LOOKALIKE, "MANUAL", "ACTIVE", [("create", "user", 5)]),
    # It kept the user's older rejection over the fact they wrote again later.
    OldRow(30, 3, TEXT, "MANUAL", "DISMISSED", [("create", "user", 0), ("dismiss", "user", 2)]),
    OldRow(31, 3, LOOKALIKE, "MANUAL", "ACTIVE", [("create", "user", 5)]),
    # As user 1, but the user edited the kept row after the migration: their later word stands.
    OldRow(40, 4, TEXT, "AUTO", "ACTIVE", MADE),
    OldRow(41, 4, LOOKALIKE, "AUTO", "DISMISSED", [("insert", "auto", 5), ("dismiss", "user", 7)]),
    # Right already: the user's older row kept ACTIVE; only the trail moves.
    OldRow(50, 5, TEXT, "MANUAL", "ACTIVE", [("create", "user", 0)]),
    OldRow(51, 5, LOOKALIKE, "AUTO", "ACTIVE", [("insert", "auto", 5)]),
    # Demoted for room, then edited by the user: the released 0002 called it the user's rejection.
    OldRow(60, 6, TEXT, "MANUAL", "DISMISSED", [*MADE, ("demote", "auto", 2), ("edit", "user", 4)]),
]  # fmt: skip
# user → (kept id, source, content, status, dismissed_by)
EXPECTED = {
    1: (10, "AUTO", TEXT, "DISMISSED", "USER"),
    2: (20, "MANUAL", LOOKALIKE, "ACTIVE", None),
    3: (30, "MANUAL", TEXT, "ACTIVE", None),
    4: (40, "AUTO", TEXT, "ACTIVE", None),
    5: (50, "MANUAL", TEXT, "ACTIVE", None),
    6: (60, "MANUAL", TEXT, "DISMISSED", "CAPACITY"),
}


@dataclass
class Repaired:
    items: dict[int, list[sa.RowMapping]]
    history: dict[int, list[sa.RowMapping]]


def released_0002_over(url: str) -> None:
    """The released 0002 as Alembic ran it, then the database stamped at 0002."""
    engine = create_engine(sync_url(url))
    try:
        with engine.begin() as conn:
            context = MigrationContext.configure(
                conn, opts={"render_as_batch": conn.dialect.name == "sqlite"}
            )
            with Operations.context(context):
                released_0002.upgrade()
            conn.execute(sa.text("UPDATE alembic_version SET version_num = '0002'"))
    finally:
        engine.dispose()


def user_edits_after_the_migration(url: str, memory_id: int, user_id: int) -> None:
    engine = create_engine(sync_url(url))
    later = datetime.now(UTC).replace(tzinfo=None) + timedelta(hours=1)
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO memory_history (memory_id, user_id, action, actor, created_at)"
                    " VALUES (:m, :u, 'edit', 'user', :at)"
                ),
                {"m": memory_id, "u": user_id, "at": later},
            )
    finally:
        engine.dispose()


@pytest.fixture(scope="module", params=["mysql", "sqlite"])
def repaired(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Repaired]:
    with database_at(request.param, "0001", tmp_path_factory.mktemp("repair")) as url:
        write(url, ROWS)
        released_0002_over(url)
        user_edits_after_the_migration(url, 40, 4)
        before = {row["user_id"]: row for row in read_table(url, "memory_item")}
        assert before[1]["status"] == "ACTIVE" and before[2]["source"] == "AUTO"  # the damage
        assert before[6]["dismissed_by"] == "USER"
        upgrade_schema(url)
        result = Repaired({}, {})
        for row in read_table(url, "memory_item"):
            result.items.setdefault(row["user_id"], []).append(row)
        for entry in read_table(url, "memory_history"):
            result.history.setdefault(entry["user_id"], []).append(entry)
        yield result


@pytest.mark.parametrize("user_id", sorted(EXPECTED))
def test_the_fact_ends_as_the_precedence_gives(repaired: Repaired, user_id: int) -> None:
    [row] = repaired.items[user_id]
    assert (row["id"], row["source"], row["content"], row["status"], row["dismissed_by"]) == EXPECTED[user_id]


@pytest.mark.parametrize("user_id", [1, 2, 3, 5])
def test_the_deleted_twins_trail_moves_under_the_kept_row(repaired: Repaired, user_id: int) -> None:
    kept = EXPECTED[user_id][0]
    trail = repaired.history[user_id]
    assert {entry["memory_id"] for entry in trail} == {kept}
    written = [(e["action"], e["actor"]) for e in trail if e["actor"] != "migration"]
    assert sorted(written) == sorted((a, who) for r in ROWS if r.user_id == user_id for a, who, _ in r.events)


def test_a_repaired_rejection_keeps_the_users_time(repaired: Repaired) -> None:
    [row] = repaired.items[1]
    assert row["updated_at"] == at(7)
    assert [e["action"] for e in repaired.history[1] if e["actor"] == "migration"] == ["merge", "dismiss"]


def test_the_users_row_comes_back_as_an_edit_by_the_migration(repaired: Repaired) -> None:
    edits = [e for e in repaired.history[2] if (e["action"], e["actor"]) == ("edit", "migration")]
    assert [(e["old_content"], e["new_content"]) for e in edits] == [(TEXT, LOOKALIKE)]


def test_a_fact_the_user_acted_on_since_keeps_its_trail_apart(repaired: Repaired) -> None:
    assert {entry["memory_id"] for entry in repaired.history[4]} == {40, 41}


@pytest.mark.parametrize("dialect", ["mysql", "sqlite"])
def test_rows_a_pod_of_an_older_rule_wrote_meanwhile_are_folded(
    dialect: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """While 0006 ran, a pod of 0005's release stored a key with a direction mark (its rule kept
    U+200E in identifiers), hashed so: the same fact as the user's row under the clean key."""
    rows = [
        dict(
            id=row_id, user_id=9, scope="PROJECT", project_key=key, content=TEXT, source=source,
            status="ACTIVE", dedup_hash=f"old-rule-{row_id}", created_at=at(row_id), updated_at=at(row_id),
        )
        for row_id, key, source in ((1, "mao", "MANUAL"), (2, "mao\u200e", "AUTO"))
    ]  # fmt: skip
    with database_at(dialect, "0006", tmp_path_factory.mktemp("pods")) as url:
        engine = create_engine(sync_url(url))
        try:
            with engine.begin() as conn:
                conn.execute(sa.table("memory_item", *map(sa.column, rows[0])).insert(), rows)
        finally:
            engine.dispose()
        upgrade_schema(url)
        [row] = read_table(url, "memory_item")
        assert (row["id"], row["project_key"], row["source"], row["status"]) == (1, "mao", "MANUAL", "ACTIVE")


@pytest.mark.parametrize("dialect", ["mysql", "sqlite"])
def test_a_twin_only_to_the_released_rule_gives_no_state_to_another_fact(
    dialect: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The released 0002 read a NUL as a space and folded "pnpm 9" (rejected on day 7) into the
    user's "pnpm\\x009": once cleaned, two facts. The repair leaves the user's fact ACTIVE."""
    rows = [
        OldRow(1, 9, "prefer pnpm\x009", "MANUAL", "ACTIVE", [("create", "user", 0)]),
        OldRow(2, 9, "prefer pnpm 9", "AUTO", "DISMISSED", [("insert", "auto", 5), ("dismiss", "user", 7)]),
    ]
    with database_at(dialect, "0001", tmp_path_factory.mktemp("released")) as url:
        write(url, rows)
        released_0002_over(url)
        upgrade_schema(url)
        kept = [(r["content"], r["source"], r["status"]) for r in read_table(url, "memory_item")]
    assert kept == [("prefer pnpm9", "MANUAL", "ACTIVE")]
