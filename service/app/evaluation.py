"""`mao-memory eval`: every labelled case through the real extraction handler (prompt, litellm
client, answer guards, write decision, writes) on a throwaway database, then scored per fact.

Each case is its own user, so cases never see each other's memories and run concurrently, as
production's events of different users do.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from service.adapters.db.database import Database
from service.adapters.db.eval_pool import seed_pool, turn_writes
from service.adapters.llm_client import LlmClient
from service.adapters.metrics import Metrics
from service.app.extraction import ExtractionHandler, ModelRejected, ModelUnavailable
from service.app.ports import AnswerShape, Llm, LlmAnswer, StructuredOutput
from service.core.eval_cases import EvalCase
from service.core.eval_scoring import CaseRun, Usage, model_report
from service.core.events import TaskFinishedEvent
from service.core.extraction_answer import AnswerError, parse_extraction_answer
from service.core.labels import LlmPurpose, TokenKind
from service.core.outcomes import Outcome

# Users of the throwaway database: model n's case i is user n * USERS_PER_MODEL + i + 1.
USERS_PER_MODEL = 1_000_000


class TimedLlm:
    """The model client as the handler sees it, timing each call and keeping each answer by caller
    (the event id), so a dropped answer can be told by kind."""

    def __init__(self, llm: Llm) -> None:
        self._llm = llm
        self.latencies_s: list[float] = []
        self.answers: dict[Hashable, LlmAnswer] = {}

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
        started = time.perf_counter()
        try:
            answer = await self._llm.complete(purpose, model, messages, shape, wait, caller=caller, mode=mode)
        finally:
            self.latencies_s.append(time.perf_counter() - started)
        self.answers[caller] = answer
        return answer

    def answer_failure(self, caller: Hashable) -> str:
        """Why the answer to `caller` was dropped whole: what the handler's metric label says."""
        answer = self.answers.get(caller)
        if answer is None:
            return "unanswered"
        if answer.truncated:
            return "truncated"
        parsed = parse_extraction_answer(answer.text)
        return parsed.value if isinstance(parsed, AnswerError) else "unusable"

    def dropped_items(self, caller: Hashable) -> int:
        """Items of a usable answer the guards dropped (no content, over 120 characters, bad type)."""
        answer = self.answers.get(caller)
        parsed = None if answer is None or answer.truncated else parse_extraction_answer(answer.text)
        return 0 if parsed is None or isinstance(parsed, AnswerError) else parsed.dropped_items


@dataclass(slots=True)
class EvalTarget:
    """One model under evaluation: its handler, wired to its own client and metrics."""

    model: str
    handler: ExtractionHandler
    llm: TimedLlm
    client: LlmClient
    metrics: Metrics
    db: Database
    index: int
    priced: bool  # litellm's cost map has the model's prices
    conversation_tokens: int  # MEMORY_LLM_CONVERSATION_TOKENS, the bound of the prompt's conversation
    runs: list[CaseRun] = field(default_factory=list)
    dropped_items: int = 0

    def usage(self) -> Usage:
        """Tokens and cost as the client counted them for the dashboard."""

        def counted(name: str, **labels: str) -> float:
            value = self.metrics.registry.get_sample_value(name, {"purpose": LlmPurpose.EXTRACTION, **labels})
            return value or 0.0

        tokens = "mao_memory_llm_tokens_total"
        return Usage(
            prompt_tokens=int(counted(tokens, kind=TokenKind.PROMPT)),
            completion_tokens=int(counted(tokens, kind=TokenKind.COMPLETION)),
            cached_tokens=int(counted(tokens, kind=TokenKind.CACHE_READ)),
            cost_usd=counted("mao_memory_llm_cost_usd_total") if self.priced else None,
            latencies_s=self.llm.latencies_s,
        )

    def report(self) -> dict[str, object]:
        return model_report(
            self.model,
            self.runs,
            self.usage(),
            self.conversation_tokens,
            {"dropped_item": self.dropped_items},
        )


def case_event(case: EvalCase, user_id: int, session_id: int) -> TaskFinishedEvent:
    # As the event arrives: JSON, which the contract parses strictly.
    return TaskFinishedEvent.model_validate_json(
        json.dumps(
            {
                "eventId": f"eval-{user_id}-{case.id}",
                "occurredAt": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
                "sessionId": session_id,
                "userId": user_id,
                "phase": "COMPLETED",
                "sessionType": "MAIN",
                "channel": "DESKTOP",
                "projectKey": case.project_key,
                "lastUserMessage": case.user,
                "lastAssistantMessage": case.assistant,
            }
        )
    )


async def run_case(target: EvalTarget, case: EvalCase, position: int) -> CaseRun:
    user_id = target.index * USERS_PER_MODEL + position + 1
    ids = await seed_pool(target.db, user_id, case.pool)
    event = case_event(case, user_id, position + 1)
    try:
        outcome, _ = await target.handler.handle(event)
    except ModelUnavailable as exc:
        return CaseRun(case, failure=exc.kind)
    except ModelRejected:
        return CaseRun(case, failure="rejected")
    failure = None
    if outcome is Outcome.FAILED:
        failure = target.llm.answer_failure(event.event_id)
    elif outcome is not Outcome.EXTRACTED:
        failure = outcome.value
    target.dropped_items += target.llm.dropped_items(event.event_id)
    return CaseRun(case, await turn_writes(target.db, user_id, event.event_id, ids), failure)


async def evaluate(
    targets: Sequence[EvalTarget],
    cases: Sequence[EvalCase],
    concurrency: int,
    progress: Callable[[int, int], None] | None = None,
) -> None:
    """Every case for every model, at most `concurrency` at once; each target's `runs` in case order."""
    slots = asyncio.Semaphore(concurrency)
    total, done = len(targets) * len(cases), 0

    async def one(target: EvalTarget, case: EvalCase, position: int) -> CaseRun:
        nonlocal done
        async with slots:
            run = await run_case(target, case, position)
        done += 1
        if progress is not None:
            progress(done, total)
        return run

    for target, runs in zip(
        targets,
        await asyncio.gather(
            *(asyncio.gather(*(one(t, c, i) for i, c in enumerate(cases))) for t in targets)
        ),
        strict=True,
    ):
        target.runs = list(runs)
