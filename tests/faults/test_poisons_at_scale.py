"""Many events the model always fails on at once, among healthy traffic: the fault report's rows for
the per-event failure budget (docs/operations.md, "Poison events")."""

from __future__ import annotations

import pytest

from service.adapters.circuit_breaker import CircuitBreaker
from service.adapters.db.database import Database
from service.adapters.llm_client import LlmClient
from tests.faults.conftest import Report
from tests.integration.conftest import HandlerFactory
from tests.integration.test_model_failure_budget import client, poisons_among_healthy  # noqa: F401
from tests.support.scripted_llm import ScriptedLlm


@pytest.mark.parametrize("poisons", [2, 6, 50])
async def test_poisons_at_once_each_end_in_the_dlq_while_healthy_events_flow(
    mysql_db: Database,
    make_handler: HandlerFactory,
    llm: ScriptedLlm,
    client: tuple[LlmClient, CircuitBreaker],  # noqa: F811
    user_id: int,
    report: Report,
    poisons: int,
) -> None:
    run = await poisons_among_healthy(mysql_db, make_handler, llm, client, user_id, poisons)
    run.check(poisons)
    report.add(
        f"{poisons} poison events at once (timeout, empty 2xx, 408) among a healthy event every 50 ms",
        events=poisons + len(run.healthy_s),
        faults=poisons,
        rows_checked=poisons + len(run.healthy_s),
        losses=0,
        note=f"all dead-lettered as model_failed within {run.took_s:.1f} s; the slowest healthy event "
        f"took {max(run.healthy_s) * 1000:.0f} ms; the breaker never opened",
    )
