"""What each extraction prompt of the simulation costs: its tokens, and the share of it that repeats
the same user's previous prompt as a prefix (what a provider's prompt cache could serve)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from service.adapters.llm_client import import_litellm

# The tokenizer the figures are counted with, as the unit test of the prompt's overhead counts them.
TOKENS_MODEL = "gpt-4o-mini"


@dataclass(frozen=True, slots=True)
class PromptFigure:
    tokens: int
    prefix_share: float  # 0 for a user's first prompt


class PromptFigures:
    def __init__(self) -> None:
        self._litellm: Any = import_litellm()
        self._previous: dict[int, str] = {}

    def record(self, user_id: int, messages: list[dict[str, str]]) -> PromptFigure:
        text = "\n".join(m["content"] for m in messages)
        previous = self._previous.get(user_id, "")
        self._previous[user_id] = text
        tokens = self._litellm.token_counter(model=TOKENS_MODEL, messages=messages)
        common = text[: common_prefix(previous, text)]
        if not common:
            return PromptFigure(tokens, 0.0)
        count = self._litellm.token_counter
        return PromptFigure(
            tokens, count(model=TOKENS_MODEL, text=common) / count(model=TOKENS_MODEL, text=text)
        )


def common_prefix(a: str, b: str) -> int:
    """The length of the longest common prefix, by halving: each step is one C-speed comparison."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low
