"""What 1,000 events' model calls cost at list prices, with and without a provider's prompt cache.

Bench case 10 passes every call's prompt, per purpose, through a model of each provider's cache and
counts the prompt tokens it reads from the cache and writes to it; priced from litellm's cost map:
- without a cache, every prompt token at the input rate;
- OpenAI (automatic cache): the prompt's longest common prefix with a recent prompt is read at the
  cache-read rate, from 1,024 tokens on and in steps of 128 (a shorter repeat is billed whole); no
  write is billed;
- Anthropic (marked cache): a request marks prefixes with `cache_control`, as the service marks them
  (`cache_marked`: the rules, the USER block, the frozen blocks, everything before the conversation).
  It writes the prefix up to each mark and reads the longest prefix, ending at one of its blocks, that
  an earlier request wrote at a mark; the read part is billed at the cache-read rate, the rest up to
  the last mark as a write (the 5-minute cache's write rate, 1.25× the input rate), what follows the
  last mark at the input rate. A mark whose prefix is under the model's minimum (Claude Haiku 4.5:
  4,096 tokens) caches nothing: at a full pool, the USER block's (some 2,700 tokens).
A cache holds what the last `RECENT_PROMPTS` prompts of a purpose wrote or read (an Anthropic read
keeps its entry alive). Tokens are counted with one tokenizer (`count`) for both providers, though
Claude's own counts differ.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from service.adapters.litellm_requests import cache_marked
from tests.simulation.prompts import common_prefix

# OpenAI's automatic cache: the shortest prefix it serves, and the step of the prefixes it serves.
AUTOMATIC_MIN_TOKENS, AUTOMATIC_STEP = 1024, 128
# The shortest prefix Anthropic caches at a mark for Claude Haiku 4.5 (Sonnet 4.5's: 1,024).
MARKED_MIN_TOKENS = 4096
# Prompts a cache still holds when a user's next one comes (a few minutes of a busy stream).
RECENT_PROMPTS = 64

Counts = Callable[[str], int]


class PromptCache(Protocol):
    def use(self, messages: list[dict[str, str]], text: str, count: Counts) -> tuple[int, int]:
        """The prompt tokens read from the cache and written to it; `text` is the messages joined."""
        ...


@dataclass
class AutomaticCache:
    """OpenAI's: the longest prefix shared with a recent prompt, without being asked."""

    _recent: list[str] = field(default_factory=list)

    def use(self, messages: list[dict[str, str]], text: str, count: Counts) -> tuple[int, int]:
        repeated = max((common_prefix(text, before) for before in self._recent), default=0)
        self._recent.append(text)
        del self._recent[:-RECENT_PROMPTS]
        read = count(text[:repeated]) if repeated else 0
        return (read - read % AUTOMATIC_STEP if read >= AUTOMATIC_MIN_TOKENS else 0), 0


@dataclass
class MarkedCache:
    """Anthropic's: only prefixes ending at a mark of the request, as the service marks it."""

    # Per recent prompt, the prefixes it wrote or read and their tokens (a held prefix is not recounted).
    _recent: list[dict[str, int]] = field(default_factory=list)

    def use(self, messages: list[dict[str, str]], text: str, count: Counts) -> tuple[int, int]:
        ends, marks = block_ends(messages)
        if not marks:
            return 0, 0
        held = {prefix: tokens for kept in self._recent for prefix, tokens in kept.items()}
        prefixes = {end: text[:end] for end in ends if end <= marks[-1]}
        hit = max((prefix for prefix in prefixes.values() if prefix in held), key=len, default="")
        marked = {prefixes[end]: held.get(prefixes[end]) or count(prefixes[end]) for end in marks}
        written = {prefix: tokens for prefix, tokens in marked.items() if tokens >= MARKED_MIN_TOKENS}
        read = held.get(hit, 0)
        self._recent.append(written | ({hit: read} if hit else {}))
        del self._recent[:-RECENT_PROMPTS]
        return read, max(max(written.values(), default=0) - read, 0)


