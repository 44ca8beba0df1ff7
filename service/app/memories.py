"""The user's own memory operations (seed 5.3, D3, D4, D7, D12) and the injection lookup (5.2)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import structlog

from service.adapters.db.database import Database, UnitOfWork
from service.app.caches import CaptureSwitch
from service.core.budget import ExtractionBudget
from service.core.injection_prompt import MemoryHint, injected, prompt_section
from service.core.model import (
    INJECT_PROJECT_LIMIT,
    INJECT_USER_LIMIT,
    MAX_ACTIVE_PER_USER,
    USER_GROUP,
    DismissedBy,
    Group,
    Scope,
    Source,
    Status,
)
from service.core.normalize import dedup_hash, identity
from service.core.overflow import demoted_for_room
from service.core.project_keys import RobotKeys
from service.core.records import HistoryAction, HistoryActor, HistoryEntry, ItemRecord, ListFilter

log = structlog.get_logger(__name__)


class RuleBroken(Exception):
    """A rule the request broke; the HTTP layer maps each subclass to its status and code."""


class NotFound(RuleBroken):
    """No such memory for this user: another user's memory is indistinguishable from none (D4)."""


class Duplicate(RuleBroken):
    """MEMORY_CONTENT_DUPLICATE: the user already has this content in this scope."""


class LimitExceeded(RuleBroken):
    """MEMORY_LIMIT_EXCEEDED: the user already has 200 ACTIVE memories (D7)."""


@dataclass(frozen=True, slots=True)
class Page:
    items: list[ItemRecord]
    total: int
    page: int
    page_size: int


@dataclass(frozen=True, slots=True)
class Injection:
    memories: list[MemoryHint]
    prompt: str


def _rejects_demotion(item: ItemRecord, status: Status) -> bool:
    """The user dismisses a row D14 demoted for room: their rejection replaces the demotion, so
    no extraction restores the fact again (D3)."""
    return status is Status.DISMISSED and demoted_for_room(item.dismissed_by)


async def _lineage(uow: UnitOfWork, user_id: int, row_id: int) -> set[int]:
    """The row and every row whose text it was built from: the rows merged into one of its texts,
    and theirs in turn (an update or an edit keeps the earlier text in the row's own history).
    Texts match by their dedup identity: a merge folded into a row that says the same fact keeps
    the model's wording, which may differ from the row's in what the identity folds (width, case
    forms, spacing)."""
    links: list[tuple[int, str]] | None = None
    found, frontier = {row_id}, {row_id}
    while frontier:
        texts = {identity(text) for text in await uow.memories.history_texts(user_id, frontier)}
        if links is None:
            links = await uow.memories.merge_links(user_id)
        frontier = {memory_id for memory_id, merged in links if identity(merged) in texts} - found
        found |= frontier
    return found


def _user_entry(action: HistoryAction, old: str | None = None, new: str | None = None) -> HistoryEntry:
    return HistoryEntry(action=action, actor=HistoryActor.USER, old_content=old, new_content=new)


