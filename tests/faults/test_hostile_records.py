"""The record fuzz of `tests/integration/test_record_fuzz.py` at the fault suite's example count
(`make faults` sets MEMORY_FUZZ_EXAMPLES), with its row in the report."""

from __future__ import annotations

import pytest

from tests.faults.conftest import Report
from tests.integration.test_record_fuzz import (  # noqa: F401 - the fixture the test needs
    EXAMPLES,
    TALLY,
    pipeline,
)
from tests.integration.test_record_fuzz import (
    test_every_record_ends_exactly_once_and_every_partition_moves_on as test_hostile_records,
)

__all__ = ["test_hostile_records"]
# A batch takes about a second end to end; the suite's per-test limit is meant for single scenarios.
pytestmark = pytest.mark.timeout(1200)


def test_hostile_records_are_reported(report: Report) -> None:
    assert TALLY["batches"] == EXAMPLES, "the fuzz test above did not run every example"
    report.add(
        f"hostile records (hypothesis, {EXAMPLES} batches)",
        events=TALLY["records"],
        faults=TALLY["undecodable_keys"] + TALLY["null_header_values"] + TALLY["dead_lettered"],
        rows_checked=TALLY["records"],
        losses=0,
        note=(
            f"{TALLY['dead_lettered']} dead-lettered once each, {TALLY['undecodable_keys']} with a "
            f"header key that is not UTF-8, {TALLY['null_header_values']} with a null header value, "
            f"{TALLY['extracted']} extracted; consumer alive, every partition committed to its end"
        ),
    )
