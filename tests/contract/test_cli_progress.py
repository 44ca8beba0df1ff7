"""The long commands write their progress on stderr: migrate a line per revision applied, retention
its figures' JSON on stdout and a last line on stderr. (`dlq replay` is checked against a broker in
tests/integration/test_dlq_replay_once.py.)"""

from __future__ import annotations

import json
from pathlib import Path

from service.adapters.db.engine import SCHEMA_HEAD
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


def test_migrate_names_each_revision_it_applies_on_stderr(tmp_path: Path) -> None:
    env = {"MEMORY_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'm.db'}", "PYTHONPATH": ROOT}

    first, again = cli("migrate", **env), cli("migrate", **env)

    assert first.returncode == 0, first.stderr
    applied = [line for line in first.stderr.splitlines() if line.startswith("mao-memory: migrate:")]
    assert (
        applied[0] == "mao-memory: migrate: revision 0001 applied" and len(applied) == len(set(applied)) > 1
    )
    assert applied[-1] == f"mao-memory: migrate: revision {SCHEMA_HEAD} applied"
    assert "migrate:" not in again.stderr and "already at revision" in again.stdout
