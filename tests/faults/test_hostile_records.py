"""The record fuzz of `tests/integration/test_record_fuzz.py` at the fault suite's example count
(`make faults` sets MEMORY_FUZZ_EXAMPLES), with its row in the report."""

from __future__ import annotations

import pytest

from tests.faults.conftest import Report
from tests.integration.test_record_fuzz import (  # noqa: F401 - the fixture the test needs
    EXAMPLES,
    LIES,
    TALLY,
    pipeline,
)
from tests.integration.test_record_fuzz import (
    test_every_offset_of_lying_batches_is_accounted_for_up_to_the_log_end as test_lying_batches,
)
from tests.integration.test_record_fuzz import (
    test_every_record_ends_exactly_once_and_every_partition_moves_on as test_hostile_records,
)

__all__ = ["test_hostile_records", "test_lying_batches"]
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


def test_lying_batches_are_reported(report: Report) -> None:
    assert TALLY["lying_runs"] == EXAMPLES, "the lying-batch fuzz above did not run every example"
    kinds: dict[str, int] = {}
    for kind_codec, sent in LIES.items():
        kind = kind_codec.split("/")[0]
        kinds[kind] = kinds.get(kind, 0) + sent
    report.add(
        f"lying batches (hypothesis, {EXAMPLES} runs)",
        events=TALLY["lying_offsets"],
        faults=TALLY["lying_batches"] - kinds.get("none", 0),
        rows_checked=TALLY["lying_offsets"],
        losses=0,
        note=(
            f"{TALLY['lying_batches']} batches over {len(LIES)} kind/codec pairs ("
            + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))
            + "); every offset up to the log end read or dead-lettered, no commit past it"
        ),
    )
