"""`mao-memory eval`'s input and output: the labelled cases read from JSON Lines, the comparison
table printed, the reports written as JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from service.core.eval_cases import EvalCase

DEFAULT_CASES = Path("eval/cases")
# The scores the table shows, in order; the JSON holds them all.
_RATIOS = (
    "recall",
    "precision",
    "f1",
    "false_memory_resistance",
    "action_accuracy",
    "dismissed_respected",
    "language_kept",
)


class CasesInvalid(Exception):
    """A case file that does not hold valid cases; the message names the file and line."""


def load_cases(path: Path) -> list[EvalCase]:
    """A `.jsonl` file, or every `*.jsonl` under a directory in name order. Ids and conversations
    are unique across the set: a scripted model tells cases apart by their conversation."""
    files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
    if not files:
        raise CasesInvalid(f"{path}: no *.jsonl case files")
    cases: list[EvalCase] = []
    for file in files:
        for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                cases.append(EvalCase.model_validate_json(line))
            except ValidationError as exc:
                raise CasesInvalid(f"{file}:{number}: {exc}") from None
    for what, key in (("id", lambda c: c.id), ("conversation", lambda c: (c.user, c.assistant))):
        seen: set[object] = set()
        for case in cases:
            if key(case) in seen:
                raise CasesInvalid(f"case {case.id}: its {what} repeats another case's")
            seen.add(key(case))
    return cases


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def _category_cell(scores: Mapping[str, Any]) -> str:
    """Recall / precision / resistance of one category, two decimals each."""
    return "/".join(
        "-" if scores[k] is None else f"{scores[k]:.2f}"
        for k in ("recall", "precision", "false_memory_resistance")
    )


def comparison_table(reports: Sequence[Mapping[str, Any]]) -> str:
    """One column per model: the scores, the update counts, usage, failures, then each category's
    recall / precision / resistance."""
    rows: list[tuple[str, list[str]]] = [("model", [str(r["model"]) for r in reports])]
    rows.append(("cases", [_cell(r["cases"]) for r in reports]))
    rows += [(name, [_cell(r[name]) for r in reports]) for name in _RATIOS]
    rows.append(("update correct/halluc/omitted", [_updates(r["update"]) for r in reports]))
    for name in ("prompt_tokens", "completion_tokens", "cached_tokens", "cost_usd"):
        rows.append((name, [_cell(r[name]) for r in reports]))
    rows.append(
        ("latency p50/p95 s", [f"{_cell(r['latency_p50_s'])}/{_cell(r['latency_p95_s'])}" for r in reports])
    )
    rows.append(("failures", [_failures(r["failures"]) for r in reports]))
    rows.append(("per category: recall/precision/resistance", ["" for _ in reports]))
    # Every model ran the same cases, so every report has the same categories.
    for category in reports[0]["per_category"] if reports else ():
        rows.append((f"  {category}", [_category_cell(r["per_category"][category]) for r in reports]))
    first = max(len(name) for name, _ in rows)
    widths = [max(len(cells[i]) for _, cells in rows) for i in range(len(reports))]
    return "\n".join(
        "  ".join([name.ljust(first), *(c.ljust(w) for c, w in zip(cells, widths, strict=True))]).rstrip()
        for name, cells in rows
    )


def _updates(update: Mapping[str, int]) -> str:
    return f"{update['correct']}/{update['hallucinated']}/{update['omitted']}"


def _failures(failures: Mapping[str, int]) -> str:
    return ", ".join(f"{kind} {count}" for kind, count in failures.items()) or "none"


def write_reports(path: Path, reports: Sequence[dict[str, object]]) -> None:
    """`{"models": [report, …]}`, one report per model in the order of `--model`."""
    path.write_text(
        json.dumps({"models": list(reports)}, ensure_ascii=False, indent=2) + "\n", encoding="utf-8"
    )
