"""Scripted extraction models for the eval harness, answering each labelled case from its labels.

One responder serves three models, told apart by the request's model name:
- `oracle` answers the gold facts with the gold action and target;
- `empty` answers [] to everything;
- `sloppy` restates stored facts as new inserts, keeps the distractors (the reworded dismissed facts
  among them) after the gold facts, and otherwise answers like the oracle.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from service.core.eval_cases import EvalCase, Keep
from service.core.model import MAX_EXTRACTED_ITEMS, Action
from tests.support.scripted_llm import Request

ORACLE, EMPTY, SLOPPY = "oracle", "empty", "sloppy"
RESTATED = {"zh": "用户再次确认：", "mixed": "用户再次确认：", "en": "Restated: "}


def _item(keep: Keep, aliases: dict[str, int], case: EvalCase) -> dict[str, Any]:
    target = next((p for p in case.pool if p.id == keep.target), None)
    return {
        "type": keep.scope.value.lower(),
        "action": keep.action.value,
        "existingId": None if target is None else aliases[target.content],
        "content": None if keep.action is Action.TOUCH else keep.example,
    }


def oracle_answer(case: EvalCase, aliases: dict[str, int]) -> list[dict[str, Any]]:
    return [_item(keep, aliases, case) for keep in case.keep]


def sloppy_answer(case: EvalCase, aliases: dict[str, int]) -> list[dict[str, Any]]:
    items = []
    for keep in case.keep:
        if keep.action is Action.TOUCH:
            # A restatement stored beside the fact it restates, as a new row.
            items.append(
                {
                    "type": keep.scope.value.lower(),
                    "action": "insert",
                    "content": RESTATED[case.language] + keep.example,
                }
            )
        else:
            items.append(_item(keep, aliases, case))
    scope = "project" if case.project_key else "user"
    items += [{"type": scope, "action": "insert", "content": d.example} for d in case.distractors]
    return items[:MAX_EXTRACTED_ITEMS]


def responder(cases: Sequence[EvalCase]) -> Callable[[Request], str]:
    by_turn = {(c.user, c.assistant): c for c in cases}
    answers = {ORACLE: oracle_answer, SLOPPY: sloppy_answer}

    def respond(request: Request) -> str:
        data = request.data
        answer = answers.get(request.model)
        if answer is None:
            return "[]"
        case = by_turn[(data["conversation"]["user"], data["conversation"]["assistant"])]
        aliases = {row["content"]: row["id"] for row in data["existing"]}
        return json.dumps(answer(case, aliases), ensure_ascii=False)

    return respond