class MemoryService:
    def __init__(self, db: Database, capture: CaptureSwitch, robot_keys: RobotKeys) -> None:
        self._db = db
        self._capture = capture
        self._robot_keys = robot_keys

    async def page(self, user_id: int, where: ListFilter, page: int, page_size: int) -> Page:
        async with self._db.read() as uow:
            total = await uow.memories.count(user_id, where)
            items = await uow.memories.page(user_id, where, (page - 1) * page_size, page_size)
        return Page(items, total, page, page_size)

    async def create(self, user_id: int, scope: Scope, content: str, project_key: str | None) -> ItemRecord:
        group = Group(Scope.PROJECT, project_key or "") if scope is Scope.PROJECT else USER_GROUP
        digest = dedup_hash(group.scope, group.project_key, content)
        async with self._db.locked_user(user_id) as uow:
            clash = (await uow.memories.by_hashes(user_id, [digest])).get(digest)
            # The user's own words may bring back any row D14 demoted, even one they edited since.
            if clash is not None and not demoted_for_room(clash.dismissed_by):
                raise Duplicate
            # The manual path keeps its explicit error; only automatic writes demote (D14).
            if await uow.memories.active_count(user_id) >= MAX_ACTIVE_PER_USER:
                raise LimitExceeded
            now = self._db.now()
            if clash is None:
                row_id = await uow.memories.insert(user_id, group, content, digest, Source.MANUAL, None, now)
                await uow.memories.record(
                    user_id, row_id, _user_entry(HistoryAction.CREATE, new=content), now
                )
            else:
                # A fact demoted for lack of room, typed again: the same row comes back, in the
                # user's words and theirs from now on.
                row_id = clash.id
                await uow.memories.set_status(user_id, row_id, Status.ACTIVE, now)
                await uow.memories.update_content(user_id, row_id, content, digest, now, source=Source.MANUAL)
                await uow.memories.record(
                    user_id, row_id, _user_entry(HistoryAction.RESTORE, clash.content, content), now
                )
            item = await uow.memories.get(user_id, row_id)
            await uow.commit()
        assert item is not None
        return item

    async def get(self, user_id: int, row_id: int) -> ItemRecord:
        """One of the user's memories; another user's id is NotFound, like an unknown one (D4)."""
        async with self._db.read() as uow:
            item = await uow.memories.get(user_id, row_id)
        if item is None:
            raise NotFound
        return item

    async def edit(self, user_id: int, row_id: int, content: str | None, status: Status | None) -> ItemRecord:
        async with self._db.locked_user(user_id) as uow:
            item = await uow.memories.get(user_id, row_id)
            if item is None:
                raise NotFound
            if content is not None and content != item.content:
                await self._edit_content(uow, user_id, item, content)
            if status is not None and (status is not item.status or _rejects_demotion(item, status)):
                await self._set_status(uow, user_id, item, status)
            updated = await uow.memories.get(user_id, row_id)
            await uow.commit()
        assert updated is not None
        return updated

    async def _edit_content(self, uow: UnitOfWork, user_id: int, item: ItemRecord, content: str) -> None:
        digest = dedup_hash(item.scope, item.project_key, content)
        clash = (await uow.memories.by_hashes(user_id, [digest])).get(digest)
        if clash is not None and clash.id != item.id:
            raise Duplicate
        now = self._db.now()
        # D12: an edit keeps the status. Edited words are the user's own, so an AUTO or
        # CONSOLIDATED row becomes MANUAL and leaves the model's comparison set for good.
        await uow.memories.update_content(user_id, item.id, content, digest, now, source=Source.MANUAL)
        await uow.memories.record(
            user_id, item.id, _user_entry(HistoryAction.EDIT, item.content, content), now
        )

    async def _set_status(self, uow: UnitOfWork, user_id: int, item: ItemRecord, status: Status) -> None:
        if status is Status.ACTIVE and await uow.memories.active_count(user_id) >= MAX_ACTIVE_PER_USER:
            raise LimitExceeded
        now = self._db.now()
        await uow.memories.set_status(user_id, item.id, status, now, DismissedBy.USER)
        action = HistoryAction.RESTORE if status is Status.ACTIVE else HistoryAction.DISMISS
        await uow.memories.record(user_id, item.id, _user_entry(action, old=item.content), now)

    async def delete(self, user_id: int, row_id: int) -> None:
        """Physical (D3): a later extraction of the same fact may insert it again. The words go with
        the row: its history, and that of the rows it was merged from, keep what happened and when,
        never a text (`erase_history`)."""
        async with self._db.locked_user(user_id) as uow:
            item = await uow.memories.get(user_id, row_id)
            if item is None:
                raise NotFound
            now = self._db.now()
            lineage = await _lineage(uow, user_id, row_id)
            await uow.memories.delete(user_id, row_id)
            await uow.memories.record(user_id, row_id, _user_entry(HistoryAction.DELETE), now)
            await uow.memories.erase_history(user_id, lineage, now)
            await uow.accounts.words_removed(user_id)  # held prompt layouts list them no more
            await uow.commit()

    async def history(self, user_id: int, row_id: int) -> list[Any]:
        """Still answers after a delete: the trail outlives the row, for its owner only."""
        async with self._db.read() as uow:
            rows = await uow.memories.history_of(user_id, row_id)
        if not rows:
            raise NotFound
        return rows

    async def capture_enabled(self, user_id: int) -> bool:
        async with self._db.read() as uow:
            return await uow.accounts.capture_enabled(user_id)

    async def set_capture(self, user_id: int, enabled: bool) -> bool:
        async with self._db.transaction() as uow:
            await uow.accounts.set_capture(user_id, enabled, self._db.now())
            await uow.commit()
        self._capture.invalidate(user_id)
        log.info("auto_capture_changed", user_id=user_id, enabled=enabled)
        return enabled

    async def extractions_last_day(self, user_id: int) -> int:
        """What the extraction budget counts for the user now."""
        async with self._db.read() as uow:
            since = ExtractionBudget.window_start(self._db.now())
            return await uow.accounts.extractions_since(user_id, since)

    async def projects(self, user_id: int) -> list[str]:
        async with self._db.read() as uow:
            keys = set(await uow.accounts.seen_projects(user_id)) | set(
                await uow.memories.project_keys(user_id)
            )
        return sorted(k for k in keys if k and not self._robot_keys.matches(k))

    async def injection(self, user_id: int, project_key: str | None) -> Injection:
        """PROJECT top 12 then USER top 8, ACTIVE only, newest first: one indexed query per scope."""
        async with self._db.read() as uow:
            window = await uow.memories.injection_window(
                user_id, project_key, INJECT_PROJECT_LIMIT, INJECT_USER_LIMIT
            )
        hints = injected(MemoryHint(scope, key or None, content) for scope, key, content in window)
        return Injection(hints, prompt_section(hints))
