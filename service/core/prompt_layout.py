"""Extraction prompts that extend the user's previous one: frozen blocks and a log of changes.

A provider's prompt cache serves what a prompt shares with an earlier one as a prefix. Listed afresh
on every call, a full pool shares little: every event inserts, demotes, rewords or merges rows
somewhere in the list, and the prompt differs from that row on. So the process holds, per user, the
blocks it last listed, frozen, and a log of what changed since, only ever appended to: consecutive
prompts of a user in one project differ by the log's new lines and the conversation.

- The blocks are listed for the project the user was last served in (no project included). Their
  aliases come from one counter per user, so an alias names one row in a prompt and a gone row's
  alias never names another; a row keeps its alias while the layout names it, back from gone or
  listed again after a cut; the first listing numbers the rows as a fresh layout does.
- A build compares the comparison set with what the blocks and the log say and appends the
  difference only: `alias<TAB>type<TAB>content` for a row added or reworded, the alias alone for a
  row no longer stored, `-<TAB>fact` for a new dismissal.
- A project switch shares the rules and the USER block with the previous prompt and nothing after
  it, so that is when the project's blocks are listed afresh. The USER block is not: it only grows,
  the USER rows added since it was last listed appended to it (in id order), so the previous
  prompt's USER block is a prefix of the new one; the log starts with what it says of rows since
  changed or gone.
- Listed afresh as well: the project's blocks when the log passes LOG_SHARE of the frozen blocks'
  length; everything when, the project's blocks being listed afresh (there or at a switch), the
  USER block's gone rows and the log that corrects it pass DRIFT_SHARE. Between, the USER block's
  gone rows cost only their short log lines against LOG_SHARE: in one project they stay listed until
  the log passes it.
- With no layout held (a user's first call, an eviction, a restart, a partition taken over from
  another pod), the prompt is `extraction_prompt.memory_blocks`' fresh layout, byte for byte.
- What a log cannot say is cut: the prompt stays the previous one up to the first line that may not
  stay, and what follows is listed again (a cut in the USER block lists the project's blocks afresh;
  one in the PROJECT or Dismissed block lists the rest of it and what follows; one in the log drops
  the lines from there), then the log says what the rest does not. A dismissal taken back (a
  restore, a delete) is such a line.
- So is a row whose words may be ones the user deleted since (on any replica). A layout is held
  under the user's removal mark the read round returned with the comparison set
  (`memory_user_state.removal_mark`); a delete draws a new one. Under another mark, a row is
  doubtful when a line says words the row no longer holds (an edit's or a rewording's old words:
  the deleted memory may have said them too), or when the comparison set no longer holds it, unless
  the database still holds its words as listed (`kept`: its history stands unerased, read after
  the round, so every erasure the mark stands for is seen, and it is merged away or stored with
  those words); so is any row a line of which says a doubtful row's words. The prompt is cut at the
  first doubtful row's line, so it lists no word deleted. An erasure leaves no mark, and
  a layout read under none is never extended: the prompt is the fresh one.
- Layouts are held for the `limit` users served last, and within `budget_bytes` in all: a layout's
  size is estimated from the strings it holds (`sys.getsizeof`, exact for a string) and a fixed
  cost per entry, so no user's pool, however long its words, grows the process past the budget.
  A build has no await, so events of one user handled at once each get a consistent snapshot.
"""

from __future__ import annotations

import sys
from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice, takewhile

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
# less more prompts at the full price (docs/architecture.md, "The prompt").
LOG_SHARE = 0.5
DRIFT_SHARE = 0.2
# A held row's cost beyond its text (dict slot, tuple, alias), and a dismissal's (counter slot), as
# tracemalloc measures them (tests/unit/test_prompt_layout.py).
ROW_BYTES = 128
DISMISSAL_BYTES = 48

