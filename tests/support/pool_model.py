"""The plain-Python reference of a pool's rules that the stateful lifecycle test checks the database
against (issue 39): a memory's history replayed to its state, the per-user extraction budget, and the
scripted model's answers to extraction and consolidation prompts in the format the request asked for."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from service.core import consolidation as c
from service.core import extraction_prompt as e
from tests.support.scripted_llm import Request

GONE = ("gone", "")
# What each history action makes of a memory's (status, content); None: the action's new text, if any.
_STATUS = {
    "insert": "ACTIVE",
    "create": "ACTIVE",
    "restore": "ACTIVE",
    "dismiss": "DISMISSED",
    "demote": "DISMISSED",
    "delete": "gone",
    "drop": "gone",
}


@dataclass(frozen=True)
class Replayed:
    state: tuple[str, str]  # (status, content), or GONE
    erased: bool  # some row of the trail lost its words to a delete: only "gone" is checkable


def replay(trail: Iterable[Mapping[str, Any]], start: tuple[str, str] | None) -> Replayed:
    """Folds one memory's history, oldest first, from `start` (a row seeded without history)."""
    state, erased = start or GONE, False
    for row in trail:
        action, old, new = row["action"], row["old_content"], row["new_content"]
        erased = erased or row["content_erased_at"] is not None
        if action == "merge":  # the new row of a merge has no old text; a merged-away source has
            state = ("ACTIVE", new) if old is None and not erased else GONE
            continue
        status = _STATUS.get(action, state[0])
        state = (status, state[1] if new is None else new) if status != "gone" else GONE
    return Replayed(state, erased)


@dataclass
class Budget:
    """The per-user extraction budget's rule: an event is admitted while fewer than `per_day` of the
    user's extractions are at most 24 hours old, and refused only when that many are."""

    per_day: int
    extractions: list[datetime] = field(default_factory=list)

    def spent(self, now: datetime) -> int:
        return sum(at >= now - timedelta(hours=24) for at in self.extractions)

    def admits(self, now: datetime) -> bool:
        return self.spent(now) < self.per_day

    def extracted(self, now: datetime) -> None:
        assert self.admits(now), f"an extraction past the budget of {self.per_day} a day"
        self.extractions.append(now)


def formatted(request: Request) -> bool:
    return request.body.get("response_format") is not None


def extraction_answer(request: Request, items: list[dict[str, Any]]) -> str:
    """The model's answer: `items` with each `existingId` pick mapped onto the prompt's own aliases
    (a pick past them stays, an unknown id). Forced into an object while the prompt asked for a bare
    array, it wraps the list under a key of its own choosing, as a real model does."""
    shown = [row["id"] for row in request.data["existing"]]
    answer = [
        {**item, "existingId": shown[item["existingId"] % len(shown)]}
        if "existingId" in item and shown and item["existingId"] < 1000
        else item
        for item in items
    ]
    wrapped = e.WRAPPED in request.text
    body: object = {"memories": answer} if wrapped else ({"facts": answer} if formatted(request) else answer)
    return json.dumps(body, ensure_ascii=False)


@dataclass(frozen=True)
class PlanOp:
    op: str  # merge, keep or drop
    picks: tuple[int, ...]  # from the oldest row shown if >= 0, from the newest if < 0
    content: str | None = None


def consolidation_answer(request: Request, plan: list[PlanOp]) -> tuple[str, list[dict[str, Any]]]:
    """The plan in aliases of the prompt (an op whose picks repeat an alias keeps it once), and the
    rows shown (alias and content)."""
    shown = request.data["memories"]
    ops = []
    for op in plan:
        aliases = list(dict.fromkeys(shown[p % len(shown)]["id"] for p in op.picks))
        ops.append({"op": op.op, "sourceIds": aliases, "content": op.content})
    wrapped = c.WRAPPED in request.text
    body: object = {"operations": ops} if wrapped else ({"plan": ops} if formatted(request) else ops)
    return json.dumps(body, ensure_ascii=False), shown
