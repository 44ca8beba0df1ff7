"""The pool's invariants, checked after every step of the simulation.

`check_step` is pure: the rows before and after one step, the history rows the step appended, who
acted, and what the model offered. `PoolWatch` (watch.py) reads those from the database for one user.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Literal

from service.core.extraction_answer import ParsedAnswer, parse_extraction_answer
from service.core.model import MACHINE_SOURCES, MAX_ACTIVE_PER_USER, Action, Group, Scope, Source
from service.core.model_quality import HORIZONS_DAYS, WINDOW, Rejection
from service.core.normalize import identity
from service.core.persist_plan import candidate_group
from tests.simulation.model import fact_of

Actor = Literal["user", "extraction", "consolidation", "migration"]


@dataclass(frozen=True)
class Row:
    id: int
    scope: str
    project_key: str
    content: str
    source: str
    status: str
    dismissed_by: str | None
    updated_at: datetime

    @property
    def group(self) -> Group:
        return Group(Scope(self.scope), self.project_key)

    @property
    def machine(self) -> bool:
        return Source(self.source) in MACHINE_SOURCES

    @property
    def active(self) -> bool:
        return self.status == "ACTIVE"


@dataclass(frozen=True)
class Replayed:
    """A memory as its history alone describes it."""

    content: str = ""
    status: str = "ACTIVE"
    source: str = "AUTO"
    dismissed_by: str | None = None
    updated_at: datetime | None = None
    deleted: bool = False

    @classmethod
    def of(cls, row: Row) -> Replayed:
        """A row taken as it is, where its history starts before the simulation (a migrated pool)."""
        return cls(row.content, row.status, row.source, row.dismissed_by, row.updated_at)

    def matches(self, row: Row) -> bool:
        return (self.content, self.status, self.source, self.dismissed_by, self.updated_at, self.deleted) == (
            row.content,
            row.status,
            row.source,
            row.dismissed_by,
            row.updated_at,
            False,
        )


@dataclass(frozen=True)
class Offered:
    """What the model answered to an extraction, and the session's valid project key."""

    answer: str
    project_key: str | None


class Violation(AssertionError):
    pass


def replay(state: Replayed | None, entry: dict[str, Any]) -> Replayed:
    """One history row applied to what the memory's earlier history built."""
    current = state or Replayed()
    at = entry["created_at"]
    action, old, new = entry["action"], entry["old_content"], entry["new_content"]
    # A merged-away row's `merge` keeps its text, unless a user's delete of what it went into erased
    # the words since (`content_erased_at`); the survivor's own `merge` has none.
    merged_away = action == "merge" and (old is not None or entry.get("content_erased_at") is not None)
    if action in {"delete", "drop"} or merged_away:
        return replace(current, deleted=True)
    if action in {"insert", "create"} or (action == "merge" and old is None):
        source = {"insert": "AUTO", "create": "MANUAL", "merge": "CONSOLIDATED"}[action]
        return Replayed(new, "ACTIVE", source, None, at)
    if action == "touch":  # a row retention folded stands for a run that ended at `last_at`
        return replace(current, updated_at=entry.get("last_at") or at)
    if action in {"update", "edit"}:
        return replace(
            current, content=new, updated_at=at, source="MANUAL" if action == "edit" else current.source
        )
    if action in {"dismiss", "demote"}:
        reason = "USER" if action == "dismiss" else "CAPACITY"
        return replace(current, status="DISMISSED", dismissed_by=reason, updated_at=at)
    if action == "restore":
        restored = replace(current, status="ACTIVE", dismissed_by=None, updated_at=at)
        return replace(restored, content=new, source="MANUAL") if new is not None else restored
    raise Violation(f"history action {action!r} cannot be replayed")


@functools.lru_cache(maxsize=65_536)
def _identity(content: str) -> str:
    return identity(content)


def identity_key(row: Row) -> tuple[str, str, str]:
    return row.scope, row.project_key, _identity(row.content)


