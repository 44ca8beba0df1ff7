"""Bench case 10's cost of 1,000 events with and without a prompt cache (`bench/cache_cost.py`)."""

from __future__ import annotations

import pytest

from bench.cache_cost import MIN_CACHED_TOKENS, CacheTally, Rates, cost, costs_per_1000
from service.adapters.llm_client import import_litellm

OPENAI = Rates(prompt=1.0, completion=4.0, cache_read=0.5, cache_write=0.0)
ANTHROPIC = Rates(prompt=1.0, completion=5.0, cache_read=0.1, cache_write=1.25)


def chars(text: str) -> int:
    return len(text)  # a tokenizer of one token a character: the counts read off the texts


def prompt(memories: str, turn: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": "r" * 100}, {"role": "user", "content": f"{memories}\n\n{turn}"}]


def test_a_repeated_prefix_is_counted_as_cached_only_past_the_providers_minimum() -> None:
    tally = CacheTally()
    memories = "m" * 2000
    tally.record("extraction", prompt(memories, "first turn"), 10, chars)
    tally.record("extraction", prompt(memories, "second turn"), 10, chars)
    tally.record("consolidation", prompt("c" * 500, "x"), 10, chars)
    tally.record("consolidation", prompt("c" * 500, "y"), 10, chars)

    assert (
        tally.cached["extraction"] == 100 + 1 + 2000 + 2
    )  # rules, memories, "\n\n" up to the turn's first letters
    assert tally.cached["consolidation"] == 0  # 600 repeated tokens: under MIN_CACHED_TOKENS
    assert MIN_CACHED_TOKENS > 603
    assert tally.marked["extraction"] == 2 * (100 + 1 + 2000)
    assert tally.prompt["extraction"] == 2 * (100 + 1 + 2000) + len("\n\nfirst turn") + len("\n\nsecond turn")


def test_the_cache_prices_the_served_prefix_at_the_read_rate() -> None:
    assert cost(1000, 0, 0, 10, OPENAI) == {"without_cache": 1040.0, "with_cache": 1040.0}
    assert cost(1000, 800, 900, 10, OPENAI) == {"without_cache": 1040.0, "with_cache": 200 + 400 + 40}


def test_anthropic_pays_the_write_of_the_marked_prefix_it_did_not_read() -> None:
    # 900 marked, 800 read: 100 written at 1.25, 100 fresh, 800 at 0.1
    assert cost(1000, 800, 900, 10, ANTHROPIC)["with_cache"] == pytest.approx(100 * 1.25 + 100 + 80 + 50)
    # nothing read: the whole marked prefix is written, dearer than no cache at all
    assert (
        cost(1000, 0, 900, 10, ANTHROPIC)["with_cache"] > cost(1000, 0, 900, 10, ANTHROPIC)["without_cache"]
    )


def test_1000_events_are_priced_at_litellm_s_list_prices() -> None:
    tally = CacheTally()
    for turn in ("a", "b", "c", "d"):
        tally.record("extraction", prompt("m" * 3000, turn), 50, chars)
    figures = costs_per_1000(tally, events=4, litellm=import_litellm())

    assert figures["cached_share"] == pytest.approx(3 * 3103 / (4 * 3104), abs=0.001)
    for usd in figures["usd_per_1000_events"].values():
        assert usd["with_cache"] < usd["without_cache"]
    openai = figures["usd_per_1000_events"]["gpt-4o-mini"]
    assert openai["without_cache"] == pytest.approx(1000 * (3104 * 0.15e-6 + 50 * 0.6e-6), abs=1e-4)
