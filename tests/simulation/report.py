"""`python -m tests.simulation.report`: tests/simulation/REPORT.md from the dialects' results."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.simulation.conftest import SEED
from tests.simulation.driver import IN_FLIGHT_DELETE

OUTPUT = Path("tests/output")
REPORT = Path(__file__).with_name("REPORT.md")


def _report(results: dict[str, dict[str, Any]]) -> str:
    first = next(iter(results.values()))
    lines = [
        "# Long-horizon simulation",
        "",
        f"{first['users']} users × {first['events']} events over a simulated year per dialect, seed {SEED}; "
        "every invariant checked after every step (user action, extraction, consolidation). "
        "SQLite starts from a revision-0001 database holding lookalike twins of every kind, upgraded "
        "to head and checked against migration 0002's precedence first; the user deletes a row the "
        f"model was shown during {IN_FLIGHT_DELETE:.0%} of consolidation calls. Written by `make simulate`.",
        "",
        "| figure | " + " | ".join(results) + " |",
        "|---|" + "---|" * len(results),
    ]

    def row(name: str, value: Any) -> None:
        lines.append(f"| {name} | " + " | ".join(str(value(r)) for r in results.values()) + " |")

    row("wall time (s)", lambda r: r["seconds"])
    row("duplicates (same identity, one group, ACTIVE)", lambda r: r["duplicates"])
    for key in ("inserted", "touched", "updated", "restored", "dropped_no_room"):
        row(f"candidates {key}", lambda r, k=key: r["candidates"][k])
    row("D14 demotions", lambda r: r["demotions"])
    row("consolidation calls", lambda r: r["consolidation_calls"])
    row("rows merged / dropped", lambda r: f"{r['merged_rows']} / {r['dropped_rows']}")
    row("consolidations abandoned as stale", lambda r: r.get("abandoned_stale", 0))
    row(
        "facts ACTIVE before a consolidation checked after it / lost (must be 0)",
        lambda r: f"{r.get('facts_checked', 0)} / {r.get('facts_lost', 0)}",
    )
    row(
        "lookalike twin sets at revision 0001 / rows the upgrade folded",
        lambda r: r.get("twins", "-"),
    )
    row(
        "consolidation results",
        lambda r: ", ".join(f"{k} {v}" for k, v in sorted(r["consolidations"].items())),
    )
    row("events", lambda r: ", ".join(f"{k} {v}" for k, v in sorted(r["outcomes"].items())))
    row(
        "user actions (HTTP status)",
        lambda r: ", ".join(f"{k} {v}" for k, v in sorted(r["user_ops"].items())),
    )
    row(
        "monthly retention (runs, touch rows folded, trails purged, ledger rows deleted)",
        lambda r: ", ".join(
            str(r["retention"].get(k, 0))
            for k in ("runs", "touches_folded", "history_purged", "ledger_deleted")
        ),
    )
    row(
        "prompt tokens per extraction at the fullest comparison sets (10 largest)",
        lambda r: f"{r['largest_prompt_tokens']} ({r['largest_prompt_shown']} memories shown)",
    )
    row(
        "share of an extraction prompt repeating the user's previous prompt as a prefix (mean)",
        lambda r: r.get("prefix_share", "-"),
    )
    row("events skipped for the daily extraction budget", lambda r: r.get("skipped_budget", "-"))
    lines += [
        "",
        "ACTIVE memories per user after each step, by month (mean / largest):",
        "",
        "| month | " + " | ".join(results) + " |",
    ]
    lines.append("|---|" + "---|" * len(results))
    months = sorted({int(m) for r in results.values() for m in r["pool_by_month"]})
    for month in months:
        lines.append(
            f"| {month + 1} | "
            + " | ".join(str(r["pool_by_month"].get(str(month), "")) for r in results.values())
            + " |"
        )
    lines += _prompt_months(results)
    lines += _model_quality(results)
    return "\n".join(lines) + "\n"


def _prompt_months(results: dict[str, dict[str, Any]]) -> list[str]:
    """Prompt tokens per extraction by month, and the share a provider's prompt cache could serve."""
    months = sorted({m for r in results.values() for m in r.get("prompt_tokens_by_month", {})}, key=int)
    lines = [
        "",
        "Prompt tokens per extraction by month (mean / largest, counted with gpt-4o-mini's tokenizer), "
        "then the mean share of a prompt repeating the same user's previous prompt as a prefix:",
        "",
        "| month | " + " | ".join(results) + " |",
        "|---|" + "---|" * len(results),
    ]
    for month in months:
        cells = [
            f"{r['prompt_tokens_by_month'].get(month, '')}, {r['prefix_share_by_month'].get(month, '')}"
            for r in results.values()
        ]
        lines.append(f"| {int(month) + 1} | " + " | ".join(cells) + " |")
    return lines


def _model_quality(results: dict[str, dict[str, Any]]) -> list[str]:
    """Each extraction model's production-quality figures as the admin endpoint gave them at the end."""
    if not any(r.get("model_quality") for r in results.values()):
        return []
    switches = "; ".join(
        f"{dialect}: "
        + ", then ".join(f"{m['model']} from day {m['from_day']:g}" for m in r["extraction_models"])
        for dialect, r in results.items()
        if r.get("extraction_models")
    )
    lines = [
        "",
        "Extraction quality per model at the year's end, as `GET /api/v1/admin/memory/quality` "
        "answered (memories the model's extractions inserted in the last 90 days), checked equal to "
        "the gauges after a refresh and to the driver's own log of the rows each model's extractions "
        "made, the user's dismissals, deletes and edits of them, and the touches read after every step. "
        f"The admin switched the extraction model (D10) in the eleventh month ({switches}); the scripted "
        "model answers the same whatever it is called, so their rejection shares differ by chance alone. "
        "A rejection is the user's first dismiss, delete or edit of the memory within 7 or 30 days of "
        "its insert, out of the memories at least that old (the cohort). Re-confirmed (touched by a "
        "later extraction) has no horizon: the first model's memories, all older, had longer to be touched.",
        "",
        "| dialect | model | created | 7 days: cohort | dismissed / deleted / edited (share) "
        "| 30 days: cohort | dismissed / deleted / edited (share) | re-confirmed (share) | touches |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for dialect, r in results.items():
        for m in r.get("model_quality", {}).get("models", []):
            cells = [dialect, m["model"], str(m["created"])]
            for h in m["within"]:
                rejected = h["rejected"]
                counts = f"{rejected['dismissed']} / {rejected['deleted']} / {rejected['edited']}"
                cells += [str(h["cohort"]), f"{counts} ({_share(h['rejectedRate'])})"]
            cells += [f"{m['reconfirmed']} ({_share(m['reconfirmedRate'])})", str(m["touches"])]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def _share(rate: float | None) -> str:
    return "-" if rate is None else f"{rate:.1%}"


def main() -> None:
    results = {
        path.stem.removeprefix("simulation-"): json.loads(path.read_text())
        for path in sorted(OUTPUT.glob("simulation-*.json"))
    }
    REPORT.write_text(_report(results))
    print(REPORT.read_text())


if __name__ == "__main__":
    main()