def check_step(
    actor: Actor,
    before: dict[int, Row],
    after: dict[int, Row],
    entries: list[dict[str, Any]],
    ever_seen: set[int],
    history: dict[int, Replayed],
    offered: Offered | None = None,
    user_deleted: frozenset[int] = frozenset(),
) -> list[str]:
    """Every rule the pool must keep across one step; an empty list means it kept them all.
    `user_deleted`: rows the user deleted during the step (while a consolidation call was in flight)."""
    problems: list[str] = []
    active = [r for r in after.values() if r.active]
    if len(active) > MAX_ACTIVE_PER_USER:
        problems.append(f"{len(active)} ACTIVE rows, over {MAX_ACTIVE_PER_USER}")
    twins = [k for k, n in Counter(identity_key(r) for r in active).items() if n > 1]
    if twins:
        problems.append(f"two ACTIVE rows of one group with the same identity: {twins}")
    reused = sorted((set(after) - set(before)) & ever_seen)
    if reused:
        problems.append(f"ids reused: {reused}")
    by_memory: dict[int, list[dict[str, Any]]] = {}
    for entry in entries:
        by_memory.setdefault(entry["memory_id"], []).append(entry)
    problems += _vanished(actor, before, after, by_memory, user_deleted)
    if actor in ("extraction", "consolidation"):  # the migration's own rules: tests/simulation/twins.py
        problems += _machine_rules(before, after)
    if actor == "consolidation":
        problems += [
            f"fact {f} lost: no ACTIVE row states it" for f in lost_facts(before, after, user_deleted)
        ]
    if offered is not None:
        problems += _no_freeze(before, after, offered)
    for entry in entries:
        history[entry["memory_id"]] = replay(history.get(entry["memory_id"]), entry)
    for row in after.values():
        if row.id not in history or not history[row.id].matches(row):
            problems.append(f"history of {row.id} replays to {history.get(row.id)}, the row is {row}")
    ghosts = [i for i, h in history.items() if not h.deleted and i not in after]
    if ghosts:
        problems.append(f"rows {ghosts} gone without a history row saying so")
    return problems


def _vanished(
    actor: Actor,
    before: dict[int, Row],
    after: dict[int, Row],
    by_memory: dict[int, list[dict[str, Any]]],
    user_deleted: frozenset[int],
) -> list[str]:
    """No ACTIVE row is deleted except by the user, a validated merge or a drop."""
    allowed = {"user": {("delete", "user")}, "extraction": set(), "consolidation": set(), "migration": set()}[
        actor
    ]
    allowed |= {("merge", "consolidator"), ("drop", "consolidator")} if actor == "consolidation" else set()
    problems = []
    for row_id in set(before) - set(after):
        said = {(e["action"], e["actor"]) for e in by_memory.get(row_id, [])}
        if not said & (allowed | ({("delete", "user")} if row_id in user_deleted else set())):
            problems.append(f"row {row_id} deleted by {actor} with history {said or 'none'}")
    return problems


def fact_key(row: Row) -> tuple[str, str, object]:
    """The fact a row states: the simulated fact it names (any wording, merged or not, read through
    the identity rule, so an invisible character cannot hide the name), else its text."""
    text = _identity(row.content)
    return row.scope, row.project_key, fact_of(text) or text


def lost_facts(before: dict[int, Row], after: dict[int, Row], user_deleted: frozenset[int]) -> list[str]:
    """Facts ACTIVE before a consolidation and stated by no ACTIVE row after it, unless the user
    deleted every row that stated them."""
    stated = {fact_key(r) for r in after.values() if r.active}
    rows_of: dict[tuple[str, str, object], list[int]] = {}
    for row in before.values():
        if row.active:
            rows_of.setdefault(fact_key(row), []).append(row.id)
    return sorted(
        (str(f) for f, ids in rows_of.items() if f not in stated and not set(ids) <= user_deleted), key=str
    )


def _machine_rules(before: dict[int, Row], after: dict[int, Row]) -> list[str]:
    problems = []
    for row in before.values():
        now = after.get(row.id)
        if row.source == "MANUAL" and now is not None and now != row:
            problems.append(f"MANUAL row {row.id} changed by the machine: {row} -> {now}")
        if row.dismissed_by == "USER" and now is not None and now != row:
            problems.append(f"user-dismissed row {row.id} changed by the machine: {row} -> {now}")
        if now is None:
            continue
        if row.active and not now.active and (now.dismissed_by != "CAPACITY" or not row.machine):
            problems.append(f"row {row.id} dismissed by the machine other than by a D14 demotion: {now}")
        if not row.active and now.active and (row.dismissed_by != "CAPACITY" or not row.machine):
            problems.append(f"row {row.id} revived by the machine though not demoted for room: {row}")
    made_manual = [
        r.id for r in after.values() if r.source == "MANUAL" and before.get(r.id, r).source != "MANUAL"
    ]
    new_manual = [r.id for r in after.values() if r.source == "MANUAL" and r.id not in before]
    if made_manual or new_manual:
        problems.append(f"MANUAL rows made by the machine: {made_manual + new_manual}")
    return problems


def _no_freeze(before: dict[int, Row], after: dict[int, Row], offered: Offered) -> list[str]:
    """A new fact offered while its group holds a machine-made ACTIVE row always gets in (D14)."""
    parsed = parse_extraction_answer(offered.answer)
    if not isinstance(parsed, ParsedAnswer):
        return []
    problems = []
    seen_groups: set[Group] = set()
    added = 0
    active = sum(r.active for r in before.values())
    for candidate in parsed.candidates:
        if candidate.action is not Action.INSERT or candidate.content is None:
            continue
        group = candidate_group(candidate, offered.project_key)
        key = (group.scope.value, group.project_key, _identity(candidate.content))
        known = [r for r in before.values() if identity_key(r) == key]
        if known and (known[0].active or known[0].dismissed_by != "CAPACITY" or not known[0].machine):
            continue  # a re-confirmation, or a fact the user owns or rejected
        if group in seen_groups:
            continue
        seen_groups.add(group)
        room = active + added < MAX_ACTIVE_PER_USER or any(
            r.active and r.machine and r.group == group for r in before.values()
        )
        added += 1
        if room and not any(r.active and identity_key(r) == key for r in after.values()):
            problems.append(f"new fact {candidate.content!r} offered with room in {group} did not get in")
    return problems


