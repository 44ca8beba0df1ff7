"""Consolidation runs (D15): after an extraction committed new rows, off the event's path."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import structlog

from service.adapters.db.database import Database, UnitOfWork, utcnow
from service.adapters.db.memory_repository import HistoryEntry
from service.adapters.llm_client import LlmError
from service.adapters.metrics import Metrics
from service.app.extraction import Extracted, Llm
from service.config import Settings
from service.core.consolidation import (
    ConsolidationPlan,
    InvalidPlan,
    RunResult,
    Thresholds,
    affected_groups,
    below_every_threshold,
    build_consolidation_messages,
    parse_plan,
    should_run,
)
from service.core.model import Group, MemoryRow, Source
from service.core.normalize import dedup_hash

log = structlog.get_logger(__name__)
MAX_CONCURRENT_RUNS = 4


def thresholds(settings: Settings) -> Thresholds:
    return Thresholds(
        active_total=settings.consolidation_active_threshold,
        user_target=settings.consolidation_user_target,
        project_target=settings.consolidation_project_target,
        cooldown=timedelta(hours=settings.consolidation_cooldown_hours),
    )


class Consolidator:
    def __init__(self, db: Database, llm: Llm, metrics: Metrics, limits: Thresholds) -> None:
        self._db = db
        self._llm = llm
        self._metrics = metrics
        self._limits = limits
        self._running: dict[int, asyncio.Task[None]] = {}
        self._slots = asyncio.Semaphore(MAX_CONCURRENT_RUNS)

    def schedule(self, extracted: Extracted) -> None:
        """Fire and forget: the event is already committed and never waits for, or fails with, this."""
        if below_every_threshold(extracted.active_after, self._limits):
            self._metrics.consolidations.labels(RunResult.SKIPPED_THRESHOLD.value).inc()
            return
        if extracted.user_id in self._running:
            return
        task = asyncio.create_task(self._guarded(extracted))
        self._running[extracted.user_id] = task
        task.add_done_callback(lambda _: self._running.pop(extracted.user_id, None))

    async def close(self, grace_s: float) -> None:
        tasks = list(self._running.values())
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=grace_s)
            for task in pending:
                task.cancel()  # its transaction rolls back; the group stays as it was
            await asyncio.gather(*pending, return_exceptions=True)

    async def _guarded(self, extracted: Extracted) -> None:
        async with self._slots:
            try:
                await self.run(extracted)
            except Exception:
                log.exception("consolidation_crashed", user_id=extracted.user_id)
                self._metrics.consolidations.labels(RunResult.ABANDONED_ERROR.value).inc()

    async def run(self, extracted: Extracted) -> list[RunResult]:
        """The three conditions of 10.3, a cooldown claim under the user lock, then one call per group."""
        user, groups = extracted.user_id, affected_groups(extracted.project_key)
        async with self._db.read() as uow:
            total = await uow.memories.active_count(user)
            sizes = {g: await uow.memories.active_in_group(user, g) for g in groups}
            last = await uow.accounts.last_consolidated(user)
        skip = should_run(extracted.inserted, total, sizes, last, utcnow(), self._limits)
        if skip is None and not await self._claim(user):
            skip = RunResult.SKIPPED_COOLDOWN
        if skip is not None:
            self._metrics.consolidations.labels(skip.value).inc()
            return [skip]
        results = [await self._group(user, g, extracted.model) for g in groups]
        for result in results:
            self._metrics.consolidations.labels(result.value).inc()
        return results

    async def _claim(self, user: int) -> bool:
        """The cooldown lives in the database, so it holds across restarts and replicas."""
        async with self._db.locked_user(user) as uow:
            last = await uow.accounts.last_consolidated(user)
            now = utcnow()
            if last is not None and now - last < self._limits.cooldown:
                return False
            await uow.accounts.set_consolidated(user, now)
            await uow.commit()
        return True

    async def _group(self, user: int, group: Group, model: str) -> RunResult:
        plan = await self._plan(user, group, model)
        if isinstance(plan, RunResult):
            return plan
        try:
            await self._apply(user, group, plan, model)
        except InvalidPlan as exc:
            log.info("consolidation_stale", user_id=user, group=str(group), reason=str(exc))
            return RunResult.ABANDONED_INVALID
        except Exception:
            log.exception("consolidation_apply_failed", user_id=user, group=str(group))
            return RunResult.ABANDONED_ERROR
        return RunResult.APPLIED

    async def _plan(self, user: int, group: Group, model: str) -> ConsolidationPlan | RunResult:
        """The model's plan for the group, validated; a result instead when there is nothing to apply."""
        async with self._db.read() as uow:
            rows = await _auto_rows(uow, user, group)
        if len(rows) < 2:
            return RunResult.APPLIED
        messages, aliases = build_consolidation_messages(group, rows)
        try:
            answer = await self._llm.complete("consolidation", model, messages)
            plan = parse_plan(answer.text, aliases)
        except LlmError as exc:
            log.warning("consolidation_llm_failed", user_id=user, group=str(group), error=str(exc))
            return RunResult.ABANDONED_ERROR
        except InvalidPlan as exc:
            self._metrics.llm_calls.labels("consolidation", "invalid_json").inc()
            log.info("consolidation_plan_invalid", user_id=user, group=str(group), reason=str(exc))
            return RunResult.ABANDONED_INVALID
        self._metrics.llm_calls.labels("consolidation", "ok").inc()
        return RunResult.APPLIED if plan.empty else plan

    async def _apply(self, user: int, group: Group, plan: ConsolidationPlan, model: str) -> None:
        """One transaction under the user lock: inserts, then deletes; any failure rolls back all of it."""
        async with self._db.locked_user(user) as uow:
            current = {r.id: r for r in await _auto_rows(uow, user, group)}
            wanted = {i for m in plan.merges for i in m.source_ids} | set(plan.drops)
            if not wanted <= set(current):
                raise InvalidPlan("a source row changed while the model was answering")
            now = utcnow()
            base = HistoryEntry("merge", "consolidator", model=model)
            merged = 0
            for merge in plan.merges:
                digest = dedup_hash(group.scope, group.project_key, merge.content)
                clash = (await uow.memories.by_hashes(user, [digest])).get(digest)
                if clash is not None and clash.id in wanted and clash.id not in merge.source_ids:
                    raise InvalidPlan("a merge restates a row that another operation removes")
                if clash is None:
                    new_id = await uow.memories.insert(
                        user, group, merge.content, digest, Source.CONSOLIDATED, None, now
                    )
                    await uow.memories.record(user, new_id, _with(base, new=merge.content), now)
                # A clash means the merged fact already has a row: the sources go in its favour.
                for source in merge.source_ids:
                    if clash is not None and source == clash.id:
                        continue
                    await uow.memories.delete(user, source)
                    await uow.memories.record(
                        user, source, _with(base, current[source].content, merge.content), now
                    )
                    merged += 1
            for row_id in plan.drops:
                await uow.memories.delete(user, row_id)
                entry = HistoryEntry("drop", "consolidator", old_content=current[row_id].content, model=model)
                await uow.memories.record(user, row_id, entry, now)
            await uow.commit()
        self._metrics.consolidated_rows.labels("merged").inc(merged)
        self._metrics.consolidated_rows.labels("dropped").inc(len(plan.drops))


def _with(base: HistoryEntry, old: str | None = None, new: str | None = None) -> HistoryEntry:
    return HistoryEntry(base.action, base.actor, old_content=old, new_content=new, model=base.model)


async def _auto_rows(uow: UnitOfWork, user: int, group: Group) -> list[MemoryRow]:
    """MANUAL and DISMISSED rows are never shown to, or changed by, consolidation (10.3)."""
    rows = await uow.memories.auto_active_in_groups(user, group.project_key or None)
    return sorted((r for r in rows if r.group == group), key=lambda r: (r.updated_at, r.id))
