"""What the model costs once users' pools are full: `python -m bench.steady_state [events]`.

Two figures, counted with litellm's `token_counter` for gpt-4o-mini:
- one extraction prompt at a full pool (`tests/support/full_pool.py`: 180 machine-made ACTIVE rows
  and 50 dismissed facts shown), against the tokens of the contents it carries;
- model calls and tokens per 1,000 completed events of a steady-state mix, through the real handler
  and consolidator over MariaDB, every user's pool full, the model (`bench.model_server`) answering at
  once: each user's first event brings a new fact (an insert, then a consolidation run for each of
  the two groups), later ones restate it (a touch). The mix (`MIX`) is the share of completed events
  by what becomes of them before the model: extracted, a sub-agent or side task (D6), a user message
  too short (D11), a redelivery of an event already done. With them, the cost of those calls at
  list prices without and with a provider's prompt cache (`bench/cache_cost.py`).
Prints one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter
from collections.abc import Hashable
from typing import Any

from bench.cache_cost import CacheTally, costs_per_1000
from bench.cpu_profile import seed_full_pools, start_model_server
from service.adapters.db.database import Database
from service.adapters.db.engine import build_engine
from service.adapters.llm_client import AnswerShape, LlmAnswer, LlmClient, StructuredOutput, import_litellm
from service.adapters.metrics import Metrics
from service.app.caches import CaptureSwitch, ProjectRecorder
from service.app.consolidation import Consolidator, thresholds
from service.app.extraction import ExtractionHandler, ExtractionSlots
from service.config import Settings
from service.core.comparison_set import build_comparison_set
from service.core.events import TaskFinishedEvent
from service.core.extraction_prompt import build_extraction_messages
from tests.support.full_pool import CONVERSATION, PROJECT, full_pool
from tests.support.processes import MariaDbDatabase

MODEL = "openai/gpt-4o-mini"
TOKENS_MODEL = "gpt-4o-mini"
EVENTS, EVENTS_PER_USER, IN_FLIGHT = 1000, 10, 8
# Of every 20 completed events: 17 extracted, a sub-agent task, a user message too short, a redelivery.
MIX = ["extract"] * 16 + ["subagent", "short", "extract", "redelivered"]


class CountingLlm:
    """The service's client; each call's prompt and answer tokens are counted by purpose."""

    def __init__(self, llm: LlmClient) -> None:
        self._llm = llm
        self._litellm = import_litellm()
        self.calls: Counter[str] = Counter()
        self.prompt_tokens: Counter[str] = Counter()
        self.completion_tokens: Counter[str] = Counter()
        self.cache = CacheTally()

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
        answer = await self._llm.complete(purpose, model, messages, shape, wait, caller=caller, mode=mode)
        self.calls[purpose] += 1
        self.prompt_tokens[purpose] += self._litellm.token_counter(model=TOKENS_MODEL, messages=messages)
        completion = self._litellm.token_counter(model=TOKENS_MODEL, text=answer.text)
        self.completion_tokens[purpose] += completion
        self.cache.record(purpose, messages, completion, self._count)
        return answer

    def _count(self, text: str) -> int:
        return int(self._litellm.token_counter(model=TOKENS_MODEL, text=text))


def full_pool_prompt() -> dict[str, Any]:
    """One extraction prompt at the full pool, and what of it is content."""
    count = import_litellm().token_counter
    pool = full_pool()
    existing = build_comparison_set(pool.active, PROJECT, pool.dismissed_contents)
    messages = build_extraction_messages(*CONVERSATION, PROJECT, existing, wrapped=True)
    prompt = count(model=TOKENS_MODEL, messages=messages)
    system = count(model=TOKENS_MODEL, messages=messages[:1])
    content = sum(
        count(model=TOKENS_MODEL, text=c) for c in [r.content for r in pool.active] + pool.dismissed_contents
    )
    conversation = sum(count(model=TOKENS_MODEL, text=c) for c in CONVERSATION)
    return {
        "rows_shown": len(existing.shown),
        "dismissed_shown": len(existing.dismissed),
        "prompt_tokens": prompt,
        "system_tokens": system,
        "content_tokens": content,
        "conversation_tokens": conversation,
        "content_share": round(content / prompt, 3),
        # The target: prompt ≤ system + 1.25 × content + conversation.
        "overhead_ratio": round((prompt - system - conversation) / content, 3),
    }


def event(user: int, seq: int, kind: str) -> TaskFinishedEvent:
    said = f"请记住这个长期偏好(bench-{user}):以后所有的报告都用中文来写,并附上摘要。"
    payload = {
        "eventId": f"steady-{user}-{seq - 1 if kind == 'redelivered' else seq}",
        "occurredAt": "2026-12-03T10:00:00Z",
        "sessionId": user * 100 + seq,
        "userId": user,
        "phase": "COMPLETED",
        "sessionType": "SUBAGENT" if kind == "subagent" else "MAIN",
        "projectKey": PROJECT,
        "lastUserMessage": "好的" if kind == "short" else said,
        "lastAssistantMessage": "好的,以后的报告都会用中文撰写并附上摘要。",
    }
    return TaskFinishedEvent.model_validate_json(json.dumps(payload))


async def steady_mix(api_base: str, events: int) -> dict[str, Any]:
    database = MariaDbDatabase().create()
    users = range(1, events // EVENTS_PER_USER + 1)
    seed_full_pools(database, users)
    db = Database(build_engine(database.url, 10), build_engine(database.url, 10, autocommit=True))
    settings = Settings(_env_file=None, default_model=MODEL, capture_cache_ttl_s=3600)  # type: ignore[call-arg]
    client = LlmClient(Metrics(), api_base, "k", timeout_s=10, max_retries=0, retry_base_s=0.01)
    llm = CountingLlm(client)
    handler = ExtractionHandler(
        db, llm, Metrics(), settings, CaptureSwitch(db, 3600), ProjectRecorder(db), ExtractionSlots.of(64, 10)
    )
    consolidator = Consolidator(
        db, llm, Metrics(), thresholds(settings), settings.llm_consolidation_max_tokens
    )
    outcomes: Counter[str] = Counter()
    try:
        async with db.transaction() as uow:
            for u in users:
                await uow.accounts.set_capture(u, True, db.now())
            await uow.commit()
        slots = asyncio.Semaphore(IN_FLIGHT)

        async def one_user(user: int) -> None:
            async with slots:  # a user's events in order, as one session key's are
                for seq in range(EVENTS_PER_USER):
                    outcome, extracted = await handler.handle(event(user, seq, MIX[(user + seq) % len(MIX)]))
                    outcomes[outcome.value] += 1
                    if extracted is not None:
                        await consolidator.run(extracted)

        started = time.perf_counter()
        await asyncio.gather(*(one_user(u) for u in users))
        elapsed = time.perf_counter() - started
    finally:
        await client.stop()
        await db.dispose()
        database.drop()
    done = sum(outcomes.values())
    per_1000 = 1000 / done
    return {
        "events": done,
        "users": len(users),
        "seconds": round(elapsed, 1),
        "outcomes": dict(outcomes),
        "model_calls_per_1000": {p: round(n * per_1000, 1) for p, n in llm.calls.items()},
        "prompt_tokens_per_1000": {p: round(n * per_1000) for p, n in llm.prompt_tokens.items()},
        "completion_tokens_per_1000": {p: round(n * per_1000) for p, n in llm.completion_tokens.items()},
        "cache": costs_per_1000(llm.cache, done, import_litellm()),
        "prompt_tokens_per_extraction": round(
            llm.prompt_tokens["extraction"] / max(llm.calls["extraction"], 1)
        ),
    }


def main(events: int) -> dict[str, Any]:
    server, api_base = start_model_server()
    try:
        return {
            "full_pool_prompt": full_pool_prompt(),
            "steady_mix": asyncio.run(steady_mix(api_base, events)),
        }
    finally:
        assert server.stdin is not None
        server.stdin.close()
        server.wait(10)


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]) if len(sys.argv) > 1 else EVENTS)))
