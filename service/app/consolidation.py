"""Consolidation runs (D15): after an extraction committed new rows, off the event's path."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

import structlog

from service.adapters.db.database import Database, UnitOfWork
from service.adapters.metrics import Metrics
from service.app.extraction import Extracted
from service.app.ports import AnswerShape, Llm, LlmError, StructuredOutput
from service.config import Settings
from service.core.consolidation import (
    ANSWER_SCHEMA,
    ConsolidationPlan,
    InvalidPlan,
    RunResult,
    Thresholds,
    below_every_threshold,
    build_consolidation_messages,
    parse_plan,
    should_run,
)
from service.core.consolidation_ops import (
    Abandon,
    Drop,
    GroupState,
    InsertMerged,
    MergeAway,
    Op,
    RestoreMerged,
    decide,
    merged_hashes,
)
from service.core.labels import ConsolidatedOp, LlmPurpose, LlmResult
from service.core.model import Group, MemoryRow, Source, Status, session_groups
from service.core.records import HistoryAction, HistoryActor, HistoryEntry

log = structlog.get_logger(__name__)
MAX_CONCURRENT_RUNS = 4


def thresholds(settings: Settings) -> Thresholds:
    return Thresholds(
        active_total=settings.consolidation_active_threshold,
        user_target=settings.consolidation_user_target,
        project_target=settings.consolidation_project_target,
        cooldown=timedelta(hours=settings.consolidation_cooldown_hours),
        retry_after=timedelta(minutes=settings.consolidation_retry_minutes),
    )


class Consolidator:
    def __init__(
        self, db: Database, llm: Llm, metrics: Metrics, limits: Thresholds, max_tokens: int = 8192
    ) -> None:
        self._shape = AnswerShape("operations", ANSWER_SCHEMA, max_tokens)
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
        """The three conditions of 10.3; a cooldown claimed under the user lock only when a call will
        be made; one call per group holding at least two machine-made rows."""
        user, groups = extracted.user_id, session_groups(extracted.project_key)
        async with self._db.read() as uow:
            total = await uow.memories.active_count(user)
            sizes = {g: await uow.memories.active_in_group(user, g) for g in groups}
            due = await uow.accounts.consolidation_due(user)
            trigger = should_run(extracted.added, total, sizes, due, self._db.now(), self._limits)
            inputs = {g: await _machine_rows(uow, user, g) for g in groups} if trigger.run else {}
        skip = trigger.reason
        inputs = {g: rows for g, rows in inputs.items() if len(rows) >= 2}
        if skip is None and not inputs:
            skip = RunResult.SKIPPED_NOTHING_TO_MERGE
        if skip is None and not await self._claim(user, self._limits.cooldown):
            skip = RunResult.SKIPPED_COOLDOWN
        if skip is not None:
            self._metrics.consolidations.labels(skip.value).inc()
            return [skip]
        runs = [await self._group(user, g, rows, extracted.model) for g, rows in inputs.items()]
        if not any(answered for _, answered in runs):
            # No call got an answer: try again after the shorter back-off, not a whole cooldown.
            await self._claim(user, self._limits.retry_after, force=True)
        for result, _ in runs:
            self._metrics.consolidations.labels(result.value).inc()
        return [result for result, _ in runs]

    async def _claim(self, user: int, wait: timedelta, force: bool = False) -> bool:
        """The due time lives in the database, so it holds across restarts and replicas. A user left
        without ACTIVE rows meanwhile (erased) gets no claim: its lock row would outlive the erasure."""
        async with self._db.locked_user(user) as uow:
            now = self._db.now()
            due = await uow.accounts.consolidation_due(user)
            if not force and due is not None and now < due:
                return False
            if await uow.memories.active_count(user) == 0:
                return False  # rolled back, the lock row with it
            await uow.accounts.set_consolidation_due(user, now + wait)
            await uow.commit()
        return True

    async def _group(
        self, user: int, group: Group, rows: list[MemoryRow], model: str
    ) -> tuple[RunResult, bool]:
        """The group's result, and whether the model answered at all."""
        mode = self._llm.mode(model)
        messages, aliases = build_consolidation_messages(group, rows, mode is not StructuredOutput.OFF)
        try:
            # Never waits for a closed breaker: an outage makes this run fail and back off instead.
            answer = await self._llm.complete(
                LlmPurpose.CONSOLIDATION,
                model,
                messages,
                self._shape,
                wait=False,
                caller=("consolidation", user),
                mode=mode,
            )
        except LlmError as exc:
            log.warning("consolidation_llm_failed", user_id=user, group=str(group), error=exc.safe)
            return RunResult.ABANDONED_ERROR, False
        return await self._plan_and_apply(user, group, rows, aliases, answer.text, model), True

    async def _plan_and_apply(
        self, user: int, group: Group, rows: list[MemoryRow], aliases: dict[int, int], answer: str, model: str
    ) -> RunResult:
        try:
            plan = parse_plan(answer, aliases)
        except InvalidPlan as exc:
            self._metrics.llm_calls.labels(LlmPurpose.CONSOLIDATION, LlmResult.INVALID_JSON).inc()
            log.info("consolidation_plan_invalid", user_id=user, group=str(group), reason=str(exc))
            return RunResult.ABANDONED_INVALID
        self._metrics.llm_calls.labels(LlmPurpose.CONSOLIDATION, LlmResult.OK).inc()
        if plan.empty:
            return RunResult.APPLIED
        try:
            return await self._apply(user, group, {r.id: r for r in rows}, plan, model)
        except Exception:
            log.exception("consolidation_apply_failed", user_id=user, group=str(group))
            return RunResult.ABANDONED_ERROR

    async def _apply(
        self, user: int, group: Group, shown: dict[int, MemoryRow], plan: ConsolidationPlan, model: str
    ) -> RunResult:
        """One transaction under the user lock: the group read again, `decide`, its ops applied in
        order; an abandoned plan or any failure writes nothing."""
        async with self._db.locked_user(user) as uow:
            state = GroupState(
                {r.id: r for r in await uow.memories.machine_active_in_group(user, group)},
                await uow.memories.by_hashes(user, merged_hashes(plan, group)),
            )
            ops = decide(plan, group, shown, state)
            if isinstance(ops, Abandon):
                log.info(
                    "consolidation_abandoned",
                    user_id=user,
                    group=str(group),
                    result=ops.result.value,
                    reason=ops.reason,
                )
                return ops.result
            now = self._db.now()
            for op in ops:
                await _write(uow, user, op, model, now)
            await uow.commit()
        self._metrics.consolidated_rows.labels(ConsolidatedOp.MERGED).inc(
            sum(isinstance(op, MergeAway) for op in ops)
        )
        self._metrics.consolidated_rows.labels(ConsolidatedOp.DROPPED).inc(
            sum(isinstance(op, Drop) for op in ops)
        )
        return RunResult.APPLIED


