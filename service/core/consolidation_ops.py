"""What a validated consolidation plan writes (D15), decided on the group as read under the user's lock.

The model answers about the rows it was shown; by the time the answer is applied an extraction or the
user may have changed them. `decide` returns the ops the adapter applies in order in one transaction,
or why the group is left alone; every rule lives here so it can be tested without a database.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from service.core.consolidation import ConsolidationPlan, Merge, RunResult
from service.core.model import Group, MemoryRow, Status
from service.core.normalize import dedup_hash
from service.core.overflow import restorable


@dataclass(frozen=True, slots=True)
class GroupState:
    """The group under the lock: its machine-made ACTIVE rows, and every row of the user (any source
    or status) holding one of the plan's `merged_hashes`."""

    machine_active: dict[int, MemoryRow]
    by_hash: dict[str, MemoryRow]


@dataclass(frozen=True, slots=True)
class InsertMerged:
    """The merged text is new to the user: a CONSOLIDATED row without an origin session holds it."""

    group: Group
    content: str
    dedup_hash: str


@dataclass(frozen=True, slots=True)
class RestoreMerged:
    """The merged text is a row demoted for room (D14): that row is ACTIVE again and holds the fact."""

    row_id: int
    content: str


@dataclass(frozen=True, slots=True)
class MergeAway:
    """A merge source, deleted: its fact lives on in the row that holds the merged text."""

    row_id: int
    old_content: str
    merged_content: str


@dataclass(frozen=True, slots=True)
class Drop:
    row_id: int
    content: str


Op = InsertMerged | RestoreMerged | MergeAway | Drop


@dataclass(frozen=True, slots=True)
class Abandon:
    """The group is left as it is; `result` is ABANDONED_STALE or ABANDONED_INVALID."""

    result: RunResult
    reason: str


def merged_hashes(plan: ConsolidationPlan, group: Group) -> set[str]:
    """The hashes `GroupState.by_hash` must cover for `decide` to see every row a merge restates."""
    return {dedup_hash(group.scope, group.project_key, m.content) for m in plan.merges}


def removed_ids(plan: ConsolidationPlan) -> set[int]:
    return {i for m in plan.merges for i in m.source_ids} | set(plan.drops)


def relied_on(plan: ConsolidationPlan, shown: Iterable[int]) -> set[int]:
    """The shown rows the plan is only right about if they are unchanged: the rows it removes, and,
    when it drops any, every row it keeps. A drop says only that its row repeats "another kept or
    merged memory" (kept = named in `keep` or not mentioned at all), never which one, so any kept
    row may be the last other copy of the dropped fact; merged memories are covered by their sources."""
    removed = removed_ids(plan)
    return removed | set(shown) if plan.drops else removed


def decide(
    plan: ConsolidationPlan, group: Group, shown: dict[int, MemoryRow], state: GroupState
) -> list[Op] | Abandon:
    """Ops that keep every fact the plan relied on, or why the group is left alone. A plan that drops
    every row it was shown and merges none is invalid: a drop is only right while another copy of its
    fact stays, kept or merged. A relied-on row that is gone, no longer machine-made and ACTIVE, or
    reworded since it was shown is stale."""
    if plan.drops and not plan.merges and set(shown) <= set(plan.drops):
        return Abandon(RunResult.ABANDONED_INVALID, "the plan drops every row and keeps or merges none")
    changed = sorted(
        i
        for i in relied_on(plan, shown)
        if (now := state.machine_active.get(i)) is None or now.content != shown[i].content
    )
    if changed:
        return Abandon(RunResult.ABANDONED_STALE, f"rows {changed} changed while the model was answering")
    removed = removed_ids(plan)
    made: set[str] = set()  # merged texts an earlier merge of this plan made ACTIVE
    ops: list[Op] = []
    for merge in plan.merges:
        target = _merge_target(merge, group, state, removed, made)
        if isinstance(target, Abandon):
            return target
        kept, op = target
        ops += [op] if op is not None else []
        ops += [MergeAway(i, shown[i].content, merge.content) for i in merge.source_ids if i != kept]
    ops += [Drop(i, shown[i].content) for i in plan.drops]
    return ops


def _merge_target(
    merge: Merge, group: Group, state: GroupState, removed: set[int], made: set[str]
) -> tuple[int | None, Op | None] | Abandon:
    """Where the sources fold: a new CONSOLIDATED row, a row that already says the merged text
    (ACTIVE, or demoted for room and restored), or nowhere. Never a row the user dismissed: the ACTIVE
    sources would vanish into a rejected fact. Returns the row kept (when it is a source) and the op
    that makes the target, if any."""
    digest = dedup_hash(group.scope, group.project_key, merge.content)
    if digest in made:
        return None, None
    made.add(digest)
    clash = state.by_hash.get(digest)
    if clash is None:
        return None, InsertMerged(group, merge.content, digest)
    if clash.id in removed and clash.id not in merge.source_ids:
        return Abandon(RunResult.ABANDONED_INVALID, "a merge restates a row that another operation removes")
    if clash.status is Status.ACTIVE:
        return clash.id, None
    if not restorable(clash.source, clash.dismissed_by):
        return Abandon(RunResult.ABANDONED_INVALID, "a merge restates a fact the user dismissed")
    return clash.id, RestoreMerged(clash.id, clash.content)
