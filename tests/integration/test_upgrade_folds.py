"""An upgrade folds each fact's twins once, whichever rule makes them twins, as one fold of them all.

Each case is a revision-0001 pool upgraded to head on both dialects: the user's word is weighed by
when the user spoke, never by a migration's clock or by the trail of a deleted row whose id
revision 0001's SQLite gave to a new one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from service.adapters.db.engine import upgrade_schema
from tests.support.old_pools import OldRow, database_at, read_table, write

TEXT, LOOKALIKE = "用 pnpm 管理依赖", "用 pnpm\u200b 管理依赖"  # one identity, two hashes in 0001
KEY = "mao"


@pytest.fixture(params=["mysql", "sqlite"])
def dialect(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def upgraded(dialect: str, folder: Path, rows: list[OldRow]) -> list[dict[str, object]]:
    with database_at(dialect, "0001", folder) as url:
        write(url, rows)
        upgrade_schema(url)
        return [dict(row) for row in read_table(url, "memory_item")]


def test_a_rejection_folded_by_0002_keeps_its_time_for_0005s_fold(dialect: str, tmp_path: Path) -> None:
    """M (the user's, day 0) and A (the model's, dismissed by the user on day 5) are twins for 0002;
    N (the user's, day 7, under a key with a direction mark) becomes their twin in 0005. The user
    wrote the fact after rejecting it: ACTIVE, carried by a MANUAL row."""
    rows = [
        OldRow(1, 7, TEXT, "MANUAL", "ACTIVE", [("create", "user", 0)], "PROJECT", KEY),
        OldRow(2, 7, LOOKALIKE, "AUTO", "DISMISSED", [("insert", "auto", 1), ("dismiss", "user", 5)],
               "PROJECT", KEY),
        OldRow(3, 7, TEXT, "MANUAL", "ACTIVE", [("create", "user", 7)], "PROJECT", KEY + "\u200e"),
    ]  # fmt: skip
    [row] = upgraded(dialect, tmp_path, rows)
    assert (row["status"], row["dismissed_by"], row["source"]) == ("ACTIVE", None, "MANUAL")


def test_a_rejection_after_the_users_last_word_stands_through_both_folds(
    dialect: str, tmp_path: Path
) -> None:
    """The other order: N was written on day 3, before the rejection of day 5."""
    rows = [
        OldRow(1, 7, TEXT, "MANUAL", "ACTIVE", [("create", "user", 0)], "PROJECT", KEY),
        OldRow(2, 7, LOOKALIKE, "AUTO", "DISMISSED", [("insert", "auto", 1), ("dismiss", "user", 5)],
               "PROJECT", KEY),
        OldRow(3, 7, TEXT, "MANUAL", "ACTIVE", [("create", "user", 3)], "PROJECT", KEY + "\u200e"),
    ]  # fmt: skip
    [row] = upgraded(dialect, tmp_path, rows)
    assert (row["status"], row["dismissed_by"], row["source"]) == ("DISMISSED", "USER", "MANUAL")
    assert row["updated_at"] == rows[1].updated  # the rejection's own time, not the migration's


def test_a_reused_ids_earlier_trail_is_not_the_users_word_on_the_new_row(
    dialect: str, tmp_path: Path
) -> None:
    """Revision 0001's SQLite gave id 11, whose row the user wrote on day 3 and deleted on day 4, to
    the model's lookalike of day 6. The user's rejection of day 2 stands."""
    reused = [("create", "user", 3), ("delete", "user", 4), ("insert", "auto", 6)]
    rows = [
        OldRow(10, 8, TEXT, "AUTO", "DISMISSED", [("insert", "auto", 0), ("dismiss", "user", 2)]),
        OldRow(11, 8, LOOKALIKE, "AUTO", "ACTIVE", reused, created_day=6),
    ]
    [row] = upgraded(dialect, tmp_path, rows)
    assert (row["id"], row["status"], row["dismissed_by"]) == (10, "DISMISSED", "USER")


def test_a_survivor_restored_by_a_fold_carries_only_its_twins_word(dialect: str, tmp_path: Path) -> None:
    """S (the user's edit of a row demoted for room, day 7) and R (restored by the user on day 3) are
    twins for 0002; X (rejected on day 5) becomes theirs once 0005 removes its NUL. The precedence
    reads only ACTIVE twins' words (R's, day 3 < 5): DISMISSED. Folded in steps, 0002 would restore S
    and its own edit (day 7) would outweigh the rejection in 0005's fold."""
    edited = [("insert", "auto", 5), ("demote", "auto", 6), ("edit", "user", 7)]
    restored = [("insert", "auto", 1), ("demote", "auto", 2), ("restore", "user", 3)]
    rejected = [("insert", "auto", 4), ("dismiss", "user", 5)]
    rows = [
        OldRow(1, 9, TEXT, "MANUAL", "DISMISSED", edited),
        OldRow(2, 9, LOOKALIKE, "AUTO", "ACTIVE", restored),
        OldRow(3, 9, "用 pnpm 管理\x00依赖", "AUTO", "DISMISSED", rejected),
    ]
    [row] = upgraded(dialect, tmp_path, rows)
    assert (row["status"], row["dismissed_by"]) == ("DISMISSED", "USER")


def test_rows_twins_under_no_one_rule_stay_apart(dialect: str, tmp_path: Path) -> None:
    """A NUL is a space to 0002's identity and nothing once 0005 removes it: N ("pnpm\\x009") is the
    twin of S ("pnpm 9", rejected by the user on day 5) now and of J ("pnpm9", the user's, day 7)
    later, but S and J are twins under neither rule. Folded by each rule in turn, S keeps the
    rejection of its own fact; grouped as one, J's later word takes it and "pnpm 9" could come back."""
    rows = [
        OldRow(1, 9, "prefer pnpm 9", "AUTO", "DISMISSED", [("insert", "auto", 0), ("dismiss", "user", 5)]),
        OldRow(2, 9, "prefer pnpm\x009", "AUTO", "ACTIVE", [("insert", "auto", 1)]),
        OldRow(3, 9, "prefer pnpm9", "MANUAL", "ACTIVE", [("create", "user", 7)]),
    ]
    kept = {row["content"]: (row["status"], row["dismissed_by"]) for row in upgraded(dialect, tmp_path, rows)}
    assert kept == {"prefer pnpm 9": ("DISMISSED", "USER"), "prefer pnpm9": ("ACTIVE", None)}


def test_two_manual_facts_twins_under_no_one_rule_both_stay(dialect: str, tmp_path: Path) -> None:
    """The user wrote "pnpm 9" and "pnpm9", two facts under either rule; the model's "pnpm\\x009" is
    the twin of the first now and of the second later. Neither of the user's rows is the machine's
    to delete."""
    rows = [
        OldRow(1, 9, "prefer pnpm 9", "MANUAL", "ACTIVE", [("create", "user", 0)]),
        OldRow(2, 9, "prefer pnpm\x009", "AUTO", "ACTIVE", [("insert", "auto", 1)]),
        OldRow(3, 9, "prefer pnpm9", "MANUAL", "ACTIVE", [("create", "user", 2)]),
    ]
    kept = {row["content"]: row["source"] for row in upgraded(dialect, tmp_path, rows)}
    assert kept == {"prefer pnpm 9": "MANUAL", "prefer pnpm9": "MANUAL"}


# Rows that are twins only once cleaned, or that clean apart though the identity rule reads a NUL as
# a space: 0002 groups them by the fact they clean to, so each fact folds once.
REJECTED = [("insert", "auto", 4), ("dismiss", "user", 5)]
EDITED = [("insert", "auto", 5), ("demote", "auto", 6), ("edit", "user", 7)]
RESTORED = [("insert", "auto", 1), ("demote", "auto", 2), ("restore", "user", 3)]
DEMOTED = [("insert", "auto", 0), ("demote", "auto", 1)]


def states(items: list[dict[str, object]]) -> dict[object, tuple[object, object, object]]:
    return {row["content"]: (row["source"], row["status"], row["dismissed_by"]) for row in items}


@pytest.mark.parametrize(
    ("rejected_key", "key"),
    [("", ""), ("mao\u200e", "mao"), ("", "\u2066\u2069")],
    ids=["text", "mark", "blank"],
)
def test_a_restored_survivor_of_a_group_the_cleaning_splits_brings_no_word(
    dialect: str, tmp_path: Path, rejected_key: str, key: str
) -> None:
    """ "pnpm9" was rejected on day 5; S ("pnpm\\x009", the user's edit of a row demoted for room) is
    its twin once cleaned, and R ("pnpm 9", restored on day 3) S's twin to the identity rule only.
    The only word on an ACTIVE twin of "pnpm9" is none: DISMISSED (USER). A key with nothing visible
    is the USER scope's."""
    scope = "PROJECT" if key else "USER"
    rows = [
        OldRow(1, 9, "prefer pnpm9", "AUTO", "DISMISSED", REJECTED, "PROJECT" if rejected_key else "USER",
               rejected_key),
        OldRow(2, 9, "prefer pnpm\x009", "MANUAL", "DISMISSED", EDITED, scope, key),
        OldRow(3, 9, "prefer pnpm 9", "AUTO", "ACTIVE", RESTORED, scope, key),
    ]  # fmt: skip
    kept = states(upgraded(dialect, tmp_path, rows))
    assert kept == {
        "prefer pnpm9": ("MANUAL", "DISMISSED", "USER"),
        "prefer pnpm 9": ("AUTO", "ACTIVE", None),
    }


def test_twins_under_a_key_mark_and_a_nul_fold_once(dialect: str, tmp_path: Path) -> None:
    """M (the user's edit of a row demoted for room) and R (restored on day 3) differ by a key's
    direction mark; X ("pnpm\\x009", rejected on day 5) by a NUL. One fold: R's restore (day 3) is
    the only word on an ACTIVE twin, so the rejection stands; "pnpm 9" is a fact of its own."""
    rows = [
        OldRow(1, 9, "prefer pnpm9", "MANUAL", "DISMISSED", EDITED, "PROJECT", "mao"),
        OldRow(2, 9, "prefer pnpm9", "AUTO", "ACTIVE", RESTORED, "PROJECT", "mao\u200e"),
        OldRow(3, 9, "prefer pnpm\x009", "AUTO", "DISMISSED", REJECTED, "PROJECT", "mao"),
        OldRow(4, 9, "prefer pnpm 9", "AUTO", "ACTIVE", [("insert", "auto", 8)], "PROJECT", "mao"),
    ]
    kept = states(upgraded(dialect, tmp_path, rows))
    assert kept == {
        "prefer pnpm9": ("MANUAL", "DISMISSED", "USER"),
        "prefer pnpm 9": ("AUTO", "ACTIVE", None),
    }


def test_rows_the_identity_rule_reads_alike_keep_their_own_facts(dialect: str, tmp_path: Path) -> None:
    """ "pnpm 9" (demoted for room) and "pnpm\\x009" (the user's) are two facts once cleaned: both
    stay, each in its own state."""
    rows = [
        OldRow(1, 9, "prefer pnpm 9", "AUTO", "DISMISSED", DEMOTED),
        OldRow(2, 9, "prefer pnpm\x009", "MANUAL", "ACTIVE", [("create", "user", 2)]),
    ]
    kept = states(upgraded(dialect, tmp_path, rows))
    assert kept == {
        "prefer pnpm 9": ("AUTO", "DISMISSED", "CAPACITY"),
        "prefer pnpm9": ("MANUAL", "ACTIVE", None),
    }


def test_a_rejection_stays_with_its_own_text(dialect: str, tmp_path: Path) -> None:
    """ "pnpm 9" was rejected; the user wrote "pnpm\\x009" on day 1 and "pnpm9" on day 7. The
    rejection of "pnpm 9" stays on its row, so the model is still told not to keep it."""
    rows = [
        OldRow(1, 9, "prefer pnpm 9", "AUTO", "DISMISSED", REJECTED),
        OldRow(2, 9, "prefer pnpm\x009", "MANUAL", "ACTIVE", [("create", "user", 1)]),
        OldRow(3, 9, "prefer pnpm9", "MANUAL", "ACTIVE", [("create", "user", 7)]),
    ]
    kept = states(upgraded(dialect, tmp_path, rows))
    assert kept == {
        "prefer pnpm 9": ("AUTO", "DISMISSED", "USER"),
        "prefer pnpm9": ("MANUAL", "ACTIVE", None),
    }


def test_a_fact_survives_as_one_of_its_own_twins(dialect: str, tmp_path: Path) -> None:
    """The user wrote "pnpm 9" and rejected it on day 1, wrote "pnpm\\x009" on day 3; "pnpm9" was
    rejected on day 5. "pnpm9" keeps its rejection (day 5 after day 3), "pnpm 9" its own."""
    rows = [
        OldRow(1, 9, "prefer pnpm 9", "MANUAL", "DISMISSED", [("create", "user", 0), ("dismiss", "user", 1)]),
        OldRow(2, 9, "prefer pnpm\x009", "MANUAL", "ACTIVE", [("create", "user", 3)]),
        OldRow(3, 9, "prefer pnpm9", "AUTO", "DISMISSED", REJECTED),
    ]
    kept = states(upgraded(dialect, tmp_path, rows))
    assert kept == {
        "prefer pnpm 9": ("MANUAL", "DISMISSED", "USER"),
        "prefer pnpm9": ("MANUAL", "DISMISSED", "USER"),
    }


def test_four_lookalikes_across_scopes_fold_into_one_row_with_every_entry(
    dialect: str, tmp_path: Path
) -> None:
    """Keys of isolates only and of a direction mark only are the USER scope once cleaned: four rows,
    one fact, one row carrying each row's whole trail."""
    rows = [
        OldRow(1, 9, "prefer pnpm9", "AUTO", "DISMISSED", REJECTED, "PROJECT", "\u2066\u2069"),
        OldRow(2, 9, "prefer pnpm9", "MANUAL", "DISMISSED", EDITED, "USER", ""),
        OldRow(3, 9, "prefer pnpm\x009", "AUTO", "ACTIVE", RESTORED, "PROJECT", "\u200e"),
        OldRow(4, 9, "prefer pnpm9\x00", "AUTO", "ACTIVE", [("insert", "auto", 8)], "USER", ""),
    ]
    with database_at(dialect, "0001", tmp_path) as url:
        write(url, rows)
        upgrade_schema(url)
        [row] = [dict(r) for r in read_table(url, "memory_item")]
        trail = [dict(r) for r in read_table(url, "memory_history") if r["memory_id"] == row["id"]]
    assert states([row]) == {"prefer pnpm9": ("MANUAL", "DISMISSED", "USER")}
    assert sum(entry["actor"] != "migration" for entry in trail) == sum(len(r.events) for r in rows)