ACTOR = HistoryActor.CONSOLIDATOR


async def _write(uow: UnitOfWork, user: int, op: Op, model: str, now: datetime) -> None:
    """One op of `decide` and its history row."""
    if isinstance(op, InsertMerged):
        row_id = await uow.memories.insert(
            user, op.group, op.content, op.dedup_hash, Source.CONSOLIDATED, None, now
        )
        entry = HistoryEntry(HistoryAction.MERGE, ACTOR, new_content=op.content, model=model)
    elif isinstance(op, RestoreMerged):
        row_id = op.row_id
        await uow.memories.set_status(user, row_id, Status.ACTIVE, now)
        entry = HistoryEntry(HistoryAction.RESTORE, ACTOR, old_content=op.content, model=model)
    elif isinstance(op, MergeAway):
        row_id = op.row_id
        await uow.memories.delete(user, row_id)
        entry = HistoryEntry(HistoryAction.MERGE, ACTOR, op.old_content, op.merged_content, model=model)
    else:
        row_id = op.row_id
        await uow.memories.delete(user, row_id)
        entry = HistoryEntry(HistoryAction.DROP, ACTOR, old_content=op.content, model=model)
    await uow.memories.record(user, row_id, entry, now)


async def _machine_rows(uow: UnitOfWork, user: int, group: Group) -> list[MemoryRow]:
    """Machine-made ACTIVE rows of the group: MANUAL and DISMISSED rows are never shown to, or
    changed by, consolidation (10.3); merged rows are merged again like any other."""
    rows = await uow.memories.machine_active_in_group(user, group)
    return sorted(rows, key=lambda r: (r.updated_at, r.id))