# What a layout last said of a row: its alias, its type as the log names it, its one-line content.
_Said = tuple[int, str, str]
_USER, _PROJECT = ROW_TYPES[Scope.USER], ROW_TYPES[Scope.PROJECT]
# The type of a row the log says is gone, without a content: the row keeps its alias, should it come
# back, and a cut can tell the log's lines about it.
_GONE = ""


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
        user.extend(ordered, {})
        return user

    def alias(self, row_id: int, held: Mapping[int, int]) -> int:
        """The alias the row `held` in the layout, else a new one."""
        if (alias := held.get(row_id)) is None:
            alias, self.next_alias = self.next_alias, self.next_alias + 1
        return alias

    def extend(self, ordered: Sequence[Shown], held: Mapping[int, int]) -> None:
        """Append the USER rows of `ordered` it does not list yet."""
        for row_id, scope, _, content in ordered:
            if scope == Scope.USER and row_id not in self.rows:
                self.rows[row_id] = (self.alias(row_id, held), _USER, one_line(content))

    def blocks(self) -> list[str]:
        return listed(USER_ROWS, [(alias, content) for alias, _, content in self.rows.values()])

    def cut(
        self,
        project_key: str | None,
        ordered: Sequence[Shown],
        lines: list[str],
        kept: Mapping[int, str | None] | None,
    ) -> dict[int, int]:
        """Cut the prompt before its first line that may not stay, so that what follows is listed
        again: under a new removal mark (`kept` given), a line of a row whose words may be deleted
        ones (`_doubtful`); a dismissal no longer in `lines`. In the USER block, the project's
        blocks are then listed afresh (and the USER rows after the cut with them); past it,
        `_ProjectLayout.cut`. The aliases the rows held, so that a row listed again keeps its own."""
        layout = self.layout if self.project_key == project_key else None
        held = _aliases(self, layout)
        doubtful = set() if kept is None else _doubtful(self, layout, ordered, kept)
        at = _first(self.rows, doubtful)
        if at is not None:
            self.rows = dict(islice(self.rows.items(), at))
        if at is not None or layout is None:
            self.layout = None
        else:
            layout.cut(self, ordered, lines, doubtful, held)
        return held

    def footprint(self) -> int:
        """Bytes held, estimated from above: a string the layout shares is counted each time."""
        texts = [text for _, _, text in self.rows.values()]
        rows, dismissals = len(self.rows), 0
        if (layout := self.layout) is not None:
            texts += [text for _, _, text in layout.rows.values()]
            texts += [said[2] for said in layout.said.values() if said[1] != _GONE]
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
    said: dict[int, _Said] = field(default_factory=dict)  # the log's last word on a row
    log: str = ""  # its lines, one string: a string per line would cost as much again

    @classmethod
    def fresh(
        cls, user: _UserBlock, ordered: Sequence[Shown], dismissed: list[str], held: Mapping[int, int]
    ) -> _ProjectLayout:
        """The user's USER block extended, the project's rows of `ordered` and the negative list as
        frozen blocks, each row under the alias it `held`, else a new one after the USER block's."""
        user.extend(ordered, held)
        layout = cls({}, [], Counter(), 0)
        layout.relist(user, ordered, dismissed, held)
        return layout

    def relist(
        self, user: _UserBlock, ordered: Sequence[Shown], dismissed: list[str], held: Mapping[int, int]
    ) -> None:
        """The project's rows of `ordered` appended to the PROJECT block, the Dismissed block's
        lines followed by the rest of `dismissed`, and no log."""
        for row_id, scope, _, content in ordered:
            if scope == Scope.PROJECT and row_id not in self.rows:
                self.rows[row_id] = (user.alias(row_id, held), _PROJECT, one_line(content))
        rest = Counter(dismissed) - Counter(self.listed_dismissed)
        for fact in dismissed:
            if rest[fact] > 0:
                rest[fact] -= 1
                self.listed_dismissed.append(fact)
        self.dismissed, self.said, self.log = Counter(self.listed_dismissed), {}, ""
        self.frozen_chars = sum(map(len, (*user.blocks(), *self.blocks())))

    def blocks(self) -> list[str]:
        return [
            *listed(PROJECT_ROWS, [(alias, content) for alias, _, content in self.rows.values()]),
            *listed(DISMISSED, [(DISMISSED_MARK, line) for line in self.listed_dismissed]),
        ]

    def retracted(self, dismissed: list[str]) -> bool:
        """Whether a dismissal listed is no longer in `dismissed` (a log cannot take it back)."""
        wanted = Counter(dismissed)
        return any(wanted[fact] < count for fact, count in self.dismissed.items())

    def extend(
        self, user: _UserBlock, ordered: Sequence[Shown], dismissed: list[str], held: Mapping[int, int]
    ) -> dict[int, Shown]:
        """Append what the blocks and the log do not say yet of `ordered` and `dismissed` (none of
        it `retracted`), a row new to them under the alias it `held`, else a new one; the aliases
        of `ordered`'s rows."""
        aliases: dict[int, Shown] = {}
        present: set[int] = set()
        changed: list[str] = []
        for shown in ordered:
            row_id, scope, _, content = shown
            present.add(row_id)
            kind, text = ROW_TYPES[scope], one_line(content)
            said = self._said(user, row_id)
            if said is None:
                said = (user.alias(row_id, held), kind, text)
            elif said[1] != kind or said[2] != text:  # a row back from gone keeps its alias
                said = (said[0], kind, text)
            else:
                aliases[said[0]] = shown
                continue
            self.said[row_id] = said
            changed.append(f"{said[0]}\t{kind}\t{text}")
            aliases[said[0]] = shown
        gone: list[int] = []
        for row_id in {*user.rows, *self.rows, *self.said} - present:
            if (said := self._said(user, row_id)) is not None and said[1] != _GONE:
                self.said[row_id] = (said[0], _GONE, "")
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

    def cut(
        self,
        user: _UserBlock,
        ordered: Sequence[Shown],
        lines: list[str],
        doubtful: set[int],
        held: Mapping[int, int],
    ) -> None:
        """`_UserBlock.cut` past the USER block: at a row of the PROJECT block, the project's rows
        after it and the Dismissed block are listed again; at a dismissal, the dismissals after it;
        either way with no log. In the log, the lines after it are dropped."""
        wanted = Counter(lines)
        if (at := _first(self.rows, doubtful)) is not None:
            self.rows, self.listed_dismissed = dict(islice(self.rows.items(), at)), []
        elif (at := _first_unwanted(self.listed_dismissed, wanted)) is not None:
            self.listed_dismissed = self.listed_dismissed[:at]
        else:
            self._cut_log(held, wanted, doubtful)
            return
        self.relist(user, ordered, lines, held)

    def _cut_log(self, held: Mapping[int, int], wanted: Counter[str], doubtful: set[int]) -> None:
        """Drop the log's lines from the first of a `doubtful` row or of a dismissal not `wanted`;
        what the lines kept say is what the log says."""
        row_of = {alias: row_id for row_id, alias in held.items()}
        counted = Counter(self.listed_dismissed)

        def stays(line: str) -> bool:
            alias, _, rest = line.partition("\t")
            if alias != DISMISSED_MARK:
                return row_of[int(alias)] not in doubtful
            counted[rest] += 1
            return counted[rest] <= wanted[rest]

        log = self.log.split("\n") if self.log else []
        kept = list(takewhile(stays, log))
        if len(kept) == len(log):
            return
        self.said, self.dismissed = {}, Counter(self.listed_dismissed)
        for line in kept:
            alias, _, rest = line.partition("\t")
            if alias == DISMISSED_MARK:
                self.dismissed[rest] += 1
            else:
                kind, _, text = rest.partition("\t")
                self.said[row_of[int(alias)]] = (int(alias), kind or _GONE, text)
        self.log = "\n".join(kept)

    def memories(self, user: _UserBlock) -> tuple[str, ...]:
        log = [block(CHANGES, [self.log])] if self.log else []
        return (*user.blocks(), *self.blocks(), *log)

    def _said(self, user: _UserBlock, row_id: int) -> _Said | None:
        if row_id in self.said:
            return self.said[row_id]
        said = self.rows.get(row_id)
        return user.rows.get(row_id) if said is None else said


