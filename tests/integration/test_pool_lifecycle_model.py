"""A stateful model of a user's pool (issue 39). Hypothesis interleaves the user's actions (create,
edit, dismiss, restore, delete, switch capture) with the machine's: extractions whose answers insert,
touch and update any id shown (MANUAL, another group's) or none, with blank, invisible, duplicate and
oversize texts, on a pool seeded near the cap (and holding facts demoted for room) so that new
facts overflow; events hours or a day apart under a budget of two extractions a day, two of them
at once, the first failing or not; consolidation plans that merge, keep and drop over rows the user
changes while the model answers; retention runs, a year later or not, with a delete arriving
mid-scan; the model's answer format falling back (after a restart) and coming back while a call
waits. It drives the real `MemoryService`, `ExtractionHandler`, `Consolidator` and `RetentionJob`
over the scripted model on SQLite and on MariaDB, and after every step checks the invariants of
docs/decisions.md ("The pool's invariants") against a plain-Python reference
(`tests/support/pool_model.py`).

`MEMORY_FUZZ_EXAMPLES` sets the example count (10 here); `make faults` runs 150, without shrinking.
A failure prints the example it was first found at.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import sys
from collections.abc import Awaitable, Callable, Hashable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.errors import HypothesisException
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from pydantic import ValidationError

from service.adapters.db.database import Database
from service.adapters.db.engine import build_engine, upgrade_schema
from service.adapters.db.extraction_reads import ExtractionInputs
from service.adapters.db.retention_repository import RetentionRepository
from service.adapters.db.tables import memory_event_ledger, memory_history, memory_item
from service.adapters.llm_client import MODE_RETRY_S, AnswerShape, LlmAnswer, LlmClient, StructuredOutput
from service.adapters.metrics import Metrics
from service.app.caches import CaptureSwitch, ProjectRecorder
from service.app.consolidation import Consolidator
from service.app.erasure import UserEraser
from service.app.extraction import (
    Extracted,
    ExtractionHandler,
    ExtractionSlots,
    ModelRejected,
    ModelUnavailable,
)
from service.app.memories import MemoryService, RuleBroken
from service.app.retention import Horizons, RetentionJob
from service.config import Settings
from service.core.consolidation import Thresholds
from service.core.events import TaskFinishedEvent
from service.core.model import MAX_ACTIVE_PER_USER, USER_GROUP, DismissedBy, Group, Scope, Source, Status
from service.core.normalize import dedup_hash, identity
from service.core.outcomes import Outcome
from service.core.project_keys import RobotKeys
from service.entrypoints.http.api_models import CreateUserMemory, PatchMemory
from tests.conftest import said
from tests.integration.conftest import make_event
from tests.support.clock import ManualClock
from tests.support.pool import seed as seed_row
from tests.support.pool import seed_many, set_capture
from tests.support.pool_model import (
    Budget,
    PlanOp,
    consolidation_answer,
    extraction_answer,
    formatted,
    replay,
)
from tests.support.processes import MariaDbDatabase
from tests.support.scripted_llm import Request, ScriptedLlm

DEFAULT_EXAMPLES = 10
EXAMPLES = int(os.environ.get("MEMORY_FUZZ_EXAMPLES", str(DEFAULT_EXAMPLES)))
MODEL = "openai/scripted-default"
PROJECT = "p1"
FILLERS = 199  # the pool starts one below the cap: the second new fact demotes the oldest
DEMOTED = ["d0", "d1", "d2"]  # facts demoted for room before the run (D14), older than the fillers
BUDGET = 2  # extractions a user a day: small, so that a run reaches it and the day moves on
HORIZONS = Horizons(ledger=timedelta(days=30), deleted_history=timedelta(days=365))
TEXTS = [
    "f0",
    "f1",
    "f2",
    "新事实甲",
    "新事实乙",
    "\u3164",
    "\u115f\u2800\ufe0f",
    " ",
    "x" * 121,
    "F0",
    "ｆ０",
]
texts = st.sampled_from(TEXTS)
fresh = st.integers(0, 9).map("新事实{}".format)  # new facts: each one past the cap demotes a row
# How long after the step before an event comes: the budget's window moves on, by a day at the most.
later = st.sampled_from([0, 8, 24, 24]).map(lambda hours: timedelta(hours=hours))
picks = st.integers(0, 23)  # the newest eight rows, the oldest eight (overflow's victims), the DISMISSED
_users = itertools.count(9_000_000_000 + os.getpid() * 10_000)


def answer_items() -> st.SearchStrategy[list[dict[str, Any]]]:
    kind = st.sampled_from(["user", "project"])
    insert = st.builds(lambda k, c: {"type": k, "content": c}, kind, texts | fresh)
    ref = st.builds(
        lambda k, a, alias, c: {"type": k, "action": a, "existingId": alias, "content": c},
        kind,
        st.sampled_from(["touch", "update"]),
        st.integers(0, 40) | st.just(10**6),  # an id of the prompt's, or one it never showed
        texts,
    )
    return st.lists(st.one_of(insert, insert, ref), max_size=3)  # new facts twice as often: overflow


def plans() -> st.SearchStrategy[list[PlanOp]]:
    """Ops over distinct rows shown (the oldest and the newest, changed the latest): a merge takes
    two or three of them, a keep or a drop one."""
    kinds = st.lists(st.sampled_from(["merge", "merge3", "keep", "drop"]), min_size=1, max_size=3)
    rows = st.lists(st.integers(-5, 4), min_size=9, max_size=9, unique=True)
    return st.builds(_plan, kinds, rows, st.lists(texts, min_size=3, max_size=3))


def _plan(kinds: list[str], rows: list[int], contents: list[str]) -> list[PlanOp]:
    ops, taken = [], iter(rows)
    for kind, content in zip(kinds, contents, strict=False):
        if kind.startswith("merge"):
            size = 3 if kind == "merge3" else 2
            ops.append(PlanOp("merge", tuple(next(taken) for _ in range(size)), content))
        else:
            ops.append(PlanOp(kind, (next(taken),)))
    return ops


def _failed(error: BaseException | None) -> bool:
    """An example's own failure, not hypothesis ending or discarding it."""
    return isinstance(error, Exception) and not isinstance(error, HypothesisException)


