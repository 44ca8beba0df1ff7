"""schemathesis against the running service's own /openapi.json: no 5xx, every response as documented."""

from __future__ import annotations

import itertools
import json
from collections import Counter

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import negative_data_rejection

from tests.e2e.conftest import INTERNAL_TOKEN, JWT_SECRET
from tests.support.processes import OUTPUT, ServiceProcess
from tests.support.tokens import token

FUZZ_USER = 4_242_424_242
tally: Counter[str] = Counter()


@pytest.fixture(scope="module")
def api_schema(service: ServiceProcess) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(f"{service.base_url}/openapi.json")


def _auth(path: str) -> dict[str, str]:
    if path.startswith("/internal/"):
        return {"Authorization": f"Bearer {INTERNAL_TOKEN}"}
    return {"Authorization": f"Bearer {token(FUZZ_USER, ['memory:read'], secret=JWT_SECRET)}"}


def test_api_conforms_to_its_schema(api_schema: schemathesis.BaseSchema) -> None:
    """Each operation gets its own hypothesis run; every failure is collected, then reported at once."""
    failures: list[str] = []
    for result, mode in itertools.product(
        list(api_schema.get_all_operations()), [GenerationMode.POSITIVE, GenerationMode.NEGATIVE]
    ):
        operation = result.ok()
        # The valid credentials set below replace any credential mutation schemathesis makes, so
        # "invalid request accepted" cannot be judged here; the authorization matrix covers it.
        excluded = [negative_data_rejection] if mode is GenerationMode.NEGATIVE else []

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def run(case: schemathesis.Case) -> None:
            tally[f"{case.method} {case.path}"] += 1
            response = case.call(headers=_auth(case.path))
            tally[f"status {response.status_code}"] += 1
            case.validate_response(response, excluded_checks=excluded)  # noqa: B023 - run() is called at once

        try:
            run()
        except Exception as exc:
            tally["failures"] += 1
            failures.append(f"{mode.value} {operation.method.upper()} {operation.path}: {str(exc)[:2000]}")
    assert not failures, "\n\n".join(failures)


def teardown_module() -> None:
    OUTPUT.mkdir(parents=True, exist_ok=True)
    operations = sorted(k for k in tally if k.split()[0] in {"GET", "POST", "PATCH", "DELETE", "PUT"})
    report = {
        "operations": len(operations),
        "cases": sum(tally[k] for k in operations),
        "failures": tally["failures"],
        "by_status": {k.split()[1]: v for k, v in sorted(tally.items()) if k.startswith("status ")},
    }
    (OUTPUT / "schemathesis.json").write_text(json.dumps(report, indent=2))
