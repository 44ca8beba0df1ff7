"""The long-horizon simulation on MariaDB and SQLite.

`make test` runs a short year (1 user × 300 events per dialect); `make simulate` runs the full one
(5 users × 2,000 events per dialect, `MEMORY_SIM_USERS` / `MEMORY_SIM_EVENTS`) and writes
tests/simulation/REPORT.md.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.adapters.db.engine import upgrade_schema
from service.adapters.llm_client import LlmClient, import_litellm
from service.app.caches import ProjectRecorder
from service.app.consolidation import Consolidator, thresholds
from service.app.extraction import ExtractionHandler
from service.bootstrap import Container, Mode, build_container, build_http
from service.config import Settings
from tests.simulation.driver import START, Simulation, Tally
from tests.simulation.model import SimModel
from tests.support.clock import ManualClock
from tests.support.processes import MariaDbDatabase
from tests.support.scripted_llm import ScriptedLlm
from tests.support.tokens import SECRET

USERS = int(os.environ.get("MEMORY_SIM_USERS", "1"))
EVENTS = int(os.environ.get("MEMORY_SIM_EVENTS", "300"))
SEED = int(os.environ.get("MEMORY_SIM_SEED", "20270101"))
REPORT = Path(__file__).with_name("REPORT.md")
RESULTS: dict[str, dict[str, Any]] = {}
MODEL = "openai/gpt-4o-mini"


@pytest.fixture(scope="module")
def sim_model() -> Iterator[tuple[ScriptedLlm, SimModel]]:
    server = ScriptedLlm(record=False).start()
    model = SimModel(SEED)
    server.responder = model
    yield server, model
    server.stop()


@dataclass
class Stack:
    container: Container
    handler: ExtractionHandler
    consolidator: Consolidator
    http: httpx.AsyncClient
    clock: ManualClock


@pytest.fixture(params=["mysql", "sqlite"])
async def stack(
    request: pytest.FixtureRequest,
    mariadb: MariaDbDatabase,
    tmp_path: Path,
    sim_model: tuple[ScriptedLlm, SimModel],
) -> AsyncIterator[Stack]:
    if request.param == "mysql":
        url = mariadb.url
    else:
        url = f"sqlite+aiosqlite:///{tmp_path / 'sim.db'}"
        upgrade_schema(url)
    server, _ = sim_model
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None,
        database_url=url,
        jwt_secret=SECRET,
        default_model=MODEL,
        llm_api_base=server.api_base,
        llm_api_key="sim",
        capture_cache_ttl_s=0,
    )
    container = build_container(settings)
    clock = container.db.clock = ManualClock(START)
    llm = LlmClient(container.metrics, server.api_base, "sim", timeout_s=10, max_retries=2, retry_base_s=0.01)
    handler = ExtractionHandler(
        container.db,
        llm,
        container.metrics,
        settings,
        container.capture,
        ProjectRecorder(container.db),
        asyncio.Semaphore(settings.max_in_flight),
    )
    consolidator = Consolidator(container.db, llm, container.metrics, thresholds(settings))
    app = build_http(container, Mode.API)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as http:
        yield Stack(container, handler, consolidator, http, clock)
    await container.db.dispose()


@pytest.mark.timeout(3600)
async def test_a_simulated_year_keeps_every_invariant(
    stack: Stack, sim_model: tuple[ScriptedLlm, SimModel], user_id: int, request: pytest.FixtureRequest
) -> None:
    _, model = sim_model
    model.calls.clear()
    model.largest_prompts.clear()
    users = [user_id + i for i in range(USERS)]
    started = time.perf_counter()
    simulation = Simulation(
        stack.container.db,
        stack.handler,
        stack.consolidator,
        stack.http,
        model,
        stack.clock,
        users,
        EVENTS,
        SEED,
    )

    tally = await simulation.run()

    assert tally.duplicates == 0
    assert tally.steps_checked == USERS * EVENTS
    assert tally.outcomes["extracted"] > EVENTS * USERS * 0.8
    dialect = request.node.callspec.params["stack"]
    RESULTS[dialect] = _summary(tally, model, stack, time.perf_counter() - started)


def _summary(tally: Tally, model: SimModel, stack: Stack, elapsed: float) -> dict[str, Any]:
    litellm = import_litellm()
    tokens = [litellm.token_counter(model=MODEL, messages=m) for _, m in model.largest_prompts]
    shown = [n for n, _ in model.largest_prompts]
    metrics = stack.container.metrics.registry

    def candidates(result: str) -> int:
        return int(
            sum(
                s.value
                for m in metrics.collect()
                for s in m.samples
                if s.name == "mao_memory_candidates_total" and s.labels.get("result") == result
            )
        )

    return {
        "users": USERS,
        "events": EVENTS,
        "seconds": round(elapsed, 1),
        "pool_by_month": {m: max(v) for m, v in sorted(tally.pool_by_month.items())},
        "duplicates": tally.duplicates,
        "outcomes": dict(tally.outcomes),
        "candidates": {
            r: candidates(r) for r in ("inserted", "touched", "updated", "restored", "dropped_no_room")
        },
        "demotions": int(metrics.get_sample_value("mao_memory_overflow_demotions_total") or 0),
        "consolidations": dict(tally.consolidations),
        "consolidation_calls": model.calls["consolidation"],
        "merged_rows": int(
            metrics.get_sample_value("mao_memory_consolidated_rows_total", {"op": "merged"}) or 0
        ),
        "dropped_rows": int(
            metrics.get_sample_value("mao_memory_consolidated_rows_total", {"op": "dropped"}) or 0
        ),
        "user_ops": dict(tally.user_ops),
        "largest_prompt_tokens": round(sum(tokens) / len(tokens)) if tokens else None,
        "largest_prompt_shown": f"{min(shown)}-{max(shown)}" if shown else None,
    }


def teardown_module() -> None:
    if not RESULTS:
        return
    out = Path("tests/output")
    out.mkdir(parents=True, exist_ok=True)
    (out / "simulation.json").write_text(json.dumps(RESULTS, indent=2, ensure_ascii=False))
    if os.environ.get("MEMORY_SIM_REPORT"):
        REPORT.write_text(_report(RESULTS))


def _report(results: dict[str, dict[str, Any]]) -> str:
    first = next(iter(results.values()))
    lines = [
        "# Long-horizon simulation",
        "",
        f"{first['users']} users × {first['events']} events over a simulated year per dialect, seed {SEED}; "
        "every invariant checked after every step (user action, extraction, consolidation). "
        "Written by `make simulate`.",
        "",
        "| figure | " + " | ".join(results) + " |",
        "|---|" + "---|" * len(results),
    ]

    def row(name: str, value: Any) -> None:
        lines.append(f"| {name} | " + " | ".join(str(value(r)) for r in results.values()) + " |")

    row("wall time (s)", lambda r: r["seconds"])
    row("duplicates (same identity, one group, ACTIVE)", lambda r: r["duplicates"])
    for key in ("inserted", "touched", "updated", "restored", "dropped_no_room"):
        row(f"candidates {key}", lambda r, k=key: r["candidates"][k])
    row("D14 demotions", lambda r: r["demotions"])
    row("consolidation calls", lambda r: r["consolidation_calls"])
    row("rows merged / dropped", lambda r: f"{r['merged_rows']} / {r['dropped_rows']}")
    row(
        "consolidation results",
        lambda r: ", ".join(f"{k} {v}" for k, v in sorted(r["consolidations"].items())),
    )
    row("events", lambda r: ", ".join(f"{k} {v}" for k, v in sorted(r["outcomes"].items())))
    row(
        "user actions (HTTP status)",
        lambda r: ", ".join(f"{k} {v}" for k, v in sorted(r["user_ops"].items())),
    )
    row(
        "prompt tokens per extraction at the fullest comparison sets (10 largest)",
        lambda r: f"{r['largest_prompt_tokens']} ({r['largest_prompt_shown']} memories shown)",
    )
    lines += ["", "Largest ACTIVE pool of any user, by month:", "", "| month | " + " | ".join(results) + " |"]
    lines.append("|---|" + "---|" * len(results))
    months = sorted({int(m) for r in results.values() for m in r["pool_by_month"]})
    for month in months:
        lines.append(
            f"| {month + 1} | "
            + " | ".join(str(r["pool_by_month"].get(month, "")) for r in results.values())
            + " |"
        )
    return "\n".join(lines) + "\n"
