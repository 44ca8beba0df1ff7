"""Scoring extraction against the labelled set, per fact (after HaluMem, arXiv 2511.03506).

A case's outcome is what the turn wrote to the pool (`Written`), as read back after the real write
path ran; scores compare it with the case's gold facts and distractors. Ratios whose denominator is
zero are None (nothing to judge), never a flattering 1.0 or 0.0.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields

from service.core.conversation_bound import bound_turn
from service.core.eval_cases import EvalCase, Keep, keeps_language
from service.core.model import Action, Scope

# What a turn can do to a row: the write decision's insert, touch, update, and the restore of a
# fact demoted for capacity that came back.
WRITE_ACTIONS = ("insert", "touch", "update", "restore")


@dataclass(frozen=True, slots=True)
class Written:
    """One row the turn changed: `target` is the pool entry's id, None for a row it inserted;
    `content` is the row's content afterwards."""

    action: str
    target: str | None
    content: str
    scope: Scope


@dataclass(frozen=True, slots=True)
class CaseRun:
    case: EvalCase
    written: tuple[Written, ...] = ()
    failure: str | None = None  # the failure's kind when the turn wrote nothing because of it


@dataclass(slots=True)
class Tally:
    """Counts that add up over cases; the ratios are computed from the sums."""

    cases: int = 0
    facts: int = 0
    recalled: int = 0
    written: int = 0
    precise: int = 0
    distractors: int = 0
    distractors_kept: int = 0
    dismissed: int = 0
    dismissed_kept: int = 0
    languages: int = 0
    language_kept: int = 0
    actions_right: int = 0
    update_correct: int = 0
    update_hallucinated: int = 0
    update_omitted: int = 0
    in_conversation: int = 0
    in_prompt: int = 0

    def add(self, other: Tally) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def scores(self) -> dict[str, object]:
        recall, precision = _ratio(self.recalled, self.facts), _ratio(self.precise, self.written)
        return {
            "cases": self.cases,
            "recall": recall,
            "precision": precision,
            "f1": _f1(recall, precision),
            "false_memory_resistance": _share_not(self.distractors_kept, self.distractors),
            "update": {
                "correct": self.update_correct,
                "hallucinated": self.update_hallucinated,
                "omitted": self.update_omitted,
            },
            "action_accuracy": _ratio(self.actions_right, self.recalled),
            "dismissed_respected": _share_not(self.dismissed_kept, self.dismissed),
            "language_kept": _ratio(self.language_kept, self.languages),
            "facts_in_conversation": _ratio(self.in_conversation, self.facts),
            "facts_in_prompt": _ratio(self.in_prompt, self.facts),
        }


def _ratio(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def _share_not(kept: int, whole: int) -> float | None:
    return 1 - kept / whole if whole else None


def _f1(recall: float | None, precision: float | None) -> float | None:
    if recall is None or precision is None:
        return 0.0 if recall == 0 else None
    return 2 * recall * precision / (recall + precision) if recall + precision else 0.0


def _right_action(keep: Keep, written: Written) -> bool:
    return (written.action, written.target, written.scope) == (keep.action.value, keep.target, keep.scope)


def score_case(run: CaseRun, conversation_tokens: int) -> Tally:
    """`conversation_tokens`: the bound the prompt's conversation was cut to; a gold fact whose
    match rule the conversation satisfies before and after the cut counts toward
    `facts_in_conversation` and `facts_in_prompt`, what the cut may cost recall at most."""
    case, written = run.case, run.written
    tally = Tally(cases=1, facts=len(case.keep), written=len(written))
    whole = f"{case.user}\n{case.assistant}"
    sent = "\n".join(bound_turn(case.user, case.assistant, conversation_tokens))
    for keep in case.keep:
        tally.in_conversation += keep.match.matches(whole)
        tally.in_prompt += keep.match.matches(sent)
        hits = [w for w in written if keep.match.matches(w.content)]
        tally.recalled += bool(hits)
        tally.actions_right += any(_right_action(keep, w) for w in hits)
    tally.precise = sum(any(k.match.matches(w.content) for k in case.keep) for w in written)
    for distractor in case.distractors:
        kept = any(distractor.match.matches(w.content) for w in written)
        tally.distractors += 1
        tally.distractors_kept += kept
        if distractor.dismissed:
            tally.dismissed += 1
            tally.dismissed_kept += kept
    worded = [w for w in written if w.action in ("insert", "update")]
    tally.languages = len(worded)
    tally.language_kept = sum(keeps_language(w.content, case.language) for w in worded)
    _score_updates(case, written, tally)
    return tally


def _score_updates(case: EvalCase, written: Sequence[Written], tally: Tally) -> None:
    """Correct: the labelled row now holds the new fact. Omitted: a labelled update that did not
    happen so (the old row kept, a duplicate inserted beside it). Hallucinated: any other update."""
    updates = [w for w in written if w.action == "update"]
    wanted = [k for k in case.keep if k.action is Action.UPDATE]
    correct = {
        i
        for i, w in enumerate(updates)
        if any(_right_action(k, w) and k.match.matches(w.content) for k in wanted)
    }
    done = sum(any(_right_action(k, w) and k.match.matches(w.content) for w in updates) for k in wanted)
    tally.update_correct += done
    tally.update_omitted += len(wanted) - done
    tally.update_hallucinated += len(updates) - len(correct)


@dataclass(slots=True)
class Usage:
    """What the calls cost, from the client's counters; `cost_usd` None when litellm has no price."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: float | None = None
    latencies_s: list[float] = field(default_factory=list)


def percentile(values: Sequence[float], share: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def model_report(
    model: str,
    runs: Iterable[CaseRun],
    usage: Usage,
    conversation_tokens: int,
    item_failures: Mapping[str, int] | None = None,
) -> dict[str, object]:
    """The JSON a model's run produces: the scores over all cases, then per category.
    `item_failures`: items the guards dropped from otherwise usable answers, by kind."""
    total, per_category = Tally(), dict[str, Tally]()
    failures: Counter[str] = Counter({k: n for k, n in (item_failures or {}).items() if n})
    for run in runs:
        tally = score_case(run, conversation_tokens)
        total.add(tally)
        per_category.setdefault(run.case.category.value, Tally()).add(tally)
        if run.failure:
            failures[run.failure] += 1
    return {
        "model": model,
        **total.scores(),
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "cached_tokens": usage.cached_tokens,
        "cost_usd": usage.cost_usd,
        "latency_p50_s": percentile(usage.latencies_s, 0.5),
        "latency_p95_s": percentile(usage.latencies_s, 0.95),
        "failures": dict(sorted(failures.items())),
        "per_category": {name: per_category[name].scores() for name in sorted(per_category)},
    }
