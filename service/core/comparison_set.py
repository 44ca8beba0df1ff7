"""The comparison set of D13 (seed 10.1), with the aliases that stand in for database ids."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from service.core.model import Group, MemoryRow, Scope, session_groups

# A row as the model is shown it: (row id, scope, project key, content). A plain tuple, as the read
# round returns it: a full pool shows 200 rows on every extraction, and an object per row cost
# more CPU than the rest of the read.
Shown = tuple[int, str, str, str]


@dataclass(frozen=True, slots=True)
class ComparisonSet:
    """What the model may reference (`aliases`: each row under the alias the prompt shows it with)
    and what it must not re-extract (`dismissed`, newest first).

    Aliases are small integers assigned per prompt layout, so a real row id never reaches the prompt
    and an id the model invents cannot name another user's row. A fresh layout numbers the rows
    1..n (`of`); a layout held between calls (`core/prompt_layout.py`) keeps a row's alias while it
    stays and never hands a left row's alias to another.
    """

    aliases: Mapping[int, Shown] = field(default_factory=dict)
    dismissed: Sequence[str] = ()

    @classmethod
    def of(cls, rows: Iterable[Shown], dismissed: Sequence[str]) -> ComparisonSet:
        """Aliases 1..n in a stable order: the USER group first, each group in id order. A touch
        reorders nothing and a new row comes last in its group, so consecutive prompts of a user
        share their longest prefix (what a provider's prompt cache reuses), the USER part across
        projects."""
        return cls(dict(enumerate(in_layout_order(rows), start=1)), dismissed)

    @property
    def shown(self) -> list[Shown]:
        """The rows the model may reference, in alias order."""
        return list(self.aliases.values())

    def resolve(self, alias: object) -> tuple[int, Group] | None:
        """The row id and group an alias of this call stands for; None for anything else."""
        if not isinstance(alias, int) or isinstance(alias, bool):
            return None
        shown = self.aliases.get(alias)
        if shown is None:
            return None
        row_id, scope, project_key, _ = shown
        return row_id, Group(Scope(scope), project_key)


def in_layout_order(rows: Iterable[Shown]) -> list[Shown]:
    """The USER group first, each group in id order."""
    return sorted(rows, key=lambda r: (r[1] != Scope.USER, r[0]))


EMPTY = ComparisonSet()


def build_comparison_set(
    rows: Iterable[MemoryRow], project_key: str | None, dismissed: Sequence[str]
) -> ComparisonSet:
    """The rule the read round's query applies: only machine-made ACTIVE rows of the USER group and
    the session's project group (merged rows are matched like extracted ones, MANUAL rows never)."""
    groups = session_groups(project_key)
    legal = [
        (r.id, r.scope.value, r.project_key, r.content)
        for r in rows
        if r.machine_active and r.group in groups
    ]
    return ComparisonSet.of(legal, dismissed)