def _first(rows: dict[int, _Said], doubtful: set[int]) -> int | None:
    """The position of the first of `rows` that is `doubtful`; None when none is."""
    return next((at for at, row_id in enumerate(rows) if row_id in doubtful), None)


def _first_unwanted(facts: list[str], wanted: Counter[str]) -> int | None:
    """The position of the first of `facts` past what `wanted` lists of it; None when none is."""
    counted: Counter[str] = Counter()
    for at, fact in enumerate(facts):
        counted[fact] += 1
        if counted[fact] > wanted[fact]:
            return at
    return None


def _aliases(user: _UserBlock, layout: _ProjectLayout | None) -> dict[int, int]:
    """The alias of every row the blocks and the log name: a row keeps one in a layout."""
    said = (*user.rows.items(), *(() if layout is None else (*layout.rows.items(), *layout.said.items())))
    return {row_id: alias for row_id, (alias, _, _) in said}


def _held_texts(user: _UserBlock, layout: _ProjectLayout | None) -> dict[int, set[str]]:
    """What the blocks and the log say of each row they name, by row id."""
    said: dict[int, set[str]] = {row_id: {text} for row_id, (_, _, text) in user.rows.items()}
    if layout is None:
        return said
    for row_id, (_, kind, text) in (*layout.rows.items(), *layout.said.items()):
        said.setdefault(row_id, set()).update([text] if kind != _GONE else [])
    row_of = {alias: row_id for row_id, alias in _aliases(user, layout).items()}
    for line in layout.log.split("\n") if layout.log else []:
        alias, tab, rest = line.partition("\t")
        if alias != DISMISSED_MARK and tab:
            said[row_of[int(alias)]].add(rest.partition("\t")[2])
    return said