class Gate:
    """The real client, with one thing done after the prompt is built and before the request goes out
    (`before`), or after the model answered and before the caller sees it (`after`)."""

    def __init__(self, llm: LlmClient) -> None:
        self.llm = llm
        self.before: Callable[[], Awaitable[None]] | None = None
        self.after: Callable[[], Awaitable[None]] | None = None

    def mode(self, model: str) -> StructuredOutput:
        return self.llm.mode(model)

    async def complete(
        self,
        purpose: str,
        model: str,
        messages: list[dict[str, str]],
        shape: AnswerShape,
        wait: bool = True,
        *,
        caller: Hashable | None = None,
        mode: StructuredOutput | None = None,
    ) -> LlmAnswer:
        if (before := self.before) is not None:
            self.before = None
            await before()
        answer = await self.llm.complete(purpose, model, messages, shape, wait, caller=caller, mode=mode)
        if (after := self.after) is not None:
            self.after = None
            await after()
        return answer


class PoolMachine(RuleBasedStateMachine):
    """One user's pool per example; the reference is what the user did and what the plans said."""

    loop: asyncio.AbstractEventLoop
    db: Database
    clock: ManualClock
    llm: ScriptedLlm

    examples = 0
    first_failure: int | None = None  # the example that failed first, before any shrinking

    def __init__(self) -> None:
        super().__init__()
        PoolMachine.examples += 1
        self.user = next(_users)
        self.service = MemoryService(self.db, CaptureSwitch(self.db, 0), RobotKeys())
        self._start()
        self.answer: list[dict[str, Any]] = []
        self.plan: list[PlanOp] = []
        self.shown: list[tuple[str, list[dict[str, Any]]]] = []  # each group's rows the model saw
        self.seeded: dict[int, tuple[str, str]] = {}  # rows seeded without history: (status, content)
        self.known: set[int] = set()
        self.manual: dict[int, tuple[str, str]] = {}  # the user's own rows: (content, status)
        self.rejected: set[int] = set()  # the user dismissed these (D3)
        self.deleted: dict[int, datetime] = {}  # by the user, when
        self.merged_away: set[int] = set()  # removed by a consolidation plan that kept their fact
        self.capture = True
        self.budget = Budget(BUDGET)  # the extractions admitted, by when
        self.sessions = itertools.count(1)
        self.llm.responder = self._respond

    def _start(self) -> None:
        """The service's process: a model client that has answered in no mode yet, and handlers with
        nothing in flight or remembered (a restart starts them anew)."""
        self.client = LlmClient(
            Metrics(),
            self.llm.api_base,
            None,
            timeout_s=10,
            max_retries=1,
            retry_base_s=0.01,
            structured_output=StructuredOutput.JSON_OBJECT,
        )
        self.gate = Gate(self.client)
        settings_ = Settings(
            _env_file=None, default_model=MODEL, capture_cache_ttl_s=0, extractions_per_user_per_day=BUDGET
        )
        capture, projects = CaptureSwitch(self.db, 0), ProjectRecorder(self.db)
        slots = ExtractionSlots.of(2, 2)
        self.handler = ExtractionHandler(self.db, self.gate, Metrics(), settings_, capture, projects, slots)
        limits = Thresholds(1, 1, 1, cooldown=timedelta(0), retry_after=timedelta(0))
        self.consolidator = Consolidator(self.db, self.gate, Metrics(), limits)

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def _respond(self, request: Request) -> str:
        if "You consolidate" in request.text:
            answer, shown = consolidation_answer(request, self.plan)
            self.shown.append((request.data["group"], shown))
            return answer
        return extraction_answer(request, self.answer)

    def teardown(self) -> None:
        """The user erased whole: retention scans every user, and would slow down with each example.
        Run as the example ends, failed or not: a failure is the exception then on its way out."""
        failure = sys.exc_info()[1]
        if PoolMachine.first_failure is None and _failed(failure):
            PoolMachine.first_failure = PoolMachine.examples
        self.run(self.client.stop())
        self.run(UserEraser(self.db, Metrics()).erase(self.user))

    @initialize()
    def seed(self) -> None:
        self.run(set_capture(self.db, self.user))
        for content in DEMOTED:
            demoted = seed_row(
                self.db,
                self.user,
                content,
                status=Status.DISMISSED,
                age_minutes=FILLERS + 1,
                dismissed_by=DismissedBy.CAPACITY,
            )
            self.seeded[self.run(demoted)] = ("DISMISSED", content)
        ids = self.run(seed_many(self.db, self.user, [f"f{i}" for i in range(FILLERS)]))
        self.seeded |= {i: ("ACTIVE", f"f{n}") for n, i in enumerate(ids)}
        self.known |= set(self.seeded)

    # The user's actions, through the API's own validation of what was typed.

    @rule(content=texts)
    def create(self, content: str) -> None:
        try:
            typed = CreateUserMemory.model_validate({"scope": "USER", "content": content}).content
            item = self.run(self.service.create(self.user, Scope.USER, typed, None))
        except (ValidationError, RuleBroken):
            return
        self.manual[item.id] = (item.content, item.status.value)
        self.rejected.discard(item.id)
        self.known.add(item.id)

    @rule(pick=picks, content=texts)
    def edit(self, pick: int, content: str) -> None:
        self.run(self._user_change(pick, content=content))

    @rule(pick=picks | st.integers(16, 23), status=st.sampled_from([Status.ACTIVE, Status.DISMISSED]))
    def set_status(self, pick: int, status: Status) -> None:
        self.run(self._user_change(pick, status=status))

    @rule(pick=st.integers(0, 7))
    def dismiss_demoted(self, pick: int) -> None:
        """The user dismisses a fact the pool holds demoted for room (D14): from then on it is
        their rejection, which no extraction revives (D3)."""
        rows = self.run(self._rows())
        demoted = sorted(i for i, r in rows.items() if r.dismissed_by == DismissedBy.CAPACITY.value)
        if demoted:
            self.run(self._change(demoted[pick % len(demoted)], None, Status.DISMISSED))

    @rule(pick=picks)
    def delete(self, pick: int) -> None:
        self.run(self._delete(pick))

    @rule(enabled=st.booleans())
    def switch_capture(self, enabled: bool) -> None:
        self.capture = self.run(self.service.set_capture(self.user, enabled))

    async def _pick(self, pick: int) -> int | None:
        rows = await self._rows()
        alive = sorted(rows)
        dismissed = [i for i in alive if rows[i].status == "DISMISSED"]
        if pick >= 16 and dismissed:
            return dismissed[pick % len(dismissed)]
        return (alive[-1 - pick % 8] if pick % 2 else alive[pick % 8]) if alive else None

    async def _user_change(self, pick: int, content: str | None = None, status: Status | None = None) -> None:
        row_id = await self._pick(pick)
        if row_id is not None:
            await self._change(row_id, content, status)

    async def _change(self, row_id: int, content: str | None, status: Status | None) -> None:
        try:
            patch = {"content": content} if content is not None else {"status": status}
            typed = PatchMemory.model_validate(patch).content
            item = await self.service.edit(self.user, row_id, typed, status)
        except (ValidationError, RuleBroken):
            return
        if status is Status.DISMISSED:
            self.rejected.add(row_id)
        elif status is Status.ACTIVE:
            self.rejected.discard(row_id)
        if item.source is Source.MANUAL:
            self.manual[row_id] = (item.content, item.status.value)

    async def _delete(self, pick: int) -> None:
        row_id = await self._pick(pick)
        if row_id is None:
            return
        await self.service.delete(self.user, row_id)
        self.deleted[row_id] = self.db.now()
        self.manual.pop(row_id, None)
        self.rejected.discard(row_id)

    # The machine's actions.

    @rule(answer=answer_items(), in_project=st.booleans(), restored_meanwhile=st.booleans(), after=later)
    def extract(
        self, answer: list[dict[str, Any]], in_project: bool, restored_meanwhile: bool, after: timedelta
    ) -> None:
        self._extract(answer, in_project, after, restored_meanwhile=restored_meanwhile)

    @rule(
        pick=st.integers(16, 23),
        kind=st.sampled_from(["user", "project"]),
        rejected=st.booleans(),
        restored_meanwhile=st.booleans(),
        after=later,
    )
    def restate_dismissed(
        self, pick: int, kind: str, rejected: bool, restored_meanwhile: bool, after: timedelta
    ) -> None:
        """The model states a fact again that the pool holds dismissed: one the user rejected (D3:
        never revived), or any, perhaps demoted for room (D14: restored)."""
        rows = self.run(self._rows())
        if rejected:
            ids = sorted(self.rejected & rows.keys())
            row_id = ids[pick % len(ids)] if ids else None
        else:
            row_id = self.run(self._pick(pick))
        if row_id is None or rows[row_id].status != "DISMISSED":
            return
        in_project = rows[row_id].scope == "PROJECT"
        restated = [{"type": "project" if in_project else kind, "content": rows[row_id].content}]
        self._extract(restated, in_project, after, restored_meanwhile=restored_meanwhile)

    @rule(answer=answer_items(), after=later, restarted=st.booleans())
    def extract_in_outage(self, answer: list[dict[str, Any]], after: timedelta, restarted: bool) -> None:
        """Every structured request answered 503 (a model loading), just after the service restarted
        or not: a mode never answered falls back to none; one answered before is kept, and the event
        waits for the model (retried later). The budget holds across the restart, by the ledger."""
        if restarted:
            self.run(self.client.stop())
            self._start()
        self._extract(answer, False, after, outage=True)

    def _extract(
        self,
        answer: list[dict[str, Any]],
        in_project: bool,
        after: timedelta,
        outage: bool = False,
        restored_meanwhile: bool = False,
    ) -> None:
        """An event `after` the step before; `restored_meanwhile`: the structured-output mode left
        after an outage is due back while the event waits, after its prompt was built."""
        self.clock.advance(after)

        async def restored() -> None:
            self.client._mode_retry_s = 0

        self.gate.before = restored if restored_meanwhile else None
        try:
            self._extract_once(answer, in_project, outage)
        finally:
            self.gate.before = None
            self.client._mode_retry_s = MODE_RETRY_S

    def _extract_once(self, answer: list[dict[str, Any]], in_project: bool, outage: bool) -> None:
        self.answer = answer
        before = self.run(self._rows())
        event = make_event(
            self.user,
            next(self.sessions),
            lastUserMessage=said(f"pool{self.user}"),
            projectKey=PROJECT if in_project else None,
        )
        down = self.llm.script(f"pool{self.user}", status=503, only_if=formatted) if outage else None
        try:
            outcome, _ = self.run(self.handler.handle(event))
        except ModelUnavailable:
            assert down is not None and self.run(self._rows()) == before, "a failed call wrote"
            self.llm.remove(down)
            down = None
            outcome, _ = self.run(self.handler.handle(event))  # redelivered once the model is back
        finally:
            if down is not None:
                self.llm.remove(down)
        self._settle(outcome)
        if not self.capture:
            assert self.run(self._rows()) == before, "an extraction wrote with capture off"

    def _settle(self, outcome: Outcome | None) -> None:
        """An event's outcome against the reference's, its extraction counted; None: its model call
        failed, and no extraction was made."""
        now = self.db.now()
        if not self.capture:
            assert outcome is Outcome.SKIPPED_CAPTURE_OFF, outcome
        elif self.budget.admits(now):
            spent = self.budget.spent(now)
            assert outcome is not Outcome.SKIPPED_BUDGET, (
                f"refused with {spent} of {self.budget.per_day} extractions in 24 hours: skipped for good"
            )
            # Every answer is well-formed JSON in the format asked for: none may be lost (defect 4).
            assert outcome in (Outcome.EXTRACTED, None), outcome
            if outcome is not None:
                self.budget.extracted(now)
        else:
            assert outcome is Outcome.SKIPPED_BUDGET, f"admitted past the budget: {outcome}"

    @rule(answer=answer_items(), first_fails=st.booleans(), after=later)
    def extract_while_another_waits(
        self, answer: list[dict[str, Any]], first_fails: bool, after: timedelta
    ) -> None:
        """Two of the user's events at once: the second's read round runs while the first waits for
        the model, which then fails or answers. The budget refuses the second only if the day's
        extractions fill it, the first's among them only if it was made."""
        self._two_events(answer, first_fails, after, as_first_ends=False)

    @rule(answer=answer_items(), first_fails=st.booleans(), after=later)
    def extract_as_another_commits(
        self, answer: list[dict[str, Any]], first_fails: bool, after: timedelta
    ) -> None:
        """Two of the user's events at once: the second's read round begins before the first, which
        fails or answers, commits its ledger row, and counts after it. The budget counts that row
        once."""
        self._two_events(answer, first_fails, after, as_first_ends=True)

    def _two_events(
        self, answer: list[dict[str, Any]], first_fails: bool, after: timedelta, as_first_ends: bool
    ) -> None:
        self.clock.advance(after)
        self.answer = answer
        first, second = (
            make_event(self.user, next(self.sessions), lastUserMessage=said(f"{marker}{self.user}"))
            for marker in ("first", "pool")
        )
        failing = self.llm.script(f"first{self.user}", status=400) if first_fails else None
        try:
            outcomes = self.run(self._two_at_once(first, second, as_first_ends, first_fails))
        finally:
            if failing is not None:
                self.llm.remove(failing)
        for outcome in outcomes:
            self._settle(outcome)

    async def _two_at_once(
        self, first: TaskFinishedEvent, second: TaskFinishedEvent, as_first_ends: bool, first_fails: bool
    ) -> tuple[Outcome | None, Outcome]:
        """Both outcomes, the first None if its model call failed. The second starts once the first is
        admitted and about to call the model (or after it, if it never is)."""
        handler = self.handler
        first_over, reading, waiting = asyncio.Event(), asyncio.Event(), asyncio.Event()
        inputs, settled = handler._inputs, handler._settled
        started: list[asyncio.Future[Any]] = []

        async def reads_once_the_first_is_over(
            event: TaskFinishedEvent, project_key: str | None, now: datetime
        ) -> ExtractionInputs:
            handler._inputs = inputs  # type: ignore[method-assign]
            reading.set()
            await first_over.wait()
            return await inputs(event, project_key, now)

        async def waits_for_the_first(user_id: int) -> None:
            waiting.set()
            await settled(user_id)

        async def meanwhile() -> None:
            if as_first_ends:
                handler._inputs = reads_once_the_first_is_over  # type: ignore[method-assign]
            started.append(asyncio.ensure_future(handler.handle(second)))
            # Until the second is over, or reads (its round begun), or waits for the first to finish.
            signal: asyncio.Future[Any] = asyncio.ensure_future(
                (reading if as_first_ends else waiting).wait()
            )
            await asyncio.wait({started[0], signal}, return_when=asyncio.FIRST_COMPLETED)
            signal.cancel()

        async def first_outcome() -> Outcome | None:
            try:
                return (await handler.handle(first))[0]
            except (ModelRejected, ModelUnavailable):
                if not first_fails:
                    raise
                return None
            finally:
                first_over.set()

        handler._settled = waits_for_the_first  # type: ignore[method-assign]
        self.gate.before = meanwhile
        try:
            outcome = await first_outcome()
            then = started[0] if started else handler.handle(second)
            return outcome, (await then)[0]
        finally:
            self.gate.before = None
            handler._inputs, handler._settled = inputs, settled  # type: ignore[method-assign]

    @rule(
        plan=plans(),
        in_project=st.booleans(),
        meanwhile=st.sampled_from(["nothing", "edit", "dismiss", "delete"]),
        pick=picks,
        content=texts,
    )
    def consolidate(
        self, plan: list[PlanOp], in_project: bool, meanwhile: str, pick: int, content: str
    ) -> None:
        """A plan over the rows shown, applied after the user changed one of them (or not)."""

        async def change() -> None:
            if meanwhile == "delete":
                await self._delete(pick)
            elif meanwhile != "nothing":
                dismiss = Status.DISMISSED if meanwhile == "dismiss" else None
                await self._user_change(pick, content=content if dismiss is None else None, status=dismiss)

        self.plan, self.shown = plan, []
        self.gate.after = change
        before = self.run(self._rows())
        extracted = Extracted(self.user, PROJECT if in_project else None, MODEL, 1, len(before))
        self.run(self.consolidator.run(extracted))
        self.gate.after = None
        self._check_consolidation(before, self.run(self._rows()))

    def _check_consolidation(self, before: dict[int, Any], after: dict[int, Any]) -> None:
        """D15: only machine-made ACTIVE rows go, each named by its group's plan, its fact kept."""
        removed = set(before) - set(after) - set(self.deleted)
        named: set[int] = set()
        for name, shown in self.shown:
            group = Group(Scope.PROJECT, PROJECT) if name != "user" else USER_GROUP
            by_text = {
                r.content: i
                for i, r in before.items()
                if r.scope == group.scope and r.project_key == group.project_key
            }
            aliases = {r["id"]: by_text.get(r["content"]) for r in shown}
            named |= self._plan_kept_facts(group, aliases, removed, after)
        for row_id in removed:
            row = before[row_id]
            assert row.source != Source.MANUAL.value and row.status == "ACTIVE", f"D15: {row} removed"
            assert row_id in named, f"row {row_id} removed, though no op named it"
        self.merged_away |= removed

    def _plan_kept_facts(
        self, group: Group, aliases: dict[int, int | None], removed: set[int], after: dict[int, Any]
    ) -> set[int]:
        """The rows the plan removes in `group`, having checked that each removed fact lives on:
        a merge's text ACTIVE, a drop beside some other row shown and kept, or a merge."""
        merged = {i for op in self.plan if op.op == "merge" for i in self._ids(op, aliases)}
        dropped = {i for op in self.plan if op.op == "drop" for i in self._ids(op, aliases)}
        for op in self.plan:
            if op.op == "merge" and removed & set(self._ids(op, aliases)):
                digest = dedup_hash(group.scope, group.project_key, op.content or "")
                assert any(r.dedup_hash == digest and r.status == "ACTIVE" for r in after.values())
        if removed & dropped and not removed & merged:
            kept = {i for i in aliases.values() if i is not None} - removed
            assert any(i in after and after[i].status == "ACTIVE" for i in kept), "a drop lost its fact"
        return merged | dropped

    def _ids(self, op: PlanOp, aliases: dict[int, int | None]) -> list[int]:
        ordered = sorted(aliases)
        return [i for p in op.picks if (i := aliases[ordered[p % len(ordered)]]) is not None]

    @rule(a_year_later=st.booleans(), pick=st.none() | picks)
    def retention(self, a_year_later: bool, pick: int | None) -> None:
        """A retention run, a year on or not; `pick`: a row the user deletes while it scans."""
        if a_year_later:
            self.clock.advance(timedelta(days=400))
        live_ids = RetentionRepository.memory_ids
        machine = self

        async def deleted_meanwhile(repo: RetentionRepository, user_id: int) -> list[int]:
            if user_id == machine.user and pick is not None:
                await machine._delete(pick)
            return await live_ids(repo, user_id)

        RetentionRepository.memory_ids = deleted_meanwhile  # type: ignore[method-assign]
        try:
            self.run(RetentionJob(self.db, Metrics(), HORIZONS).run_once())
        finally:
            RetentionRepository.memory_ids = live_ids  # type: ignore[method-assign]

    # The invariants, after every step.

    async def _rows(self) -> dict[int, Any]:
        async with self.db.read() as uow:
            found = await uow.conn.execute(sa.select(memory_item).where(memory_item.c.user_id == self.user))
            return {r.id: r for r in found}

    async def _trails(self) -> dict[int, list[Any]]:
        h = memory_history
        async with self.db.read() as uow:
            found = await uow.conn.execute(sa.select(h).where(h.c.user_id == self.user).order_by(h.c.id))
            trails: dict[int, list[Any]] = {}
            for row in found:
                trails.setdefault(row.memory_id, []).append(row._mapping)
            return trails

    @invariant()
    def rules_hold(self) -> None:
        rows, trails = self.run(self._rows()), self.run(self._trails())
        self.known |= set(rows)
        assert sum(r.status == "ACTIVE" for r in rows.values()) <= MAX_ACTIVE_PER_USER  # D7, D14
        for row_id in self.rejected & rows.keys():  # D3: no machine revives a user's rejection
            assert rows[row_id].status == "DISMISSED", f"D3: rejected row {row_id} is ACTIVE again"
            # Stored as theirs: a reason left at CAPACITY would let the next extraction restore it.
            assert rows[row_id].dismissed_by == DismissedBy.USER.value, f"D3: {row_id} not the user's no"
        for row_id, (content, status) in self.manual.items():  # MANUAL untouched by the machine
            assert row_id in rows, f"MANUAL row {row_id} removed by the machine"
            assert (rows[row_id].content, rows[row_id].status) == (content, status), f"MANUAL {row_id}"
        lost = self.known - rows.keys() - self.deleted.keys() - self.merged_away
        assert not lost, f"facts lost without the user's delete: {lost}"
        for row in rows.values():
            assert identity(row.content), f"blank text stored: {row.content!r}"
            assert row.dedup_hash == dedup_hash(Scope(row.scope), row.project_key, row.content)
        self._replays(rows, trails)

    @invariant()
    def the_budget_holds(self) -> None:
        """The ledger's extractions of the last 24 hours are the ones the reference admitted: never
        more than the budget."""
        now = self.db.now()
        ledger = memory_event_ledger
        since = now - timedelta(hours=24)
        count = sa.select(sa.func.count()).where(
            ledger.c.user_id == self.user, ledger.c.processed_at >= since
        )
        made, spent = self.run(self._scalar(count)), self.budget.spent(now)
        per_day = self.budget.per_day
        assert made == spent <= per_day, f"{made} extractions in 24 hours, {spent} admitted, budget {per_day}"

    async def _scalar(self, query: sa.Select[Any]) -> Any:
        async with self.db.read() as uow:
            return await uow.conn.scalar(query)

    def _replays(self, rows: dict[int, Any], trails: dict[int, list[Any]]) -> None:
        """History replays to the current state; a user's delete keeps its trail for the horizon."""
        for row_id in rows.keys() | trails.keys():
            replayed = replay(trails.get(row_id, []), self.seeded.get(row_id))
            now = rows.get(row_id)
            if now is None:
                assert replayed.state == ("gone", ""), f"history of gone row {row_id} ends {replayed}"
            else:
                assert not replayed.erased, f"live row {row_id} lost its history's words"
                assert replayed.state == (now.status, now.content), f"history of {row_id}: {replayed}"
        horizon = self.db.now() - HORIZONS.deleted_history
        for row_id, at in self.deleted.items():
            if at > horizon:
                trail = trails.get(row_id, [])
                assert trail and trail[-1]["action"] == "delete", f"trail of deleted {row_id} purged"


