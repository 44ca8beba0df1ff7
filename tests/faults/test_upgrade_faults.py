"""The upgrade property of `tests/integration/test_upgrade_property.py` at the fault suite's example
count (`make faults` sets MEMORY_FUZZ_EXAMPLES), with its row in the report."""

from __future__ import annotations

import pytest

from tests.faults.conftest import Report
from tests.integration.test_upgrade_property import (  # noqa: F401 - the fixture the test needs
    EXAMPLES,
    MARIADB_EXAMPLES,
    TALLY,
    templates,
)
from tests.integration.test_upgrade_property import (
    test_mariadb_pools_upgrade_as_the_reference_folds as test_mariadb_upgrades,
)
from tests.integration.test_upgrade_property import (
    test_sqlite_pools_upgrade_as_the_reference_folds as test_sqlite_upgrades,
)

__all__ = ["test_mariadb_upgrades", "test_sqlite_upgrades"]
# An example migrates a database through up to seven revisions: about 0.2 s on SQLite, 1 s on MariaDB.
pytestmark = pytest.mark.timeout(1200)


def test_upgrades_are_reported(report: Report) -> None:
    assert TALLY["examples"] >= EXAMPLES + MARIADB_EXAMPLES, (
        "the property tests above did not run every example"
    )
    report.add(
        f"upgrades from any revision (hypothesis, {EXAMPLES} pools on SQLite, {MARIADB_EXAMPLES} on MariaDB)",
        events=TALLY["examples"],
        faults=TALLY["reused ids"],
        rows_checked=TALLY["rows"],
        losses=0,
        note=(
            f"{TALLY['twins folded']} twins folded, {TALLY['facts ACTIVE']} facts ACTIVE and"
            f" {TALLY['facts DISMISSED']} DISMISSED after the upgrade, each as the reference fold gives"
        ),
    )
