"""What the pool read under the user's lock must fetch for `decide` (seed 5.6 step 5, D13, D14)."""

from __future__ import annotations

from dataclasses import dataclass

from service.core.comparison_set import ComparisonSet
from service.core.model import Action, Candidate, Group
from service.core.persist_plan import candidate_group, candidate_hashes


@dataclass(frozen=True, slots=True)
class PoolQuery:
    """What `decide` needs read under the lock, so that the read grows with the answer, not with the
    pool: the rows the candidates reference, the rows holding their hashes, and per group its oldest
    machine-made ACTIVE rows, the D14 victims (the ACTIVE count always comes along).

    A group needs as many of its oldest rows as it has candidates: each candidate demotes at most
    one row or moves at most one (touch, update, exact-hash hit) to the newest end, so the oldest
    row still in place, the next victim, is always among them.
    """

    references: frozenset[int]
    hashes: frozenset[str]
    victims: dict[Group, int]


def pool_query(candidates: list[Candidate], existing: ComparisonSet, project_key: str | None) -> PoolQuery:
    references: set[int] = set()
    victims: dict[Group, int] = {}
    for candidate in candidates:
        group = candidate_group(candidate, project_key)
        victims[group] = victims.get(group, 0) + 1
        shown = existing.resolve(candidate.existing_alias)
        if candidate.action is not Action.INSERT and shown is not None:
            references.add(shown[0])
    return PoolQuery(frozenset(references), frozenset(candidate_hashes(candidates, project_key)), victims)
