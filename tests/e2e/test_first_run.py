"""`make run` on its embedded defaults, as a newcomer meets it: one credentials story between the run
and `mao-memory dev-token`, and one JSON line per log record."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from service.adapters.db.engine import upgrade_schema
from tests.support.processes import ServiceProcess, free_port

SHARED = Path("data") / ".dev-credentials"


def dev_token(cwd: Path, user: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "service.main", "dev-token", "--user", str(user)],
        cwd=cwd,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def first_run(tmp_path: Path) -> ServiceProcess:
    """`mao-memory run` in a directory of its own: SQLite under ./data, the embedded broker, no secret."""
    upgrade_schema(f"sqlite+aiosqlite:///{tmp_path / 'data' / 'mao-memory.db'}")
    env = {
        "MEMORY_EMBEDDED_KAFKA_PORT": str(free_port()),
        "MEMORY_KAFKA_PARTITIONS": "1",
        "MEMORY_SHUTDOWN_GRACE_S": "1",
    }
    return ServiceProcess("run", env, name="first-run", cwd=tmp_path)


def test_dev_token_signs_with_the_runs_throwaway_secret_while_it_runs(
    first_run: ServiceProcess, tmp_path: Path
) -> None:
    first_run.start()
    try:
        shared = tmp_path / SHARED
        assert stat.S_IMODE(shared.stat().st_mode) == 0o600
        made = dev_token(tmp_path, 42)
        assert made.returncode == 0, made.stderr
        response = httpx.get(
            f"{first_run.base_url}/api/v1/memory/settings",
            headers={"Authorization": f"Bearer {made.stdout.strip()}"},
        )
        assert response.status_code == 200, response.text
        printed = first_run.log_path.read_text()
        assert "mao-memory dev-token --user 42" in printed and str(SHARED) in printed
        elsewhere = dev_token(tmp_path / "data", 42)  # another directory: says where it looked
        assert elsewhere.returncode == 2
        assert str(tmp_path / "data" / SHARED) in elsewhere.stderr
    finally:
        assert first_run.stop() == 0
    assert not shared.exists()  # for that run only
    after = dev_token(tmp_path, 42)
    assert after.returncode == 2 and "MEMORY_JWT_SECRET is not set" in after.stderr
    assert str(shared) in after.stderr


def test_every_log_line_is_json_also_after_readiness_probes(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'memory.db'}"
    upgrade_schema(url)
    service = ServiceProcess("api", {"MEMORY_DATABASE_URL": url}, name="json-logs", cwd=tmp_path).start()
    try:
        for _ in range(2):
            assert httpx.get(f"{service.base_url}/readyz").status_code == 200
    finally:
        assert service.stop() == 0
    lines = service.log_path.read_text().splitlines()
    records = [json.loads(line) for line in lines]  # a plain-text line fails here
    events = [record["event"] for record in records]
    assert any(event.startswith("Uvicorn running on") for event in events), events  # a library's line
    assert "service_started" in events and "service_stopped" in events