def block_ends(messages: list[dict[str, str]]) -> tuple[list[int], list[int]]:
    """Where the request's content blocks end in the messages joined by line breaks, and which of
    those ends the request marks for the cache (`cache_marked`)."""
    ends: list[int] = []
    marks: list[int] = []
    start = 0
    for message in cache_marked(messages):
        content = message["content"]
        for block in [{"text": content}] if isinstance(content, str) else content:
            start += len(block["text"])
            ends.append(start)
            if "cache_control" in block:
                marks.append(start)
        start += 1
    return ends, marks


# The models case 10 prices: OpenAI's automatic cache, Anthropic's marked one.
PRICED_MODELS: dict[str, Callable[[], PromptCache]] = {
    "gpt-4o-mini": AutomaticCache,
    "claude-haiku-4-5": MarkedCache,
}


@dataclass
class CacheTally:
    """Per purpose: prompt and completion tokens; per priced model and purpose, the prompt tokens its
    cache read and wrote."""

    prompt: Counter[str] = field(default_factory=Counter)
    completion: Counter[str] = field(default_factory=Counter)
    read: defaultdict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    written: defaultdict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    _caches: dict[tuple[str, str], PromptCache] = field(default_factory=dict)

    def record(
        self, purpose: str, messages: Sequence[dict[str, str]], completion: int, count: Counts
    ) -> None:
        """One call: `count` is the tokenizer (tokens of a text)."""
        text = "\n".join(m["content"] for m in messages)
        self.prompt[purpose] += count(text)
        self.completion[purpose] += completion
        for model, make in PRICED_MODELS.items():
            cache = self._caches.setdefault((model, purpose), make())
            read, written = cache.use(list(messages), text, count)
            self.read[model][purpose] += read
            self.written[model][purpose] += written


@dataclass(frozen=True, slots=True)
class Rates:
    """USD per token."""

    prompt: float
    completion: float
    cache_read: float
    cache_write: float  # a write the map does not price (OpenAI bills none) at the input rate

    @classmethod
    def of(cls, litellm: Any, model: str) -> Rates:
        info = litellm.get_model_info(model=model)
        prompt = float(info["input_cost_per_token"])
        return cls(
            prompt,
            float(info["output_cost_per_token"]),
            float(info.get("cache_read_input_token_cost") or prompt),
            float(info.get("cache_creation_input_token_cost") or prompt),
        )


def cost(prompt: int, read: int, written: int, completion: int, rates: Rates) -> dict[str, float]:
    """USD without and with the cache for these token counts."""
    without = prompt * rates.prompt + completion * rates.completion
    with_cache = (
        (prompt - read - written) * rates.prompt
        + read * rates.cache_read
        + written * rates.cache_write
        + completion * rates.completion
    )
    return {"without_cache": round(without, 4), "with_cache": round(with_cache, 4)}


def costs_per_1000(tally: CacheTally, events: int, litellm: Any) -> dict[str, Any]:
    """Per priced model: the cost of 1,000 events' calls (every purpose), without and with its
    cache, and the shares of prompt tokens the cache read and wrote."""
    scale = 1000 / max(events, 1)

    def per_1000(counts: Counter[str]) -> int:
        return round(sum(counts.values()) * scale)

    prompt, completion = per_1000(tally.prompt), per_1000(tally.completion)
    read = {model: per_1000(tally.read[model]) for model in PRICED_MODELS}
    written = {model: per_1000(tally.written[model]) for model in PRICED_MODELS}
    return {
        "read_share": {model: round(read[model] / max(prompt, 1), 3) for model in PRICED_MODELS},
        "written_share": {model: round(written[model] / max(prompt, 1), 3) for model in PRICED_MODELS},
        "usd_per_1000_events": {
            model: cost(prompt, read[model], written[model], completion, Rates.of(litellm, model))
            for model in PRICED_MODELS
        },
    }
