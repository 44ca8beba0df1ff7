"""The `task.finished` handler: filters → comparison set → model → decide → persist, in seed 5.6 order."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

import structlog

from service.adapters.db.database import Database, UnitOfWork
from service.adapters.db.errors import is_transient
from service.adapters.db.extraction_reads import ExtractionInputs
from service.adapters.metrics import Metrics
from service.app.caches import CaptureSwitch, ProjectRecorder
from service.app.ports import AnswerShape, FailureClass, Llm, LlmAnswer, LlmError, StructuredOutput
from service.app.user_turns import UserTurns
from service.config import Settings
from service.core.backoff import Backoff
from service.core.budget import ExtractionBudget
from service.core.comparison_set import ComparisonSet
from service.core.events import TaskFinishedEvent
from service.core.extraction_answer import AnswerError, ParsedAnswer, parse_extraction_answer
from service.core.extraction_prompt import ANSWER_SCHEMA, extraction_messages
from service.core.filters import Skip, input_skip, trigger_skip
from service.core.labels import LlmPurpose, LlmResult
from service.core.model import DismissedBy, Source, Status
from service.core.model_rejections import rejection_kind
from service.core.outcomes import SKIP_OUTCOMES, Outcome
from service.core.persist_plan import (
    Demote,
    Insert,
    Plan,
    PoolState,
    Restore,
    Touch,
    Update,
    decide,
)
from service.core.pool_read import pool_query
from service.core.prompt_layout import PromptLayouts
from service.core.records import HistoryAction, HistoryActor, HistoryEntry

log = structlog.get_logger(__name__)

# A write the database refused for a while is tried again 0.5 s, doubling, at most 30 s apart.
WRITE_BACKOFF = Backoff(0.5, cap=30.0, jitter=1.0)


class ModelUnavailable(Exception):
    """The model timed out, was rate-limited, failed or unreachable: the event stays unfinished
    (no ledger row, offset not committed) and is tried again later. `kind` is the client's failure
    label (timeout, error, …), the error of a `model_failed` dead letter; `failure` its class
    (an OUTAGE never counts against the event)."""

    def __init__(
        self,
        kind: str,
        detail: str,
        failure: FailureClass = FailureClass.EVENT,
        overtaken: bool = False,
        timed_out: bool = False,
    ) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.failure = failure
        self.overtaken = overtaken  # a later call was answered while this one was out
        self.timed_out = timed_out  # our own deadline passed (a 408 is the provider's answer)


class ModelRejected(Exception):
    """The provider refused the request (a 4xx other than 429): a setting to fix, not an outage.
    The event goes to the dead-letter topic with the provider's message, to be replayed; logs get
    `safe` (`LlmError.safe`) instead, as the message may quote the conversation."""

    def __init__(self, detail: str, safe: str) -> None:
        super().__init__(detail)
        self.safe = safe


@dataclass(frozen=True, slots=True)
class Extracted:
    """What one extraction persisted; consolidation (D15) runs only when `added` > 0 (rows made
    ACTIVE that were not: inserts and restores)."""

    user_id: int
    project_key: str | None
    model: str
    added: int
    active_after: int  # the user's ACTIVE rows when the extraction committed


@dataclass(frozen=True, slots=True)
class ExtractionSlots:
    """Two bounds, so that a model slot is never spent waiting on the database.

    `model`: MEMORY_MAX_IN_FLIGHT model calls at once, the scarce resource of a latency-bound
    stream. `database`: extractions' reads and write transactions at once, sized to the pools they
    draw from (`MEMORY_DATABASE_POOL_SIZE`), so a burst queues here rather than on a pool's timeout.
    Skips take neither, so they never queue behind model calls.
    """

    model: asyncio.Semaphore
    database: asyncio.Semaphore

    @classmethod
    def of(cls, model_calls: int, database_work: int) -> ExtractionSlots:
        return cls(asyncio.Semaphore(model_calls), asyncio.Semaphore(database_work))


class ExtractionHandler:
    def __init__(
        self,
        db: Database,
        llm: Llm,
        metrics: Metrics,
        settings: Settings,
        capture: CaptureSwitch,
        projects: ProjectRecorder,
        slots: ExtractionSlots,
    ) -> None:
        self._db = db
        self._llm = llm
        self._metrics = metrics
        self._settings = settings
        self._capture = capture
        self._projects = projects
        self._slots = slots
        self._shape = AnswerShape("memories", ANSWER_SCHEMA, settings.llm_max_tokens)
        self._budget = ExtractionBudget(settings.extractions_per_user_per_day)
        self._turns = UserTurns()
        self._layouts = PromptLayouts(
            settings.llm_prompt_layouts, budget_bytes=int(settings.llm_prompt_layouts_mib * (1 << 20))
        )
        # Per user with an event waiting for the budget to settle: set when an extraction finishes.
        self._finished: dict[int, asyncio.Event] = {}

    async def warm(self, user_ids: Iterable[int]) -> None:
        """Read the capture switch of a fetched batch's users at once: the skip path's only lookup."""
        await self._capture.warm(user_ids)

    def outcome_without_io(self, event: TaskFinishedEvent) -> Outcome | None:
        """The skip path decided from the event and warm caches alone, or None when I/O is needed."""
        project_key = self._settings.robot_keys.project(event.project_key)
        if project_key and not self._projects.known(event.user_id, project_key):
            return None
        skip = trigger_skip(event)
        if skip is None:
            capture = self._capture.cached(event.user_id)
            if capture is None:
                return None
            skip = input_skip(event) if capture else Skip.CAPTURE_OFF
        if skip is not None:
            return SKIP_OUTCOMES[skip]
        return self._refused(event.user_id, self._db.now())

    async def handle(self, event: TaskFinishedEvent) -> tuple[Outcome, Extracted | None]:
        project_key = self._settings.robot_keys.project(event.project_key)
        if project_key:
            # Events of every phase feed the project list, not only the ones that are extracted.
            await self._projects.remember(event.user_id, project_key)
        # Seed 5.6's order: the trigger conditions (D2, D6, the switch of D9), then the inputs (D8, D11).
        skip = trigger_skip(event)
        if skip is None:
            skip = input_skip(event) if await self._capture.enabled(event.user_id) else Skip.CAPTURE_OFF
        if skip is not None:
            return SKIP_OUTCOMES[skip], None
        return await self._extract(event, project_key)

    async def _extract(
        self, event: TaskFinishedEvent, project_key: str | None
    ) -> tuple[Outcome, Extracted | None]:
        now = self._db.now()
        user = event.user_id
        if self._refused(user, now) is not None:
            return Outcome.SKIPPED_BUDGET, None
        read, admitted = await self._read_round(event, project_key, now)
        while not read.processed and not admitted and self._budget.allows(read.recent_extractions):
            # Refused only for extractions this process has in flight, which may fail, or for rows
            # committed during the read, which its count may already hold: a refusal skips the
            # event for good, so it waits for them to settle and counts again.
            await self._settled(user)
            read, admitted = await self._read_round(event, project_key, now)
        if read.processed:
            return Outcome.SKIPPED_DUPLICATE_EVENT, None
        if not admitted:
            self._budget.remember_refusal(user, read.recent_extractions, read.oldest_extraction, now)
            self._told(user, now)
            return Outcome.SKIPPED_BUDGET, None
        recorded = False
        try:
            outcome, extracted, recorded = await self._admitted(event, project_key, read)
        finally:
            self._budget.finish(user, recorded)
            if (finished := self._finished.pop(user, None)) is not None:
                finished.set()
        return outcome, extracted

    async def _read_round(
        self, event: TaskFinishedEvent, project_key: str | None, now: datetime
    ) -> tuple[ExtractionInputs, bool]:
        """The read round, and whether the budget admitted the event (one extraction reserved)."""
        mark = self._budget.read_started(event.user_id)
        try:
            async with self._slots.database:
                read = await self._inputs(event, project_key, now)
            return read, not read.processed and self._budget.admit(
                event.user_id, read.recent_extractions, mark
            )
        finally:
            self._budget.read_ended(event.user_id)

    async def _settled(self, user_id: int) -> None:
        """Until one of the user's admitted extractions finishes; at once when none is running (the
        rows recorded during the last read are committed: the next read counts them once)."""
        if self._budget.running(user_id):
            await self._finished.setdefault(user_id, asyncio.Event()).wait()

    def _refused(self, user_id: int, now: datetime) -> Outcome | None:
        """SKIPPED_BUDGET while a refusal read from the ledger holds: no read round for the user."""
        if not self._budget.refused(user_id, now):
            return None
        self._told(user_id, now)
        return Outcome.SKIPPED_BUDGET

    def _told(self, user_id: int, now: datetime) -> None:
        if self._budget.first_refusal(user_id, now):
            log.info("extraction_budget_spent", user_id=user_id, per_day=self._budget.per_day)

    async def _admitted(
        self, event: TaskFinishedEvent, project_key: str | None, read: ExtractionInputs
    ) -> tuple[Outcome, Extracted | None, bool]:
        """The model call and the writes of an event the budget admitted; the flag: whether this
        call committed the event's ledger row."""
        model = read.configured_model or self._settings.default_model
        unsure = self._layouts.unsure(event.user_id, project_key, read.shown, read.removal_mark)
        laid = self._layouts.build(
            event.user_id,
            project_key,
            read.shown,
            read.user_dismissed,
            read.removal_mark,
            await self._worded(event.user_id, unsure),
        )
        existing = laid.existing

        # One decision for the prompt and the request: the mode may be restored while the call waits.
        mode = self._llm.mode(model)
        messages = extraction_messages(
            event.last_user_message or "",
            event.last_assistant_message or "",
            project_key,
            laid.memories,
            mode is not StructuredOutput.OFF,
            self._settings.llm_conversation_tokens,
        )
        try:
            async with self._slots.model:
                answer = await self._llm.complete(
                    LlmPurpose.EXTRACTION, model, messages, self._shape, caller=event.event_id, mode=mode
                )
        except LlmError as exc:
            log.warning("extraction_llm_failed", event_id=event.event_id, error=exc.safe)
            if exc.retryable:
                raise ModelUnavailable(
                    exc.kind,
                    exc.safe,
                    exc.failure,
                    overtaken=exc.overtaken,
                    timed_out=exc.kind == "timeout" and exc.status is None,
                ) from exc
            await self._count_rejection(model, exc, _private(event, laid.memories))
            raise ModelRejected(exc.detail, exc.safe) from exc

        usable, result = _read_answer(answer)
        self._metrics.llm_calls.labels(LlmPurpose.EXTRACTION, result).inc()
        if usable is None:
            log.info("extraction_answer_dropped", event_id=event.event_id, reason=result)
        plan = await self._persist_until_written(event, project_key, model, existing, usable)
        if isinstance(plan, Outcome):
            return plan, None, False
        if usable is None:
            return Outcome.FAILED, None, True  # the model answered, but nothing usable: no memory
        extracted = Extracted(event.user_id, project_key, model, plan.added, plan.active_after)
        return Outcome.EXTRACTED, extracted, True

    async def _count_rejection(self, model: str, error: LlmError, private: list[str]) -> None:
        """The admin page's tally of `model_rejected` dead letters (`core.model_rejections`), without
        a quote of the `private` texts the request carried. Only an indication: a database that
        cannot count it must not keep the event off the DLQ."""
        try:
            async with self._db.transaction() as uow:
                kind = rejection_kind(error.status)
                now = self._db.now()
                await uow.accounts.count_model_rejection(model, kind, error.detail, now, private)
                await uow.commit()
        except Exception as exc:
            log.warning(
                "model_rejection_not_counted", model=model, error=f"{type(exc).__name__}: {exc}"[:300]
            )

    async def _inputs(
        self, event: TaskFinishedEvent, project_key: str | None, now: datetime
    ) -> ExtractionInputs:
        """The ledger check, the D10 model, the budget's count and the comparison set in one round
        trip. 10.1: should the comparison part fail, extraction goes on with exact hashing only."""
        since = self._budget.window_start(now)
        try:
            async with self._db.prepared_read() as uow:
                return await uow.memories.extraction_inputs(
                    event.event_id, event.user_id, project_key, self._settings.negative_list_max, since
                )
        except Exception as exc:
            if is_transient(exc):
                raise
            log.warning("comparison_set_failed", user_id=event.user_id, error=str(exc))
        async with self._db.read() as uow:
            processed, configured = await uow.accounts.processed_and_model(event.event_id)
            recent = await uow.accounts.extractions_since(event.user_id, since)
        return ExtractionInputs(processed, configured, recent, [], [])

    async def _worded(self, user_id: int, unsure: list[int]) -> dict[int, str | None]:
        """Of the rows a layout held from before a delete lists and the read round no longer shows,
        those whose words the database still holds, with their stored text (read after the round:
        every erasure its removal mark stands for is seen); none when it cannot tell, and the
        layout is cut at the first."""
        if not unsure:
            return {}
        try:
            async with self._slots.database, self._db.read() as uow:
                return await uow.memories.worded(user_id, unsure)
        except Exception as exc:
            log.warning("worded_rows_failed", user_id=user_id, error=type(exc).__name__)
            return {}

    async def _persist_until_written(
        self,
        event: TaskFinishedEvent,
        project_key: str | None,
        model: str,
        existing: ComparisonSet,
        answer: ParsedAnswer | None,
    ) -> Plan | Outcome:
        """`_persist`, tried again while the database is out (a failover, a read-only server): the
        model's answer is kept, so a database outage costs no model call, however long it lasts.
        The event's offset waits meanwhile, as it would for any outage."""
        waits = WRITE_BACKOFF.delays(random.random)
        while True:
            try:
                return await self._persist(event, project_key, model, existing, answer)
            except Exception as exc:
                if not is_transient(exc):
                    raise
                delay = next(waits)
                self._metrics.db_retries.inc()
                log.warning(
                    "extraction_write_retry", event_id=event.event_id, error=type(exc).__name__, delay=delay
                )
            await asyncio.sleep(delay)

    async def _persist(
        self,
        event: TaskFinishedEvent,
        project_key: str | None,
        model: str,
        existing: ComparisonSet,
        answer: ParsedAnswer | None,
    ) -> Plan | Outcome:
        """Ledger row and memory writes in one transaction under the user's lock; the skip, with
        nothing written, if the event is already done or capture went off while the model answered.
        `answer` None: the model answered something unusable; the event is finished without memory.

        The ledger row is written only while the switch is on, read again under the lock, because a
        user's erasure (`UserEraser`) deletes it under the same lock: an extraction that persists
        after the erasure leaves nothing of the user (the rollback takes even the lock row back).
        """
        outcome = Outcome.EXTRACTED if answer is not None else Outcome.FAILED
        user = event.user_id
        async with (
            self._turns.turn(user),
            self._slots.database,
            self._db.prepared_locked_user(user) as uow,
        ):
            now = self._db.now()
            ledger_row = (event.event_id, user, event.session_id, outcome.value, now)
            skipped = await uow.accounts.mark_processed_while_capturing(*ledger_row)
            if skipped is not None:
                return skipped
            plan = Plan()
            if answer is not None and answer.candidates:
                candidates = answer.candidates
                query = pool_query(candidates, existing, project_key)
                read = await uow.memories.pool(event.user_id, project_key, query)
                state = PoolState.of(read.rows, project_key, query.hashes, read.active_count)
                plan = decide(candidates, existing, project_key, state)
                await self._apply(uow, plan, event, model, now)
            await uow.commit()
        if answer is not None:
            for candidate, result in zip(answer.candidates, plan.results, strict=True):
                self._metrics.candidates.labels(candidate.action.value, result.value).inc()
            self._metrics.demotions.inc(plan.demoted)
        return plan

    async def _apply(
        self, uow: UnitOfWork, plan: Plan, event: TaskFinishedEvent, model: str, now: datetime
    ) -> None:
        user = event.user_id

        def traced(action: HistoryAction, old: str | None = None, new: str | None = None) -> HistoryEntry:
            return HistoryEntry(action, HistoryActor.AUTO, old, new, event.event_id, event.session_id, model)

        for op in plan.ops:
            if isinstance(op, Insert):
                row_id = await uow.memories.insert(
                    user, op.group, op.content, op.dedup_hash, Source.AUTO, event.session_id, now
                )
                entry = traced(HistoryAction.INSERT, new=op.content)
            elif isinstance(op, Touch):
                row_id = op.row_id
                await uow.memories.touch(user, row_id, now)
                entry = traced(HistoryAction.TOUCH)
            elif isinstance(op, Update):
                row_id = op.row_id
                await uow.memories.update_content(user, row_id, op.new_content, op.new_hash, now)
                entry = traced(HistoryAction.UPDATE, op.old_content, op.new_content)
            elif isinstance(op, Restore):
                row_id = op.row_id
                await uow.memories.set_status(user, row_id, Status.ACTIVE, now)
                entry = traced(HistoryAction.RESTORE, old=op.content)
            else:
                assert isinstance(op, Demote)
                row_id = op.row_id
                # D14: a soft demotion, restored when the fact comes back or by the user.
                await uow.memories.set_status(user, row_id, Status.DISMISSED, now, DismissedBy.CAPACITY)
                entry = traced(HistoryAction.DEMOTE, old=op.content)
            await uow.memories.record(user, row_id, entry, now)


def _private(event: TaskFinishedEvent, memories: Sequence[str]) -> list[str]:
    """The user's texts an extraction request carries: the conversation and every memory its blocks
    list (a held layout's blocks still list rows that have since left), the text after a line's last
    tab."""
    said = [event.last_user_message or "", event.last_assistant_message or ""]
    listed = [line.rpartition("\t")[2] for b in memories for line in b.split("\n") if "\t" in line]
    return [*said, *listed]


def _read_answer(answer: LlmAnswer) -> tuple[ParsedAnswer | None, LlmResult]:
    """The parsed answer and its `llm_calls` result label; None when unusable. An answer cut at the
    token cap is its own result: its JSON is incomplete, and asking again would cut it again."""
    if answer.truncated:
        return None, LlmResult.TRUNCATED
    parsed = parse_extraction_answer(answer.text)
    if isinstance(parsed, AnswerError):
        return None, LlmResult(parsed.value)
    return parsed, LlmResult.OK
