"""The long-horizon simulation on MariaDB and SQLite.

`make test` runs a short year (1 user × 300 events per dialect); `make simulate` runs the full one
(5 users × 2,000 events per dialect, `MEMORY_SIM_USERS` / `MEMORY_SIM_EVENTS`), one process per
dialect, and `python -m tests.simulation.report` writes tests/simulation/REPORT.md from both.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from service.adapters.llm_client import import_litellm
from tests.simulation.checker import (
    QualityFigures,
    expected_quality,
    quality_differences,
    reported_quality,
)
from tests.simulation.conftest import EVENTS, MODEL, USERS, Stack
from tests.simulation.driver import SECOND_MODEL, START, Tally

OUTPUT = Path("tests/output")
RESULTS: dict[str, dict[str, Any]] = {}


@pytest.mark.timeout(3600)
async def test_a_simulated_year_keeps_every_invariant(
    stack: Stack, user_id: int, request: pytest.FixtureRequest
) -> None:
    users = [user_id + i for i in range(USERS)]
    if stack.twins is not None:  # the precedence of migration 0002, before the year starts
        assert stack.twins.problems == [], "\n".join(stack.twins.problems)
    started = time.perf_counter()
    tally = await stack.simulation(users, EVENTS).run()

    assert tally.duplicates == 0
    assert tally.facts_lost == 0
    assert tally.steps_checked == USERS * EVENTS
    assert tally.outcomes["extracted"] > EVENTS * USERS * 0.8
    await _check_quality(tally, stack)
    dialect = request.node.callspec.params["stack"]
    RESULTS[dialect] = _summary(tally, stack, time.perf_counter() - started)


async def _check_quality(tally: Tally, stack: Stack) -> None:
    """The admin endpoint's figures at the year's end are what the driver's own log gives, for both
    models (the switch leaves each in the last 90 days), and the gauges say the same after a refresh."""
    assert [model for model, _ in tally.models] == [MODEL, SECOND_MODEL]
    reported = reported_quality(tally.quality["models"])
    assert set(reported) == {MODEL, SECOND_MODEL}
    expected = expected_quality(tally.made, tally.rejections, tally.touches, stack.clock.now())
    assert quality_differences(reported, expected) == []
    assert stack.service.quality is not None
    await stack.service.quality.refresh()
    assert quality_differences(_gauged_quality(stack.service.metrics.registry), reported) == []


def _gauged_quality(registry: CollectorRegistry) -> QualityFigures:
    """The model-quality gauges' samples, keyed as `reported_quality`'s figures."""
    key = {
        "mao_memory_model_memories_created": lambda labels: "created",
        "mao_memory_model_memories_reconfirmed": lambda labels: "reconfirmed",
        "mao_memory_model_memory_touches": lambda labels: "touches",
        "mao_memory_model_memories_cohort": lambda labels: f"cohort {labels['within']}",
        "mao_memory_model_memories_rejected": lambda labels: f"{labels['kind']} {labels['within']}",
    }
    figures: QualityFigures = {}
    for metric in registry.collect():
        for sample in metric.samples:
            if sample.name in key:
                name = key[sample.name](sample.labels)
                figures.setdefault(sample.labels["model"], {})[name] = int(sample.value)
    return figures


def _summary(tally: Tally, stack: Stack, elapsed: float) -> dict[str, Any]:
    litellm = import_litellm()
    tokens = [litellm.token_counter(model=MODEL, messages=m) for _, m in stack.llm.largest]
    shown = [n for n, _ in stack.llm.largest]
    metrics = stack.service.metrics.registry

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
        "pool_by_month": {
            m: f"{sum(v) / len(v):.0f} / {max(v)}" for m, v in sorted(tally.pool_by_month.items())
        },
        "duplicates": tally.duplicates,
        "outcomes": dict(tally.outcomes),
        "candidates": {
            r: candidates(r) for r in ("inserted", "touched", "updated", "restored", "dropped_no_room")
        },
        "demotions": int(metrics.get_sample_value("mao_memory_overflow_demotions_total") or 0),
        "consolidations": dict(tally.consolidations),
        "consolidation_calls": stack.llm.calls["consolidation"],
        "merged_rows": int(
            metrics.get_sample_value("mao_memory_consolidated_rows_total", {"op": "merged"}) or 0
        ),
        "dropped_rows": int(
            metrics.get_sample_value("mao_memory_consolidated_rows_total", {"op": "dropped"}) or 0
        ),
        "user_ops": dict(tally.user_ops),
        "twins": f"{len(stack.twins.sets)} / {stack.twins.folded}" if stack.twins else "-",
        "abandoned_stale": tally.consolidations["abandoned_stale"],
        "facts_checked": tally.facts_checked,
        "facts_lost": tally.facts_lost,
        "retention": dict(tally.retention),
        "largest_prompt_tokens": round(sum(tokens) / len(tokens)) if tokens else None,
        "prompt_tokens_by_month": {
            m: f"{sum(v) / len(v):.0f} / {max(v)}" for m, v in sorted(tally.prompt_tokens_by_month.items())
        },
        "prefix_share_by_month": {
            m: f"{sum(v) / len(v):.0%}" for m, v in sorted(tally.prefix_share_by_month.items())
        },
        "prefix_share": _mean([s for v in tally.prefix_share_by_month.values() for s in v]),
        "skipped_budget": tally.outcomes["skipped_budget"],
        "largest_prompt_shown": f"{min(shown)}-{max(shown)}" if shown else None,
        "extraction_models": [
            {"model": model, "from_day": round((since - START) / timedelta(days=1), 1)}
            for model, since in tally.models
        ],
        "model_quality": tally.quality,
    }


def _mean(values: list[float]) -> str:
    return f"{sum(values) / len(values):.0%}" if values else "-"


def teardown_module() -> None:
    """One JSON file per dialect, so the two dialects may run in separate processes."""
    OUTPUT.mkdir(parents=True, exist_ok=True)
    for dialect, result in RESULTS.items():
        (OUTPUT / f"simulation-{dialect}.json").write_text(json.dumps(result, indent=2, ensure_ascii=False))