def check_after_retention(
    rows: dict[int, Row],
    entries: list[dict[str, Any]],
    touches_seen: Counter[int],
    baseline: dict[int, Replayed] | None = None,
    baseline_id: int = 0,
) -> list[str]:
    """Retention folded touch runs and removed old trails: the history left, replayed from nothing
    (or from `baseline`, the pool as a migration left it, for rows after `baseline_id`), must still
    give every row exactly, and each memory's touches must still add up."""
    replayed: dict[int, Replayed] = dict(baseline or {})
    folded: Counter[int] = Counter()
    for entry in [e for e in entries if e["id"] > baseline_id] if baseline_id else entries:
        replayed[entry["memory_id"]] = replay(replayed.get(entry["memory_id"]), entry)
        if entry["action"] == "touch":
            folded[entry["memory_id"]] += entry["repeat_count"]
    problems = [
        f"after retention the history of {row.id} replays to {replayed.get(row.id)}, the row is {row}"
        for row in rows.values()
        if row.id not in replayed or not replayed[row.id].matches(row)
    ]
    problems += [
        f"after retention {folded[m]} touches of {m} are left of {touches_seen[m]}"
        for m in rows
        if folded[m] != touches_seen[m]
    ]
    return problems


@dataclass(frozen=True)
class Made:
    """A row that appeared at an extraction step, while `model` was the configured extraction model."""

    id: int
    model: str
    at: datetime


@dataclass(frozen=True)
class UserRejection:
    """A dismiss, delete or edit the simulated user made through the HTTP API (answered 200)."""

    id: int
    kind: Rejection
    at: datetime


# Per model: "created", "reconfirmed", "touches", and per horizon "cohort 7d", "dismissed 7d", ...
QualityFigures = dict[str, dict[str, int]]


def expected_quality(
    made: list[Made], rejections: list[UserRejection], touches: Counter[int], now: datetime
) -> QualityFigures:
    """Each extraction model's production-quality figures (`core.model_quality`'s rules) as the
    driver's own log gives them: the rows it saw appear at extraction steps, the user's actions it
    made, and the touches the watch read step by step before retention folded any."""
    first: dict[int, UserRejection] = {}
    for rejection in sorted(rejections, key=lambda r: r.at):
        first.setdefault(rejection.id, rejection)
    tallies: dict[str, Counter[str]] = {}
    for row in made:
        if row.at < now - WINDOW:
            continue
        counts = tallies.setdefault(row.model, Counter())
        counts["created"] += 1
        counts["reconfirmed"] += int(touches[row.id] > 0)
        counts["touches"] += touches[row.id]
        rejected = first.get(row.id)
        for days in HORIZONS_DAYS:
            if row.at > now - timedelta(days=days):
                continue  # too young for this horizon's cohort
            counts[f"cohort {days}d"] += 1
            if rejected is not None and rejected.at - row.at <= timedelta(days=days):
                counts[f"{rejected.kind.label} {days}d"] += 1
    return {model: _complete(counts) for model, counts in tallies.items()}


def reported_quality(models: list[dict[str, Any]]) -> QualityFigures:
    """The counts of `GET /api/v1/admin/memory/quality`'s `models`, keyed as `expected_quality`'s."""
    figures: QualityFigures = {}
    for m in models:
        counts = {"created": m["created"], "reconfirmed": m["reconfirmed"], "touches": m["touches"]}
        for h in m["within"]:
            counts[f"cohort {h['days']}d"] = h["cohort"]
            counts |= {f"{kind.label} {h['days']}d": h["rejected"][kind.label] for kind in Rejection}
        figures[m["model"]] = counts
    return figures


def quality_differences(reported: QualityFigures, expected: QualityFigures) -> list[str]:
    """Each figure where two readings of the models' quality disagree; empty when they agree."""
    problems = []
    for model in sorted(reported.keys() | expected.keys()):
        said, known = reported.get(model, {}), expected.get(model, {})
        problems += [
            f"{model} {key}: {said.get(key)} reported, {known.get(key)} expected"
            for key in sorted(said.keys() | known.keys())
            if said.get(key) != known.get(key)
        ]
    return problems


def _complete(counts: Counter[str]) -> dict[str, int]:
    """Every key, zeros included, as the endpoint names them all."""
    keys = ["created", "reconfirmed", "touches"] + [
        f"{name} {days}d" for days in HORIZONS_DAYS for name in ["cohort", *(k.label for k in Rejection)]
    ]
    return {key: counts[key] for key in keys}
