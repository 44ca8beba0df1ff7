"""The conversation an extraction prompt carries, cut to a token budget.

A turn's facts sit where the user states them, at the head of their message, and where the assistant
concludes, at the end of its reply: the cut keeps those and marks what it left out. A 990 KB event
would otherwise cost some 100K prompt tokens for at most three 120-character facts.

Tokens are estimated, not counted: one per CJK character and one per four other characters, within
a quarter of gpt-4o's tokenizer on prose in Chinese, English or both (up to twice under it on dense
code, so a code-heavy turn may cost up to twice the budget). litellm's tokenizer costs about a
millisecond per 4,000 characters and grows with the event; the estimate is a regex count over a
window of 4 x budget characters, whatever the event's size.
"""

from __future__ import annotations

import re

# CJK ideographs, kana, hangul and their punctuation and full-width forms: about a token each.
_WIDE = re.compile("[\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\ufe30-\ufe4f\uff00-\uffef]")
# Characters per token for the rest: Latin prose; dense code runs nearer two.
_NARROW_CHARS = 4


def cut_mark(chars: int) -> str:
    return f"…[cut {chars} characters]…"


def estimate_tokens(text: str, cap: int) -> int:
    """The estimate, exact up to `cap` and at least `cap` beyond it: no character costs less than
    a quarter of a token, so a window of 4 × cap characters tells them apart."""
    window = text[: cap * _NARROW_CHARS]
    wide = len(_WIDE.findall(window))
    return wide + -(-(len(window) - wide) // _NARROW_CHARS)


def _fitting(text: str, budget: int) -> int:
    """The most leading characters of `text` whose estimate is within `budget` (a binary search:
    each step is one regex count over at most 4 × budget characters)."""
    low, high = min(budget, len(text)), min(budget * _NARROW_CHARS, len(text))
    while low < high:
        middle = (low + high + 1) // 2
        if estimate_tokens(text[:middle], budget + 1) <= budget:
            low = middle
        else:
            high = middle - 1
    return low


def keep_head(text: str, budget: int) -> str:
    """The head of `text` within `budget` tokens, the rest replaced by a mark."""
    if len(text) <= budget or estimate_tokens(text, budget + 1) <= budget:
        return text
    kept = _fitting(text, budget)
    return text[:kept] + cut_mark(len(text) - kept)


def keep_end(text: str, budget: int) -> str:
    """The end of `text` within `budget` tokens, the rest replaced by a mark."""
    if len(text) <= budget or estimate_tokens(text, budget + 1) <= budget:
        return text
    window = text[-budget * _NARROW_CHARS :]
    kept = _fitting(window[::-1], budget)
    return cut_mark(len(text) - kept) + text[len(text) - kept :]


def bound_turn(user: str, assistant: str, budget: int) -> tuple[str, str]:
    """The user's message and the assistant's reply within `budget` tokens together: each gets at
    least half, and what one does not need goes to the other."""
    half = budget // 2
    if len(user) + len(assistant) <= budget:
        return user, assistant  # a token per character at most: no count needed
    user_needs = estimate_tokens(user, budget)
    assistant_needs = estimate_tokens(assistant, budget)
    if user_needs + assistant_needs <= budget:
        return user, assistant
    user_budget = min(user_needs, max(half, budget - assistant_needs))
    return keep_head(user, user_budget), keep_end(assistant, budget - user_budget)
