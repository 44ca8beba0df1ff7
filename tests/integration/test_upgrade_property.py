"""Any pool, written at any revision, upgrades to head as folding every twin at once by the precedence.

Hypothesis generates a user's rows at a revision (0001, where ids were reused and twins stored apart,
or a later one) with histories of every source and status: written by the model, the user or a
consolidation, dismissed by the user, demoted for room, restored, edited, touched; lookalike texts
that are twins under the identity rule, or only once 0005 cleans a NUL or a key's direction mark,
or that the identity rule reads alike but cleaning tells apart; blank texts; and at 0001 rows whose
id held a deleted row first. After `upgrade head` the result must equal the reference below,
computed in plain Python from the rows as written:

- every row 0005 finds blank is gone; the others fall into facts by the identity of their cleaned
  scope, key and text, and each fact is one row holding one of its twins' ids and cleaned texts, its
  hash the identity rule's;
- the fact's state is the precedence of docs/decisions.md over all its twins at once: DISMISSED
  (USER) when a twin was rejected by the user and no ACTIVE twin was written or restored by the user
  after the latest rejection, else ACTIVE when a twin is, else DISMISSED (CAPACITY); it is MANUAL
  when a twin is;
- every entry the twins' own trails held is in the survivor's history, and none of a deleted row
  whose id a twin reused.

`MEMORY_FUZZ_EXAMPLES` sets the count (10 in `make test`; `make faults` runs 150); MariaDB runs a
fifth of them. A failure prints the seed to replay with `--hypothesis-seed`.
"""

from __future__ import annotations

import os
import shutil
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine

from service.adapters.db.engine import sync_url, upgrade_schema
from service.core.model import Scope
from service.core.normalize import (
    dedup_hash,
    has_visible_text,
    hostile_character,
    strip_hostile,
    strip_identifier,
    trim,
)
from tests.support.old_pools import OldRow, at, database_at, old_hash, read_table, seed_0001
from tests.support.processes import MariaDbDatabase

