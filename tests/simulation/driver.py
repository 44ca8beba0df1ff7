"""A simulated year: users, their conversations and their own edits, against the real service.

The handler, the consolidator and the HTTP API run as in production, over a real database and the
real litellm path to a scripted OpenAI-compatible server whose answers come from `SimModel`. Time
comes from a hand-moved clock. Users run side by side, one step each per round; after every step
the pool is checked (`PoolWatch`). Two months before the year's end an admin switches the extraction
model (D10), and at the end the admin reads each model's quality figures.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from collections.abc import Awaitable, Callable, Hashable
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import httpx

from service.adapters.db.database import Database
from service.adapters.llm_client import AnswerShape, LlmAnswer, LlmClient, StructuredOutput
from service.adapters.metrics import Metrics
from service.app.consolidation import Consolidator
from service.app.extraction import ExtractionHandler
from service.app.retention import Horizons, RetentionJob
from service.core.consolidation import RunResult
from service.core.events import TaskFinishedEvent
from service.core.model import USER_GROUP, Group, Scope
from service.core.model_quality import Rejection
from service.core.outcomes import Outcome
from service.entrypoints.tokens import ADMIN_PERMISSION, READ_PERMISSION
from tests.simulation.checker import Made, Offered, Row, UserRejection, fact_key, identity_key
from tests.simulation.model import STYLES, conversation, wording
from tests.simulation.prompts import PromptFigure, PromptFigures
from tests.simulation.watch import PoolWatch
from tests.support.clock import ManualClock
from tests.support.prompt_data import prompt_data
from tests.support.tokens import bearer, token

START = datetime(2027, 1, 1)
SKIPPED = {RunResult.SKIPPED_THRESHOLD, RunResult.SKIPPED_COOLDOWN, RunResult.SKIPPED_NOTHING_TO_MERGE}
YEAR = timedelta(days=365)
PROJECTS = [None, "alpha", "beta"]
FACTS = 400  # what a user has to say over a year; more than 200 fit, so the cap is reached
NEW_SESSION = 0.5  # an event starts a new session, or is a later turn of the last one
IN_FLIGHT_DELETE = 0.3  # a consolidation call during which the user deletes a row it was shown
# The scripted model answers whatever model is named, and the prompt names none, so the switch
# changes no answer. Made in the eleventh month, it leaves both models in the quality figures' last
# 90 days at the year's end, each with about 30 days of memories old enough for the 30-day share.
SWITCH_MONTH = 10
SECOND_MODEL = "openai/gpt-4o"
ADMIN_ID = 1


@dataclass
class Tally:
    """What happened over the run, for the report."""

    outcomes: Counter[str] = field(default_factory=Counter)
    consolidations: Counter[str] = field(default_factory=Counter)
    user_ops: Counter[str] = field(default_factory=Counter)
    pool_by_month: dict[int, list[int]] = field(default_factory=dict)
    duplicates: int = 0
    steps_checked: int = 0
    retention: Counter[str] = field(default_factory=Counter)
    facts_checked: int = 0  # ACTIVE facts that had to be stated still after a consolidation
    facts_lost: int = 0
    # Per month: each extraction prompt's tokens, and its share repeating the user's previous prompt.
    prompt_tokens_by_month: dict[int, list[int]] = field(default_factory=dict)
    prefix_share_by_month: dict[int, list[float]] = field(default_factory=dict)
    # The extraction models in turn, each with the time it took over; the rows each one's
    # extractions made, the user's rejections, and the touches the watch saw: the quality's ground
    # truth. `quality`: what the admin endpoint answered at the end.
    models: list[tuple[str, datetime]] = field(default_factory=list)
    made: list[Made] = field(default_factory=list)
    rejections: list[UserRejection] = field(default_factory=list)
    touches: Counter[int] = field(default_factory=Counter)
    quality: dict[str, Any] = field(default_factory=dict)


@dataclass
class SimUser:
    user_id: int
    rng: random.Random
    watch: PoolWatch
    facts: int
    session: int = 0
    events: int = 0
    project: str | None = None
    topic: list[int] = field(default_factory=list)
    deleted_meanwhile: set[int] = field(default_factory=set)


CURRENT_USER: ContextVar[int] = ContextVar("simulated_user")


class RecordingLlm:
    """The service's own client; what the model answered is kept for the checker and the report."""

    def __init__(self, llm: LlmClient) -> None:
        self._llm = llm
        self.calls: Counter[str] = Counter()
        self.last_extraction: dict[int, str] = {}
        self.figures = PromptFigures()
        self.last_prompt: dict[int, PromptFigure] = {}
        # The ten extraction prompts that showed the most memories, for the token count.
        self.largest: list[tuple[int, list[dict[str, str]]]] = []
        # Runs while a consolidation call is in flight, with the user and the prompt.
        self.meanwhile: Callable[[int, list[dict[str, str]]], Awaitable[None]] | None = None

    def mode(self, model: str) -> StructuredOutput:
        return self._llm.mode(model)

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
        self.calls[purpose] += 1
        call = self._llm.complete(purpose, model, messages, shape, wait, caller=caller, mode=mode)
        if purpose == "consolidation" and self.meanwhile is not None:
            answer, _ = await asyncio.gather(call, self.meanwhile(CURRENT_USER.get(), messages))
        else:
            answer = await call
        if purpose == "extraction":
            self.last_extraction[CURRENT_USER.get()] = answer.text
            self.last_prompt[CURRENT_USER.get()] = self.figures.record(CURRENT_USER.get(), messages)
            shown = len(prompt_data(messages[-1]["content"])["existing"])
            if len(self.largest) < 10 or shown > self.largest[0][0]:
                self.largest = sorted([*self.largest, (shown, messages)], key=lambda p: p[0])[-10:]
        return answer