def _doubtful(
    user: _UserBlock, layout: _ProjectLayout | None, ordered: Sequence[Shown], kept: Mapping[int, str | None]
) -> set[int]:
    """The rows a prompt held from before a removal names whose words may be deleted ones: a row a
    line of which says other words than the row holds now (in `ordered`, or stored as `kept` says;
    deleted words may be the same), unless it was merged away with its trail unerased (`kept`'s
    None); a row neither in `ordered` nor `kept`; and any row a line of which says one of those
    words."""
    said = _held_texts(user, layout)
    now = {row_id: one_line(text) for row_id, text in kept.items() if text is not None}
    now |= {row_id: one_line(text) for row_id, _, _, text in ordered}
    stale = {
        row_id: texts - {now.get(row_id)}
        for row_id, texts in said.items()
        if row_id in now or row_id not in kept
    }
    words = set().union(*stale.values())
    return {row_id for row_id, texts in stale.items() if texts} | {
        row_id for row_id, texts in said.items() if not texts.isdisjoint(words)
    }


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
        kept: Mapping[int, str | None] | None = None,
    ) -> LaidOut:
        """The prompt memories of a comparison set (`rows`, and `dismissed` newest first, read under
        the removal `mark`), extending the user's held layout where it is of the same project and
        its log stays in bounds. A layout held under another mark is cut before its first line that
        may say deleted words (`_doubtful`; `kept`: those of `unsure` whose words the database still
        holds, read after `rows`)."""
        if self._limit == 0:
            existing = ComparisonSet.of(rows, dismissed)
            return LaidOut(existing, tuple(memory_blocks(existing)))
        ordered, lines = in_layout_order(rows), dismissed_lines(dismissed)
        user = self._users.get(user_id)
        if user is not None and (mark is None or user.mark is None):
            user = None  # an erasure's: any word it lists may be one erased
        if user is not None:
            self._users.move_to_end(user_id)
            layout = user.layout if user.project_key == project_key else None
            held: dict[int, int] = {}
            if user.mark != mark or (layout is not None and layout.retracted(lines)):
                held = user.cut(project_key, ordered, lines, (kept or {}) if user.mark != mark else None)
                user.mark, layout = mark, user.layout
            if layout is not None:
                aliases = layout.extend(user, ordered, lines, held)
                if len(layout.log) <= self._log_share * layout.frozen_chars:
                    return self._held(user_id, user, layout, aliases, dismissed)
            layout = _ProjectLayout.fresh(user, ordered, lines, held)
            aliases = layout.extend(user, ordered, lines, held)  # what changed in the USER block
            present = {row_id for row_id, *_ in ordered}
            gone = sum(len(text) for row_id, (_, _, text) in user.rows.items() if row_id not in present)
            if len(layout.log) + gone <= self._drift_share * layout.frozen_chars:
                user.project_key, user.layout = project_key, layout
                return self._held(user_id, user, layout, aliases, dismissed)
        user = _UserBlock.fresh(ordered, project_key, mark)
        user.layout = layout = _ProjectLayout.fresh(user, ordered, lines, {})
        aliases = layout.extend(user, ordered, lines, {})  # appends nothing: all is listed afresh
        self._users[user_id] = user
        self._users.move_to_end(user_id)
        return self._held(user_id, user, layout, aliases, dismissed)

    def unsure(
        self, user_id: int, project_key: str | None, rows: Iterable[Shown], mark: int | None
    ) -> list[int]:
        """The rows the user's held layout lists that are no longer in `rows`, when it was built under
        a removal mark other than `mark`: their words may be deleted ones, unless the database still
        holds them (`build`'s `kept`)."""
        user = self._users.get(user_id)
        if user is None or mark is None or user.mark in (None, mark):
            return []
        said = _held_texts(user, user.layout if user.project_key == project_key else None)
        return sorted(said.keys() - {shown[0] for shown in rows})

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
