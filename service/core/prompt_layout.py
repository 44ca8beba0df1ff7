"""Extraction prompts that extend the user's previous one: frozen blocks and a log of changes.

A provider's prompt cache serves what a prompt shares with an earlier one as a prefix. Listed afresh
on every call, a full pool shares little: every event inserts, demotes, rewords or merges rows
somewhere in the list, and the prompt differs from that row on. So the process holds, per user, the
blocks it last listed, frozen, and a log of what changed since, only ever appended to: consecutive
prompts of a user in one project differ by the log's new lines and the conversation.

- The blocks are listed for the project the user was last served in (no project included). Their
  aliases come from one counter per user, so an alias names one row in a prompt and a gone row's
  alias never names another; the first listing numbers the rows as a fresh layout does.
- A build compares the comparison set with what the blocks and the log say and appends the
  difference only: `alias<TAB>type<TAB>content` for a row added or reworded, the alias alone for a
  row no longer stored, `-<TAB>fact` for a new dismissal.
- A project switch shares the rules and the USER block with the previous prompt and nothing after
  it, so that is when the project's blocks are listed afresh. The USER block is not: it only grows,
  the USER rows added since it was last listed appended to it (in id order, with new aliases), so
  the previous prompt's USER block is a prefix of the new one; the log starts with what it says of
  rows since changed or gone.
- Listed afresh as well: the project's blocks when the log passes LOG_SHARE of the frozen blocks'
  length or a dismissal is taken back (a restore, a delete: a log cannot say it); everything when,
  the project's blocks being listed afresh (there or at a switch), the USER block's gone rows and
  the log that corrects it pass DRIFT_SHARE. Between, the USER block's gone rows cost only their
  short log lines against LOG_SHARE: in one project they stay listed until the log passes it.
- With no layout held (a user's first call, an eviction, a restart, a partition taken over from
  another pod), the prompt is `extraction_prompt.memory_blocks`' fresh layout, byte for byte.
- A layout is held under the user's removal mark the read round returned with the comparison set
  (`memory_user_state.removal_mark`), and extended only under the same one. The frozen blocks list
  rows since gone, and a gone row's words may be ones the user deleted since (on any replica), or
  ones of a user erased whole: a delete draws a new mark, an erasure leaves none, and a layout
  under none is never extended, so the prompt after a delete lists only what is stored.
- Layouts are held for the `limit` users served last, and within `budget_bytes` in all: a layout's
  size is estimated from the strings it holds (`sys.getsizeof`, exact for a string) and a fixed
  cost per entry, so no user's pool, however long its words, grows the process past the budget.
  A build has no await, so events of one user handled at once each get a consistent snapshot.
"""

from __future__ import annotations

import sys
from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from service.core.comparison_set import ComparisonSet, Shown, in_layout_order
from service.core.extraction_prompt import (
    CHANGES,
    DISMISSED,
    DISMISSED_MARK,
    PROJECT_ROWS,
    ROW_TYPES,
    USER_ROWS,
    dismissed_lines,
    listed,
    memory_blocks,
)
from service.core.model import Scope
from service.core.prompt_blocks import block, one_line

# The log's length, in characters, past which the project's blocks are listed afresh, and the USER
# block's waste (its gone rows and the log lines correcting it) past which everything is when the
# project's are, as shares of the frozen blocks' length: more is more prompt at the cache's price,
# less more prompts at the full price (tests/simulation/REPORT.md).
LOG_SHARE = 0.5
DRIFT_SHARE = 0.25
# A held row's cost beyond its text (dict slot, tuple, alias), and a dismissal's (counter slot), as
# tracemalloc measures them (tests/unit/test_prompt_layout.py).
ROW_BYTES = 128
DISMISSAL_BYTES = 48

# What a layout last said of a row: its alias, its type as the log names it, its one-line content.
_Said = tuple[int, str, str]
_USER, _PROJECT = ROW_TYPES[Scope.USER], ROW_TYPES[Scope.PROJECT]


@dataclass(frozen=True, slots=True)
class LaidOut:
    """One prompt's memories: what its aliases stand for, and its blocks before the conversation."""

    existing: ComparisonSet
    memories: tuple[str, ...]


