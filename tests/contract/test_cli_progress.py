"""The long commands keep stdout for their JSON result and write their progress and last line on
stderr. (`dlq replay` is checked against a broker in tests/integration/test_dlq_replay_once.py.)"""

from __future__ import annotations

import json
from pathlib import Path

from tests.contract.test_cli import cli

ROOT = str(Path(__file__).resolve().parents[2])


def test_retention_prints_json_on_stdout_and_its_summary_on_stderr(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'r.db'}"
    env = {"MEMORY_DATABASE_URL": url, "PYTHONPATH": ROOT}  # this checkout's code, run elsewhere
    assert cli("migrate", **env).returncode == 0

    run = cli("retention", **env)

    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["ledger_deleted"] == 0
    [last] = [line for line in run.stderr.splitlines() if line.startswith("mao-memory: retention")]
    assert last.startswith("mao-memory: retention done in ") and "0 ledger rows deleted" in last
