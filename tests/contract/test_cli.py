"""The command line a newcomer meets first, as a child process: tokens for test users, migrate."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import jwt
from starlette.requests import Request

from service.adapters.db.database import Database
from service.adapters.db.engine import build_engine
from service.config import Settings
from service.entrypoints.http.auth import Authenticator
from tests.support.processes import ROOT, MariaDbDatabase, free_port
from tests.support.scripted_llm import ScriptedLlm

SECRET = "cli-secret-cli-secret-cli-secret-0123456789"


def cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The command line in a child process, on the suite's environment (tests/conftest.py) plus `env`,
    in an empty directory: no `.env`, no local run's throwaway credentials. The checkout's `service`
    is imported (PYTHONPATH), not whichever one the environment has installed."""
    with tempfile.TemporaryDirectory() as cwd:
        return subprocess.run(
            [sys.executable, "-m", "service.main", *args],
            env={**os.environ, "PYTHONPATH": str(ROOT), **env},
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )


def caller(settings: Settings, token: str) -> tuple[int, frozenset[str]]:
    request = Request({"type": "http", "headers": [(b"authorization", f"Bearer {token}".encode())]})
    found = Authenticator(settings).caller(request)
    return found.user_id, found.permissions


def test_dev_token_prints_a_token_the_service_accepts() -> None:
    made = cli("dev-token", "--user", "42", "--admin", MEMORY_JWT_SECRET=SECRET, MEMORY_JWT_ISSUER="mao")
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    assert jwt.decode(token, SECRET, algorithms=["HS256"], issuer="mao")["sub"] == "42"
    settings = Settings(_env_file=None, jwt_secret=SECRET, jwt_issuer="mao")  # type: ignore[call-arg]
    assert caller(settings, token) == (42, frozenset({"memory:read", "memory:admin"}))
    plain = cli("dev-token", "--user", "7", MEMORY_JWT_SECRET=SECRET).stdout.strip()
    assert caller(Settings(_env_file=None, jwt_secret=SECRET), plain) == (7, frozenset())  # type: ignore[call-arg]


def test_dev_token_without_a_secret_says_what_is_missing() -> None:
    made = cli("dev-token", "--user", "42")
    assert made.returncode == 2 and "MEMORY_JWT_SECRET is not set" in made.stderr


def test_migrate_says_what_it_did(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'm.db'}"
    first, second = cli("migrate", MEMORY_DATABASE_URL=url), cli("migrate", MEMORY_DATABASE_URL=url)
    assert first.returncode == second.returncode == 0, first.stderr
    assert "schema migrated from nothing to revision" in first.stdout
    assert "schema already at revision" in second.stdout


def test_migrate_on_a_missing_database_says_how_to_create_it(mariadb: MariaDbDatabase) -> None:
    server = mariadb.server
    missing = f"mm_missing_{uuid.uuid4().hex[:8]}"
    made = cli("migrate", MEMORY_DATABASE_URL=server.url(missing))
    assert made.returncode == 1 and made.stdout == ""
    assert made.stderr.splitlines() == [
        f'mao-memory: database "{missing}" does not exist on {server.host}:{server.port}; create it '
        f"with: CREATE DATABASE `{missing}` CHARACTER SET utf8mb4"
    ]


def test_migrate_on_an_unreachable_server_says_so_in_one_line() -> None:
    port = free_port()
    made = cli("migrate", MEMORY_DATABASE_URL=f"mysql+aiomysql://root@127.0.0.1:{port}/mm")
    assert made.returncode == 1 and len(made.stderr.splitlines()) == 1
    assert made.stderr.startswith(f"mao-memory: cannot use the database on 127.0.0.1:{port}: (2003")


def migrated(tmp_path: Path) -> str:
    url = f"sqlite+aiosqlite:///{tmp_path / 'settings.db'}"
    assert cli("migrate", MEMORY_DATABASE_URL=url).returncode == 0
    return url


def test_settings_set_model_refuses_a_name_litellm_maps_to_no_provider(tmp_path: Path) -> None:
    url = migrated(tmp_path)
    refused = cli("settings", "set-model", "gtp-4o-mini", MEMORY_DATABASE_URL=url)
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.startswith("mao-memory: litellm maps 'gtp-4o-mini' to no provider")
    assert len(refused.stderr.splitlines()) == 1
    read = cli("settings", "get", MEMORY_DATABASE_URL=url, MEMORY_DEFAULT_MODEL="openai/the-default")
    assert read.returncode == 0, read.stderr
    assert json.loads(read.stdout) == {
        "extractionModelId": "",
        "effectiveModel": "openai/the-default",
        "rejections": None,
    }


def test_settings_set_model_with_a_probe_refuses_a_model_that_fails_and_sets_one_that_answers(
    tmp_path: Path, llm: ScriptedLlm
) -> None:
    url = migrated(tmp_path)
    env = {"MEMORY_DATABASE_URL": url, "MEMORY_LLM_API_BASE": llm.api_base, "MEMORY_LLM_TIMEOUT_S": "5"}
    llm.script("Reply: OK", status=404, only_if=lambda r: r.model == "qwen2.5:3bb")
    refused = cli("settings", "set-model", "openai/qwen2.5:3bb", "--probe", **env)
    assert refused.returncode == 1, refused.stderr
    assert refused.stderr.splitlines()[-1].startswith(
        "mao-memory: 'openai/qwen2.5:3bb' failed a test call (rejected): HTTP 404"
    )
    set_ = cli("settings", "set-model", "openai/qwen2.5:3b", "--probe", **env)
    assert set_.returncode == 0, set_.stderr
    assert json.loads(set_.stdout) == {
        "previous": "",
        "extractionModelId": "openai/qwen2.5:3b",
        "effectiveModel": "openai/qwen2.5:3b",
        "rejections": None,
    }
    assert [r.model for r in llm.requests] == ["qwen2.5:3bb", "qwen2.5:3b"]
    assert json.loads(cli("settings", "get", **env).stdout)["extractionModelId"] == "openai/qwen2.5:3b"


async def test_settings_get_shows_the_model_rejected_dead_letters_since_the_model_was_set(
    tmp_path: Path,
) -> None:
    url = migrated(tmp_path)
    assert cli("settings", "set-model", "openai/typo", MEMORY_DATABASE_URL=url).returncode == 0
    db = Database(build_engine(url, 1))
    try:
        for _ in range(3):
            async with db.transaction() as uow:
                await uow.accounts.count_model_rejection(
                    "openai/typo", "HTTP 404", "model not found", db.now()
                )
                await uow.commit()
    finally:
        await db.dispose()
    read = json.loads(cli("settings", "get", MEMORY_DATABASE_URL=url).stdout)
    assert read["rejections"]["count"] == 3 and read["rejections"]["lastErrorKind"] == "HTTP 404"
    assert read["rejections"]["lastError"] == "model not found"
