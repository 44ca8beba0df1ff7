"""The fault suite writes tests/faults/REPORT.md from what its scenarios measured."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.e2e.conftest import producer  # noqa: F401 - fixtures shared with the end-to-end tests
from tests.integration.conftest import HandlerFactory, llm_client, make_handler, metrics  # noqa: F401

REPORT = Path(__file__).resolve().parent / "REPORT.md"


@dataclass
class Scenario:
    name: str
    events: int = 0
    faults: int = 0
    rows_checked: int = 0
    losses: int = 0
    note: str = ""


@dataclass
class Report:
    scenarios: list[Scenario] = field(default_factory=list)
    outcomes: dict[str, str] = field(default_factory=dict)

    def add(self, name: str, **figures: object) -> Scenario:
        scenario = Scenario(name, **figures)  # type: ignore[arg-type]
        self.scenarios.append(scenario)
        return scenario

    def write(self) -> None:
        passed = sum(v == "passed" for v in self.outcomes.values())
        lines = [
            "# Fault suite report",
            "",
            f"Produced by `make faults` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
            f"{len(self.outcomes)} tests, {passed} passed, {len(self.outcomes) - passed} failed.",
            "",
            "| scenario | events | faults injected | rows checked | losses found | note |",
            "|---|---|---|---|---|---|",
            *[
                f"| {s.name} | {s.events} | {s.faults} | {s.rows_checked} | {s.losses} | {s.note} |"
                for s in self.scenarios
            ],
            "",
            "| test | result |",
            "|---|---|",
            *[f"| `{name}` | {outcome} |" for name, outcome in sorted(self.outcomes.items())],
            "",
        ]
        REPORT.write_text("\n".join(lines))


_report = Report()


@pytest.fixture(scope="session")
def report() -> Iterator[Report]:
    yield _report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        _report.outcomes[report.nodeid.split("::", 1)[1]] = report.outcome


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _report.outcomes:
        _report.write()