@dataclass(slots=True)
class _UserBlock:
    """A user's USER block, as its rows in the order it lists them (rendered again on each build,
    as a fresh layout is: held as text, it would double the memory), and the layout of the project
    the user was last served in."""

    rows: dict[int, _Said]  # by row id
    next_alias: int
    project_key: str | None
    mark: int | None  # the removal mark the rows were read under
    layout: _ProjectLayout | None = None

    @classmethod
    def fresh(cls, ordered: Sequence[Shown], project_key: str | None, mark: int | None) -> _UserBlock:
        user = cls({}, 1, project_key, mark)
        user.extend(ordered)
        return user

    def extend(self, ordered: Sequence[Shown]) -> None:
        """Append the USER rows of `ordered` it does not list yet."""
        for row_id, scope, _, content in ordered:
            if scope == Scope.USER and row_id not in self.rows:
                self.rows[row_id] = (self.next_alias, _USER, one_line(content))
                self.next_alias += 1

    def blocks(self) -> list[str]:
        return listed(USER_ROWS, [(alias, content) for alias, _, content in self.rows.values()])

    def footprint(self) -> int:
        """Bytes held, estimated from above: a string the layout shares is counted each time."""
        texts = [text for _, _, text in self.rows.values()]
        rows, dismissals = len(self.rows), 0
        if (layout := self.layout) is not None:
            texts += [text for _, _, text in layout.rows.values()]
            texts += [said[2] for said in layout.said.values() if said is not None]
            texts += [*layout.dismissed, layout.log]
            rows += len(layout.rows) + len(layout.said)
            dismissals = len(layout.dismissed) + len(layout.listed_dismissed)
        return sum(map(sys.getsizeof, texts)) + rows * ROW_BYTES + dismissals * DISMISSAL_BYTES


@dataclass(slots=True)
class _ProjectLayout:
    """A project's PROJECT and Dismissed blocks, the rows they list, and the log."""

    rows: dict[int, _Said]  # the PROJECT block's, by row id
    listed_dismissed: list[str]  # the Dismissed block's lines
    dismissed: Counter[str]  # every dismissal listed, by the block and the log
    frozen_chars: int  # the USER block's and this layout's blocks'
    said: dict[int, _Said | None] = field(default_factory=dict)  # the log's last word on a row; None: gone
    log: str = ""  # its lines, one string: a string per line would cost as much again

    @classmethod
    def fresh(cls, user: _UserBlock, ordered: Sequence[Shown], dismissed: list[str]) -> _ProjectLayout:
        """The user's USER block extended, the project's rows of `ordered` and the negative list as
        frozen blocks, their aliases after the USER block's."""
        user.extend(ordered)
        rows: dict[int, _Said] = {}
        for row_id, scope, _, content in ordered:
            if scope == Scope.PROJECT:
                rows[row_id] = (user.next_alias, _PROJECT, one_line(content))
                user.next_alias += 1
        layout = cls(rows, dismissed, Counter(dismissed), 0)
        layout.frozen_chars = sum(map(len, (*user.blocks(), *layout.blocks())))
        return layout

    def blocks(self) -> list[str]:
        return [
            *listed(PROJECT_ROWS, [(alias, content) for alias, _, content in self.rows.values()]),
            *listed(DISMISSED, [(DISMISSED_MARK, line) for line in self.listed_dismissed]),
        ]

    def retracted(self, dismissed: list[str]) -> bool:
        """Whether a dismissal listed is no longer in `dismissed` (a log cannot take it back)."""
        wanted = Counter(dismissed)
        return any(wanted[fact] < count for fact, count in self.dismissed.items())

    def extend(self, user: _UserBlock, ordered: Sequence[Shown], dismissed: list[str]) -> dict[int, Shown]:
        """Append what the blocks and the log do not say yet of `ordered` and `dismissed` (none of
        it `retracted`); the aliases of `ordered`'s rows."""
        aliases: dict[int, Shown] = {}
        present: set[int] = set()
        changed: list[str] = []
        for shown in ordered:
            row_id, scope, _, content = shown
            present.add(row_id)
            kind, text = ROW_TYPES[scope], one_line(content)
            said = self._said(user, row_id)
            if said is None:
                said = (user.next_alias, kind, text)
                user.next_alias += 1
            elif said[1] != kind or said[2] != text:
                said = (said[0], kind, text)
            else:
                aliases[said[0]] = shown
                continue
            self.said[row_id] = said
            changed.append(f"{said[0]}\t{kind}\t{text}")
            aliases[said[0]] = shown
        gone: list[int] = []
        for row_id in {*user.rows, *self.rows, *self.said} - present:
            if (said := self._said(user, row_id)) is not None:
                self.said[row_id] = None
                gone.append(said[0])
        lines = [*map(str, sorted(gone)), *changed]
        wanted = Counter(dismissed)
        for fact in dismissed:
            if self.dismissed[fact] < wanted[fact]:
                self.dismissed[fact] += 1
                lines.append(f"{DISMISSED_MARK}\t{fact}")
        if lines:
            self.log = "\n".join([self.log, *lines] if self.log else lines)
        return dict(sorted(aliases.items()))

    def memories(self, user: _UserBlock) -> tuple[str, ...]:
        log = [block(CHANGES, [self.log])] if self.log else []
        return (*user.blocks(), *self.blocks(), *log)

    def _said(self, user: _UserBlock, row_id: int) -> _Said | None:
        if row_id in self.said:
            return self.said[row_id]
        said = self.rows.get(row_id)
        return user.rows.get(row_id) if said is None else said


