"""The tally of events dead-lettered as `model_rejected` since the extraction model was last set:
what the admin page shows instead of staying silent while a mistyped model rejects every event.

It is kept in the database (one settings row, `memory.extractionModelId.rejections`), so that every
replica adds to one count and every replica's admin page reads it; setting the model removes it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

# The provider's message as kept: enough to tell "model not found" from "invalid key", and the row
# (512 characters) still holds it with the model's name (at most 128).
MAX_ERROR_CHARS = 200
MAX_VALUE_CHARS = 512  # the settings row's value column
# The shortest run of the provider's message found in the conversation or the memories that is
# taken for a quote of them: a provider's refusal may quote what it refused, and the tally names no
# user, so no delete or erasure would ever reach those words.
MIN_QUOTED_CHARS = 4
QUOTE_MARK = "…"


@dataclass(frozen=True, slots=True)
class Rejections:
    """`kind`: "HTTP <status>" as the provider answered, or "rejected" when litellm refused the call
    before sending it."""

    model: str
    count: int
    kind: str
    error: str
    at: datetime


def rejection_kind(status: int | None) -> str:
    return f"HTTP {status}" if status is not None else "rejected"


def counted(
    previous: Rejections | None,
    model: str,
    kind: str,
    error: str,
    at: datetime,
    private: Sequence[str] = (),
) -> Rejections:
    """The tally after one more rejection of `model`. A tally of another model (the setting changed
    while that model's last events were still in flight) starts over: the page speaks of the model
    in use. The error is kept without the kind it may begin with ("HTTP 404 …"), and without any
    quote of the `private` texts the request carried (`unquoted`)."""
    before = previous.count if previous is not None and previous.model == model else 0
    kept = unquoted(error.removeprefix(f"{kind} ")[:MAX_ERROR_CHARS], private)
    return Rejections(model, before + 1, kind, kept, at)


def unquoted(text: str, private: Sequence[str]) -> str:
    """`text` with every run of at least MIN_QUOTED_CHARS characters found in one of `private`
    replaced by one QUOTE_MARK. Only an exact copy is found: a provider that escapes or rewords
    what it quotes is not."""
    kept: list[str] = []
    i = 0
    while i < len(text):
        end = i + MIN_QUOTED_CHARS
        if end > len(text) or not any(text[i:end] in p for p in private):
            kept.append(text[i])
            i += 1
            continue
        while end < len(text) and any(text[i : end + 1] in p for p in private):
            end += 1
        kept.append(QUOTE_MARK)
        i = end
    return "".join(kept)


def shown(tally: Rejections | None, effective_model: str) -> Rejections | None:
    """The tally the admin page shows: only the effective model's."""
    return tally if tally is not None and tally.model == effective_model else None


def encode(tally: Rejections) -> str:
    """The row's value; the error is cut further when JSON's escapes would overflow the column."""
    error = tally.error
    while True:
        fields = {"model": tally.model, "count": tally.count, "kind": tally.kind, "error": error}
        text = json.dumps(fields | {"at": tally.at.isoformat()}, ensure_ascii=False)
        if len(text) <= MAX_VALUE_CHARS or not error:
            return text
        error = error[: len(error) // 2]


def decode(value: str | None) -> Rejections | None:
    """None for no row, an empty one, or one this code cannot read (it is only an indication)."""
    if not value:
        return None
    try:
        data = json.loads(value)
        return Rejections(
            str(data["model"]),
            int(data["count"]),
            str(data["kind"]),
            str(data["error"]),
            datetime.fromisoformat(data["at"]),
        )
    except (ValueError, KeyError, TypeError):
        return None
