"""Bench case 10's cost of 1,000 events with and without a prompt cache (`bench/cache_cost.py`)."""

from __future__ import annotations

import pytest

from bench.cache_cost import (
    AUTOMATIC_MIN_TOKENS,
    MARKED_MIN_TOKENS,
    CacheTally,
    Rates,
    cost,
    costs_per_1000,
)
from service.adapters.llm_client import import_litellm

OPENAI = Rates(prompt=1.0, completion=4.0, cache_read=0.5, cache_write=1.0)
ANTHROPIC = Rates(prompt=1.0, completion=5.0, cache_read=0.1, cache_write=1.25)
RULES = "r" * 100


def chars(text: str) -> int:
    return len(text)  # a tokenizer of one token a character: the counts read off the texts


def prompt(*blocks: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": RULES}, {"role": "user", "content": "\n\n".join(blocks)}]


def record(tally: CacheTally, purpose: str, *prompts: list[dict[str, str]]) -> None:
    for messages in prompts:
        tally.record(purpose, messages, 10, chars)


def test_openai_reads_a_repeated_prefix_past_its_minimum_in_steps_of_128() -> None:
    tally = CacheTally()
    memories = "m" * 2000
    record(tally, "extraction", prompt(memories, "first turn"), prompt(memories, "second turn"))
    record(tally, "consolidation", prompt("c" * 500, "x"), prompt("c" * 500, "y"))

    # rules, memories, "\n\n": 2,103 tokens repeated, read in steps of 128
    assert tally.read["gpt-4o-mini"]["extraction"] == 2048
    assert tally.read["gpt-4o-mini"]["consolidation"] == 0  # 603 repeated tokens: under the minimum
    assert AUTOMATIC_MIN_TOKENS > 603
    assert tally.written["gpt-4o-mini"]["extraction"] == 0
    assert tally.prompt["extraction"] == 2 * (100 + 1 + 2000) + len("\n\nfirst turn") + len("\n\nsecond turn")


USER = "User memories:\n" + "u" * 5000
CONVERSATION = 'Conversation:\n{"user": "hi"}'


def test_anthropic_reads_the_longest_marked_prefix_written_before_and_writes_the_rest() -> None:
    """Two projects of a user: the same rules and USER block, another PROJECT block. The second
    call reads the prefix up to the USER block's mark, not all it shares with the first."""
    tally = CacheTally()
    project_a, project_b = "Project memories:\n" + "a" * 3000, "Project memories:\n" + "b" * 3000
    record(tally, "extraction", prompt(USER, project_a, CONVERSATION), prompt(USER, project_b, CONVERSATION))

    user_mark = len(RULES) + 1 + len(USER)  # the rules' mark is under the minimum: nothing there
    last_mark = user_mark + 2 + len(project_b)  # everything before the conversation
    assert len(RULES) < MARKED_MIN_TOKENS <= user_mark
    assert tally.read["claude-haiku-4-5"]["extraction"] == user_mark
    assert tally.written["claude-haiku-4-5"]["extraction"] == last_mark + (last_mark - user_mark)
    # OpenAI's cache reads on into the PROJECT block's heading
    shared = user_mark + len("\n\nProject memories:\n")
    assert tally.read["gpt-4o-mini"]["extraction"] == shared - shared % 128


def test_anthropic_reads_the_frozen_blocks_when_only_the_log_grew() -> None:
    tally = CacheTally()
    frozen = [USER, "Project memories:\n" + "p" * 300]
    log = "Changes:\n7\tuser\tnew"
    record(
        tally,
        "extraction",
        prompt(*frozen, log, CONVERSATION),
        prompt(*frozen, log + "\n8\tuser\tnewer", CONVERSATION),
    )

    frozen_mark = len(RULES) + 1 + len("\n\n".join(frozen))
    assert tally.read["claude-haiku-4-5"]["extraction"] == frozen_mark
    assert tally.written["claude-haiku-4-5"]["extraction"] == (frozen_mark + 2 + len(log)) + (
        2 + len(log + "\n8\tuser\tnewer")
    )


def test_anthropic_caches_nothing_at_marks_under_its_minimum() -> None:
    tally = CacheTally()
    short = "m" * 2000
    record(tally, "extraction", prompt(short, "first turn"), prompt(short, "second turn"))

    assert tally.read["claude-haiku-4-5"]["extraction"] == 0
    assert tally.written["claude-haiku-4-5"]["extraction"] == 0


def test_the_cache_prices_reads_and_writes_at_their_rates() -> None:
    assert cost(1000, 0, 0, 10, OPENAI) == {"without_cache": 1040.0, "with_cache": 1040.0}
    assert cost(1000, 800, 0, 10, OPENAI) == {"without_cache": 1040.0, "with_cache": 200 + 400 + 40}
    # 800 read at 0.1, 100 written at 1.25, 100 fresh
    assert cost(1000, 800, 100, 10, ANTHROPIC)["with_cache"] == pytest.approx(80 + 125 + 100 + 50)
    # nothing read: the whole marked prefix is written, dearer than no cache at all
    assert (
        cost(1000, 0, 900, 10, ANTHROPIC)["with_cache"] > cost(1000, 0, 900, 10, ANTHROPIC)["without_cache"]
    )


def test_1000_events_are_priced_at_litellm_s_list_prices() -> None:
    tally = CacheTally()
    for turn in ("a", "b", "c", "d"):
        record(tally, "extraction", prompt("m" * 5000, turn))
    figures = costs_per_1000(tally, events=4, litellm=import_litellm())

    whole, repeated, marked = 5104, 5103, 5101
    assert figures["read_share"] == {
        "gpt-4o-mini": pytest.approx(3 * (repeated - repeated % 128) / (4 * whole), abs=0.001),
        "claude-haiku-4-5": pytest.approx(3 * marked / (4 * whole), abs=0.001),
    }
    assert figures["written_share"]["claude-haiku-4-5"] == pytest.approx(marked / (4 * whole), abs=0.001)
    for usd in figures["usd_per_1000_events"].values():
        assert usd["with_cache"] < usd["without_cache"]
    openai = figures["usd_per_1000_events"]["gpt-4o-mini"]
    assert openai["without_cache"] == pytest.approx(1000 * (whole * 0.15e-6 + 10 * 0.6e-6), abs=1e-4)
