"""What 1,000 events' model calls cost at list prices, with and without a provider's prompt cache.

Bench case 10 counts, per purpose, the prompt tokens, the part of each prompt that repeats a recent
prompt as a prefix (what a cache can serve), the part before the prompt's last block (what the
service marks for Anthropic's cache) and the completion tokens. Priced from litellm's cost map:
- without a cache, every prompt token at the input rate;
- with one, the served prefix at the cache-read rate and the rest at the input rate; a provider that
  bills cache writes (Anthropic) writes the marked part the cache did not serve, at its write rate.
A provider caches only a prefix of at least `MIN_CACHED_TOKENS` (OpenAI: 1,024; Anthropic's smaller
models more): a shorter repeat is billed whole.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.simulation.prompts import common_prefix

# The models case 10 prices: OpenAI's automatic cache, Anthropic's marked one.
PRICED_MODELS = ("gpt-4o-mini", "claude-haiku-4-5")
MIN_CACHED_TOKENS = 1024
# Prompts a cache still holds when a user's next one comes (a few minutes of a busy stream).
RECENT_PROMPTS = 64


@dataclass
class CacheTally:
    """Per purpose: prompt, cacheable (served prefix), marked and completion tokens."""

    prompt: dict[str, int] = field(default_factory=dict)
    cached: dict[str, int] = field(default_factory=dict)
    marked: dict[str, int] = field(default_factory=dict)
    completion: dict[str, int] = field(default_factory=dict)
    _recent: dict[str, list[str]] = field(default_factory=dict)

    def record(
        self, purpose: str, messages: Sequence[dict[str, str]], completion: int, count: Callable[[str], int]
    ) -> None:
        """One call: `count` is the tokenizer (tokens of a text)."""
        text = "\n".join(m["content"] for m in messages)
        recent = self._recent.setdefault(purpose, [])
        repeated = max((common_prefix(text, before) for before in recent), default=0)
        recent.append(text)
        del recent[:-RECENT_PROMPTS]
        total = count(text)
        served = count(text[:repeated]) if repeated else 0
        stable = text.rfind("\n\n")
        for tally, value in (
            (self.prompt, total),
            (self.cached, served if served >= MIN_CACHED_TOKENS else 0),
            (self.marked, count(text[:stable]) if stable > 0 else 0),
            (self.completion, completion),
        ):
            tally[purpose] = tally.get(purpose, 0) + value


@dataclass(frozen=True, slots=True)
class Rates:
    """USD per token."""

    prompt: float
    completion: float
    cache_read: float
    cache_write: float  # 0: the provider bills no write (OpenAI)

    @classmethod
    def of(cls, litellm: Any, model: str) -> Rates:
        info = litellm.get_model_info(model=model)
        prompt = float(info["input_cost_per_token"])
        return cls(
            prompt,
            float(info["output_cost_per_token"]),
            float(info.get("cache_read_input_token_cost") or prompt),
            float(info.get("cache_creation_input_token_cost") or 0.0),
        )


def cost(prompt: int, cached: int, marked: int, completion: int, rates: Rates) -> dict[str, float]:
    """USD without and with the cache for these token counts."""
    without = prompt * rates.prompt + completion * rates.completion
    written = max(marked - cached, 0) if rates.cache_write else 0
    with_cache = (
        (prompt - cached - written) * rates.prompt
        + cached * rates.cache_read
        + written * rates.cache_write
        + completion * rates.completion
    )
    return {"without_cache": round(without, 4), "with_cache": round(with_cache, 4)}


def costs_per_1000(tally: CacheTally, events: int, litellm: Any) -> dict[str, Any]:
    """Per priced model: the cost of 1,000 events' calls (every purpose), without and with a cache,
    and the share of prompt tokens a cache serves."""
    scale = 1000 / max(events, 1)
    totals = [sum(t.values()) * scale for t in (tally.prompt, tally.cached, tally.marked, tally.completion)]
    prompt, cached, marked, completion = (round(t) for t in totals)
    return {
        "cached_share": round(cached / max(prompt, 1), 3),
        "usd_per_1000_events": {
            model: cost(prompt, cached, marked, completion, Rates.of(litellm, model))
            for model in PRICED_MODELS
        },
    }