@pytest.fixture(params=["sqlite", "mysql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[str]:
    """A database of the test's own on each dialect: the machine runs on a loop of its own."""
    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path / 'pool.db'}"
        upgrade_schema(url)
        yield url
        return
    mariadb: MariaDbDatabase = request.getfixturevalue("mariadb")
    yield mariadb.url


@contextlib.contextmanager
def machine_world(database_url: str, llm_server: ScriptedLlm) -> Iterator[None]:
    """The machine's database, clock, model and event loop of its own, for one test."""
    loop = asyncio.new_event_loop()
    db = Database(build_engine(database_url, pool_size=2), clock=ManualClock(datetime(2030, 1, 1)))
    llm_server.reset()
    PoolMachine.loop, PoolMachine.db, PoolMachine.llm = loop, db, llm_server
    PoolMachine.clock = db.clock  # type: ignore[assignment]
    try:
        yield
    finally:
        llm_server.reset()
        loop.run_until_complete(db.dispose())
        loop.close()


def test_the_pool_rules_hold_for_any_interleaving(database_url: str, llm_server: ScriptedLlm) -> None:
    machine = PoolMachine.TestCase
    machine.settings = settings(
        max_examples=EXAMPLES,
        stateful_step_count=20,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        # The larger run reports the first failure as found (with its seed); the default one shrinks it.
        phases=list(Phase) if EXAMPLES <= DEFAULT_EXAMPLES else [Phase.explicit, Phase.reuse, Phase.generate],
    )
    PoolMachine.examples, PoolMachine.first_failure = 0, None
    with machine_world(database_url, llm_server):
        try:
            machine().runTest()
        except BaseException:
            print(
                f"first failing example: {PoolMachine.first_failure} of {EXAMPLES}; examples run, "
                f"shrinks included: {PoolMachine.examples}"
            )
            raise


def test_the_machine_finds_a_demoted_row_the_user_dismissed_revived(
    database_url: str, llm_server: ScriptedLlm
) -> None:
    """Issue 39's first defect as the machine's own steps, whatever the random search draws: two
    new facts demote the oldest filler for room, the user dismisses it, the model states it again."""
    with machine_world(database_url, llm_server):
        machine = PoolMachine()
        try:
            machine.seed()
            new_facts = [{"type": "user", "content": "新事实甲"}, {"type": "user", "content": "新事实乙"}]
            machine.extract(new_facts, in_project=False, restored_meanwhile=False, after=timedelta(0))
            machine.dismiss_demoted(len(DEMOTED))  # the seeded demotions come first, by id
            assert [machine.seeded[i] for i in machine.rejected] == [("ACTIVE", "f0")]
            machine.rules_hold()
            machine.restate_dismissed(16, "user", rejected=True, restored_meanwhile=False, after=timedelta(0))
            machine.rules_hold()
        finally:
            machine.teardown()