EXAMPLES = int(os.environ.get("MEMORY_FUZZ_EXAMPLES", "10"))
MARIADB_EXAMPLES = max(2, EXAMPLES // 5)  # a database created and migrated per example: ~1 s each
REVISIONS = ["0001", "0002", "0004", "0006"]
USER = 77
# Facts and their lookalikes: the identity rule makes the first three twins; the NUL and the direction
# mark in a key only 0005's cleaning removes. The identity rule reads a NUL as a space, so the last
# text reads as the NUL's but is a fact of its own. The blank ones 0005 deletes.
TEXTS = [
    ["报告写成中文!", "报告写成中文！", "报告写成\u200b中文!", "报告写成\x00中文!", "报告写成 中文!"],
    [
        "用 pnpm 管理依赖",
        "用 pnpm\u2060 管理依赖",
        "用\u3000pnpm 管理依赖",
        "用 pnpm 管理\x00依赖",
        "用 pnpm 管理 依赖",
    ],
    ["\u200b", "\u2800\u200b"],
]
# "" is the USER scope; the last has nothing visible. Repeats make twins likelier.
KEYS = ["mao", "mao", "mao", "mao\u200e", "mao\u200e", "", "\u2066\u2069"]
# (source, status, trail as (action, actor, days after the previous entry)); as revision 0001 wrote them.
KINDS = [
    ("AUTO", "ACTIVE", [("insert", "auto", 0)]),
    ("AUTO", "ACTIVE", [("insert", "auto", 0), ("touch", "auto", 1)]),
    ("AUTO", "DISMISSED", [("insert", "auto", 0), ("dismiss", "user", 1)]),
    ("AUTO", "DISMISSED", [("insert", "auto", 0), ("demote", "auto", 1)]),
    ("AUTO", "ACTIVE", [("insert", "auto", 0), ("demote", "auto", 1), ("restore", "user", 1)]),
    ("MANUAL", "DISMISSED", [("insert", "auto", 0), ("demote", "auto", 1), ("edit", "user", 1)]),
    ("CONSOLIDATED", "ACTIVE", [("merge", "consolidator", 0)]),
    ("CONSOLIDATED", "DISMISSED", [("merge", "consolidator", 0), ("dismiss", "user", 2)]),
    ("MANUAL", "ACTIVE", [("create", "user", 0)]),
    ("MANUAL", "ACTIVE", [("create", "user", 0), ("touch", "auto", 3)]),
    ("MANUAL", "DISMISSED", [("create", "user", 0), ("dismiss", "user", 1)]),
    ("MANUAL", "ACTIVE", [("create", "user", 0), ("dismiss", "user", 1), ("restore", "user", 2)]),
]
# A deleted row's trail under the id revision 0001's SQLite then gave to a new row.
EARLIER = [
    [("create", "user", 0), ("delete", "user", 1)],
    [("insert", "auto", 0), ("restore", "user", 1), ("delete", "user", 1)],
    [("create", "user", 0), ("dismiss", "user", 1), ("delete", "user", 1)],
]
TALLY: Counter[str] = Counter()


@dataclass(frozen=True)
class Written:
    row: OldRow
    earlier: int  # entries of a deleted row's trail leading the row's own


@st.composite
def pools(draw: st.DrawFn, revision: str) -> list[Written]:
    rows: list[Written] = []
    seen: set[str] = set()
    # Half the pools hold one fact's lookalikes only, so that twins under each rule meet often.
    texts, keys = ([0], KEYS[:5]) if draw(st.booleans()) else ([0, 0, 0, 1, 2], KEYS)
    for row_id in range(1, draw(st.integers(1, 10)) + 1):
        content = draw(st.sampled_from(TEXTS[draw(st.sampled_from(texts))]))
        key = draw(st.sampled_from(keys))
        source, status, steps = draw(st.sampled_from(KINDS))
        earlier = draw(st.sampled_from(EARLIER)) if revision == "0001" and draw(st.booleans()) else []
        day, events = draw(st.integers(0, 20)), []
        for step, (action, actor, gap) in enumerate([*earlier, *steps]):
            # A reused id's new row comes after the delete, as a new row's time did in revision 0001.
            day += gap + draw(st.integers(0, 6)) + (step == len(earlier)) if events else 0
            events.append((action, actor, day))
        created = events[len(earlier)][2] if earlier else None
        scope = "PROJECT" if key else "USER"
        row = OldRow(row_id, USER, content, source, status, events, scope, key, created)
        stored = _hash_at(revision, row)
        if stored not in seen:  # a revision's own hash is unique per user
            seen.add(stored)
            rows.append(Written(row, len(earlier)))
    return rows


def _hash_at(revision: str, row: OldRow) -> str:
    return old_hash(row) if revision == "0001" else dedup_hash(Scope(row.scope), row.project_key, row.content)


def _dismissed_by(row: OldRow) -> str | None:
    """0002's derivation: the row's last status change was a demotion, or not."""
    if row.status == "ACTIVE":
        return None
    changes = [a for a, _, _ in row.events if a in ("dismiss", "demote", "restore")]
    return "CAPACITY" if changes[-1:] == ["demote"] else "USER"


def _cleaned(row: OldRow) -> tuple[str, str, str] | None:
    """(scope, key, content) as 0005 leaves the row; None when it deletes it."""
    content = trim(strip_hostile(row.content)) if hostile_character(row.content) else row.content
    if not has_visible_text(content):
        return None
    stripped = strip_identifier(row.project_key)
    key = trim(stripped) if stripped != row.project_key else stripped
    if row.scope == "PROJECT" and has_visible_text(key):
        return "PROJECT", key, content
    return "USER", "", content


def _said_active(written: Written) -> object:
    """When the user last said an ACTIVE twin holds, from the row's own trail (after `earlier`)."""
    row = written.row
    if row.status != "ACTIVE":
        return None
    own = row.events[written.earlier :]
    said = [at(d) for a, who, d in own if who == "user" and a in ("create", "edit", "restore")]
    if row.source == "MANUAL":
        said.append(row.created)
    return max(said, default=None)


def reference_state(twins: list[Written]) -> tuple[str, str | None]:
    rejected = [w.row.updated for w in twins if _dismissed_by(w.row) == "USER"]
    said = [s for w in twins if (s := _said_active(w)) is not None]
    if rejected and not (said and max(said) > max(rejected)):  # type: ignore[type-var]
        return "DISMISSED", "USER"
    if any(w.row.status == "ACTIVE" for w in twins):
        return "ACTIVE", None
    return "DISMISSED", "CAPACITY"


def reference_facts(pool: list[Written]) -> dict[str, list[Written]]:
    facts: dict[str, list[Written]] = {}
    for written in pool:
        if (cleaned := _cleaned(written.row)) is not None:
            scope, key, content = cleaned
            facts.setdefault(dedup_hash(Scope(scope), key, content), []).append(written)
    return facts


def write_at(url: str, revision: str, pool: list[Written]) -> None:
    rows = [w.row for w in pool]
    engine = create_engine(sync_url(url))
    try:
        with engine.begin() as conn:
            if revision == "0001":
                seed_0001(conn, rows)
                return
            seed_0001(conn, rows)
            for row in rows:  # what the revision stored: its hash, and why a row is dismissed
                conn.execute(
                    sa.text("UPDATE memory_item SET dedup_hash = :h, dismissed_by = :d WHERE id = :i"),
                    {"h": _hash_at(revision, row), "d": _dismissed_by(row), "i": row.id},
                )
    finally:
        engine.dispose()


def check(url: str, pool: list[Written]) -> None:
    items = {row["id"]: row for row in read_table(url, "memory_item")}
    trail = read_table(url, "memory_history")
    facts = reference_facts(pool)
    assert len(items) == len(facts), (items, facts)
    for digest, twins in facts.items():
        ids = {w.row.id for w in twins}
        [kept] = [row for row in items.values() if row["id"] in ids]
        assert kept["dedup_hash"] == digest
        assert kept["content"] in {_cleaned(w.row)[2] for w in twins}  # type: ignore[index]
        assert (kept["status"], kept["dismissed_by"]) == reference_state(twins), "\n".join(map(repr, twins))
        assert (kept["source"] == "MANUAL") == any(w.row.source == "MANUAL" for w in twins)
        held = Counter(
            (e["action"], e["actor"], e["created_at"]) for e in trail if e["memory_id"] == kept["id"]
        )
        wanted = Counter((a, who, at(d)) for w in twins for a, who, d in w.row.events[w.earlier :])
        assert wanted <= held, (wanted - held, twins)
        earlier = Counter((a, who, at(d)) for w in twins for a, who, d in w.row.events[: w.earlier])
        # Held beyond the twins' own entries (an own entry may share its action, actor and day with
        # an earlier row's): none of it may be the earlier rows' trail.
        assert not earlier & (held - wanted), "a deleted row's trail is under a live one"
        TALLY["twins folded"] += len(twins) - 1
        TALLY[f"facts {kept['status']}"] += 1


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """A SQLite file at each revision, copied for every example (migrating one takes longer)."""
    folder = tmp_path_factory.mktemp("templates")
    built = {}
    for revision in REVISIONS:
        with database_at("sqlite", revision, folder) as _:
            built[revision] = folder / f"{revision}.db"
    yield built


def upgrade_and_check(url: str, revision: str, pool: list[Written]) -> None:
    write_at(url, revision, pool)
    upgrade_schema(url)
    check(url, pool)
    TALLY["examples"] += 1
    TALLY["rows"] += len(pool)
    TALLY["reused ids"] += sum(w.earlier > 0 for w in pool)


revisions_and_pools = st.sampled_from(REVISIONS).flatmap(lambda r: st.tuples(st.just(r), pools(r)))
PROPERTY = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@PROPERTY
@given(case=revisions_and_pools)
def test_sqlite_pools_upgrade_as_the_reference_folds(
    case: tuple[str, list[Written]], templates: dict[str, Path], tmp_path: Path
) -> None:
    revision, pool = case
    copy = tmp_path / f"example-{TALLY['examples']}.db"
    shutil.copyfile(templates[revision], copy)
    upgrade_and_check(f"sqlite+aiosqlite:///{copy}", revision, pool)


@settings(PROPERTY, max_examples=MARIADB_EXAMPLES)
@given(case=revisions_and_pools)
def test_mariadb_pools_upgrade_as_the_reference_folds(case: tuple[str, list[Written]]) -> None:
    revision, pool = case
    database = MariaDbDatabase().create(revision)
    try:
        upgrade_and_check(database.url, revision, [replace(w) for w in pool])
    finally:
        database.drop()
