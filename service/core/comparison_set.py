"""The comparison set of D13 (seed 10.1), with the aliases that stand in for database ids."""

from __future__ import annotations

from dataclasses import dataclass, field

from service.core.model import Group, MemoryRow, Scope, session_groups


@dataclass(frozen=True, slots=True)
class ComparisonSet:
    """What the model may reference (`rows`, keyed by alias) and what it must not re-extract.

    Aliases are small integers assigned per call, so a real row id never reaches the prompt and an
    id the model invents cannot name another user's row.
    """

    rows: dict[int, MemoryRow] = field(default_factory=dict)
    dismissed: list[str] = field(default_factory=list)

    def group_of(self, alias: int) -> Group | None:
        row = self.rows.get(alias)
        return row.group if row else None


EMPTY = ComparisonSet()


def build_comparison_set(
    rows: list[MemoryRow], project_key: str | None, dismissed: list[str]
) -> ComparisonSet:
    """Keep only machine-made ACTIVE rows of the USER group and the session's project group (merged
    rows are matched like extracted ones, MANUAL rows never), the USER group first and each in id
    order: a touch reorders nothing and a new row comes last, so consecutive prompts of a user
    share their longest prefix (a provider's prompt cache), and the USER part holds across projects."""
    groups = session_groups(project_key)
    legal = [r for r in rows if r.machine_active and r.group in groups]
    legal.sort(key=lambda r: (r.scope is not Scope.USER, r.id))
    return ComparisonSet(rows={i: r for i, r in enumerate(legal, start=1)}, dismissed=dismissed)