class Simulation:
    def __init__(
        self,
        db: Database,
        handler: ExtractionHandler,
        consolidator: Consolidator,
        http: httpx.AsyncClient,
        llm: RecordingLlm,
        clock: ManualClock,
        users: list[int],
        events: int,
        seed: int,
        retired: set[int] | None = None,
    ) -> None:
        """`retired`: ids of rows that existed before the run and are gone (folded twins)."""
        self.db, self.handler, self.consolidator, self.http = db, handler, consolidator, http
        self.retention = RetentionJob(
            db, Metrics(), Horizons(ledger=timedelta(days=30), deleted_history=timedelta(days=365))
        )
        self.model, self.clock, self.events = llm, clock, events
        self.step_length = YEAR / events
        ever_seen = set(retired or ())
        self.users = [
            SimUser(
                u,
                random.Random(seed * 1_000_003 + i),
                PoolWatch(db, u, ever_seen, clock),
                facts=FACTS,
            )
            for i, u in enumerate(users)
        ]
        self.tally = Tally()
        self.model.meanwhile = self._delete_while_answering

    async def run(self) -> Tally:
        for user in self.users:
            await user.watch.start()
            response = await self.http.patch(
                "/api/v1/memory/settings", json={"autoCaptureEnabled": True}, headers=self._auth(user)
            )
            assert response.status_code == 200, response.text
        await self._set_model(None)
        month = 0
        for step in range(self.events):
            await asyncio.gather(*(self._step(user, step) for user in self.users))
            self.clock.advance(self.step_length * (0.5 + self.users[0].rng.random()))
            if (now_month := int((self.clock.now() - START) / YEAR * 12)) != month:
                month = now_month
                await self._retention()
                if month >= SWITCH_MONTH and len(self.tally.models) == 1:
                    await self._set_model(SECOND_MODEL)
        for user in self.users:
            self.tally.duplicates += _duplicates(await user.watch.step("user", full=True))
            self.tally.facts_checked += user.watch.facts_checked
            self.tally.facts_lost += user.watch.facts_lost
            self.tally.touches.update(user.watch.touches)
        response = await self.http.get("/api/v1/admin/memory/quality", headers=self._admin())
        assert response.status_code == 200, response.text
        self.tally.quality = response.json()["data"]
        return self.tally

    async def _set_model(self, model: str | None) -> None:
        """As an admin would (D10); None reads the model in use without changing it."""
        if model is None:
            response = await self.http.get("/api/v1/admin/memory/settings", headers=self._admin())
        else:
            body = {"extractionModelId": model, "probe": False}
            response = await self.http.put("/api/v1/admin/memory/settings", json=body, headers=self._admin())
        assert response.status_code == 200, response.text
        self.tally.models.append((response.json()["data"]["effectiveModel"], self.clock.now()))

    async def _step(self, user: SimUser, step: int) -> None:
        CURRENT_USER.set(user.user_id)  # each user's step runs in its own task and context
        if user.rng.random() < 0.08:
            await self._user_acts(user)
            await user.watch.step("user")
        event, project_key = self._event(user)
        self.model.last_extraction.pop(user.user_id, None)
        outcome, extracted = await self.handler.handle(event)
        self.tally.outcomes[outcome.value] += 1
        answered = self.model.last_extraction.get(user.user_id)
        offered = (
            Offered(answered, project_key) if answered is not None and outcome is Outcome.EXTRACTED else None
        )
        known = set(user.watch.rows)
        after = await user.watch.step("extraction", offered)
        model = self.tally.models[-1][0]
        self.tally.made += [Made(i, model, self.clock.now()) for i in sorted(after.keys() - known)]
        if extracted is not None:
            results = await self.consolidator.run(extracted)
            self.tally.consolidations.update(r.value for r in results)
            if not all(r in SKIPPED for r in results):  # a skipped run reads and writes no memory
                await user.watch.step("consolidation", user_deleted=frozenset(user.deleted_meanwhile))
                user.deleted_meanwhile.clear()
        self.tally.steps_checked += 1
        month = int((self.clock.now() - START) / YEAR * 12)
        if (prompt := self.model.last_prompt.pop(user.user_id, None)) is not None:
            self.tally.prompt_tokens_by_month.setdefault(month, []).append(prompt.tokens)
            self.tally.prefix_share_by_month.setdefault(month, []).append(prompt.prefix_share)
        self.tally.pool_by_month.setdefault(month, []).append(sum(r.active for r in user.watch.rows.values()))

    async def _retention(self) -> None:
        """Monthly, as a deployment would run it; every user's pool is then audited from scratch."""
        report = await self.retention.run_once()
        self.tally.retention.update(
            runs=1,
            touches_folded=report.touches_folded,
            history_purged=report.history_purged,
            ledger_deleted=report.ledger_deleted,
        )
        for user in self.users:
            await user.watch.after_retention()

    async def _delete_while_answering(self, user_id: int, messages: list[dict[str, str]]) -> None:
        """The user deletes a row the model was shown, preferring one of a fact stated twice: the
        consolidation must not then drop the fact's other row as redundant."""
        user = next(u for u in self.users if u.user_id == user_id)
        if user.rng.random() >= IN_FLIGHT_DELETE:
            return
        data = prompt_data(messages[-1]["content"])
        shown = {m["content"] for m in data["memories"]}
        rows = [
            r
            for r in user.watch.rows.values()
            if r.active and r.machine and r.content in shown and r.group == _group_of(data["group"])
        ]
        if not rows:
            return
        by_fact: dict[object, list[Row]] = {}
        for row in rows:
            by_fact.setdefault(fact_key(row), []).append(row)
        twice = [r for same in by_fact.values() if len(same) > 1 for r in same]
        target = user.rng.choice(twice or rows)
        response = await self.http.delete(f"/api/v1/memory/{target.id}", headers=self._auth(user))
        assert response.status_code == 200, response.text
        user.deleted_meanwhile.add(target.id)
        self.tally.rejections.append(UserRejection(target.id, Rejection.DELETED, self.clock.now()))
        self.tally.user_ops["delete while consolidating 200"] += 1

    def _event(self, user: SimUser) -> tuple[TaskFinishedEvent, str | None]:
        rng = user.rng
        user.events += 1
        # A few facts come up again and again, most only now and then: a skewed draw.
        drawn = {int(user.facts * rng.random() ** 2) for _ in range(rng.choice([1, 1, 2, 3]))}
        if user.session == 0 or rng.random() < NEW_SESSION:
            user.session += 1
            user.project = rng.choice(PROJECTS)
            user.topic = sorted(drawn)
        else:  # a later turn of the session: its project, part of its topic, and something new
            user.topic = sorted({*user.topic[:2], *drawn})[:3]
        facts, project_key = user.topic, user.project
        payload: dict[str, Any] = {
            "eventId": f"sim-{user.user_id}-{user.events}",
            "occurredAt": self.clock.now().isoformat() + "Z",
            "sessionId": user.user_id * 100_000 + user.session,
            "userId": user.user_id,
            "phase": "COMPLETED" if rng.random() < 0.95 else "FAILED",
            "sessionType": "MAIN" if rng.random() < 0.97 else "SUBAGENT",
            "projectKey": project_key,
            "lastUserMessage": conversation(user.user_id, facts),
            "lastAssistantMessage": "好的,我会记住这些约定。",
        }
        return TaskFinishedEvent.model_validate_json(json.dumps(payload)), project_key

    async def _user_acts(self, user: SimUser) -> None:
        """Edit, dismiss, restore, delete or write a fact by hand, through the HTTP API."""
        rng, rows = user.rng, list(user.watch.rows.values())
        active = [r for r in rows if r.active]
        dismissed = [r for r in rows if not r.active]
        roll = rng.random()
        target: Row | None = None
        if roll < 0.25 and active:
            target = rng.choice(active)
            kind, response = "edit", await self._patch(user, target, {"content": target.content + "(我改过)"})
        elif roll < 0.5 and active:
            target = rng.choice(active)
            kind, response = "dismiss", await self._patch(user, target, {"status": "DISMISSED"})
        elif roll < 0.6 and dismissed:
            kind, response = "restore", await self._patch(user, rng.choice(dismissed), {"status": "ACTIVE"})
        elif roll < 0.8 and rows:
            target = rng.choice(rows)
            kind = "delete"
            response = await self.http.delete(f"/api/v1/memory/{target.id}", headers=self._auth(user))
        else:
            fact = int(user.facts * rng.random())
            content = wording(user.user_id, fact, rng.randrange(len(STYLES)))
            kind = "create"
            response = await self.http.post(
                "/api/v1/memory", json={"scope": "USER", "content": content}, headers=self._auth(user)
            )
        assert response.status_code in {200, 201, 409}, response.text
        self.tally.user_ops[f"{kind} {response.status_code}"] += 1
        if target is not None and response.status_code == 200:
            self.tally.rejections.append(UserRejection(target.id, Rejection(kind), self.clock.now()))

    async def _patch(self, user: SimUser, row: Row, body: dict[str, Any]) -> httpx.Response:
        return await self.http.patch(f"/api/v1/memory/{row.id}", json=body, headers=self._auth(user))

    @staticmethod
    def _auth(user: SimUser) -> dict[str, str]:
        return bearer(token(user.user_id))

    @staticmethod
    def _admin() -> dict[str, str]:
        return bearer(token(ADMIN_ID, [READ_PERMISSION, ADMIN_PERMISSION]))


def _group_of(name: str) -> Group:
    """The group a consolidation prompt names: "user" or "project KEY"."""
    return USER_GROUP if name == "user" else Group(Scope.PROJECT, name.removeprefix("project "))


def _duplicates(rows: dict[int, Row]) -> int:
    keys = Counter(identity_key(r) for r in rows.values() if r.active)
    return sum(n - 1 for n in keys.values() if n > 1)
