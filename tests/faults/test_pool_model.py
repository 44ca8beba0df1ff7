"""The stateful model of the pool's lifecycle (`tests/integration/test_pool_lifecycle_model.py`) at
the fault suite's example count (`make faults` sets MEMORY_FUZZ_EXAMPLES): a larger count runs
without shrinking, and a failure prints the example it was first found at and its seed."""

from __future__ import annotations

import pytest

from tests.integration.test_pool_lifecycle_model import (  # noqa: F401 - the fixture the test needs
    database_url,
)
from tests.integration.test_pool_lifecycle_model import (
    test_the_pool_rules_hold_for_any_interleaving as test_pool_lifecycle_model,
)

__all__ = ["test_pool_lifecycle_model"]
# About half a second an example on each dialect; the suite's per-test limit is for single scenarios.
pytestmark = pytest.mark.timeout(1200)