class PromptLayouts:
    """The layouts a process holds, of the `limit` users served last, in `budget_bytes` at most;
    `limit` 0 lays every prompt out afresh. `log_share`, `drift_share`: LOG_SHARE, DRIFT_SHARE."""

    def __init__(
        self,
        limit: int,
        log_share: float = LOG_SHARE,
        drift_share: float = DRIFT_SHARE,
        budget_bytes: int = 16 << 20,
    ) -> None:
        self._limit = limit
        self._log_share = log_share
        self._drift_share = drift_share
        self._budget = budget_bytes
        self._users: OrderedDict[int, _UserBlock] = OrderedDict()
        self._bytes: dict[int, int] = {}
        self._held_total = 0

    def __len__(self) -> int:
        return len(self._users)

    @property
    def held_bytes(self) -> int:
        """The estimated bytes of every layout held: never above the budget."""
        return self._held_total

    def build(
        self,
        user_id: int,
        project_key: str | None,
        rows: Iterable[Shown],
        dismissed: Sequence[str],
        mark: int | None,
    ) -> LaidOut:
        """The prompt memories of a comparison set (`rows`, and `dismissed` newest first, read under
        the removal `mark`), extending the user's held layout where it was built under the same
        mark, is of the same project and its log stays in bounds."""
        if self._limit == 0:
            existing = ComparisonSet.of(rows, dismissed)
            return LaidOut(existing, tuple(memory_blocks(existing)))
        ordered, lines = in_layout_order(rows), dismissed_lines(dismissed)
        user = self._users.get(user_id)
        if user is not None and (mark is None or user.mark != mark):
            user = None  # words it lists may be deleted ones
        if user is not None:
            self._users.move_to_end(user_id)
            layout = user.layout if user.project_key == project_key else None
            if layout is not None and not layout.retracted(lines):
                aliases = layout.extend(user, ordered, lines)
                if len(layout.log) <= self._log_share * layout.frozen_chars:
                    return self._held(user_id, user, layout, aliases, dismissed)
            layout = _ProjectLayout.fresh(user, ordered, lines)
            aliases = layout.extend(user, ordered, lines)  # what changed in the USER block
            present = {row_id for row_id, *_ in ordered}
            gone = sum(len(text) for row_id, (_, _, text) in user.rows.items() if row_id not in present)
            if len(layout.log) + gone <= self._drift_share * layout.frozen_chars:
                user.project_key, user.layout = project_key, layout
                return self._held(user_id, user, layout, aliases, dismissed)
        user = _UserBlock.fresh(ordered, project_key, mark)
        user.layout = layout = _ProjectLayout.fresh(user, ordered, lines)
        aliases = layout.extend(user, ordered, lines)  # appends nothing: all is listed afresh
        self._users[user_id] = user
        self._users.move_to_end(user_id)
        return self._held(user_id, user, layout, aliases, dismissed)

    def _held(
        self,
        user_id: int,
        user: _UserBlock,
        layout: _ProjectLayout,
        aliases: dict[int, Shown],
        dismissed: Sequence[str],
    ) -> LaidOut:
        """The prompt of the user's layout, its size counted and the least recently served let go
        while the held layouts pass their count or their budget (this one too, alone past it)."""
        size = user.footprint()
        self._held_total += size - self._bytes.get(user_id, 0)
        self._bytes[user_id] = size
        while self._users and (len(self._users) > self._limit or self._held_total > self._budget):
            evicted, _ = self._users.popitem(last=False)
            self._held_total -= self._bytes.pop(evicted)
        return LaidOut(ComparisonSet(aliases, dismissed), layout.memories(user))
