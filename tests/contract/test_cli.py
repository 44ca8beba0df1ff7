"""The command line a newcomer meets first, as a child process: tokens for test users, migrate."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import jwt
from starlette.requests import Request

from service.config import Settings
from service.entrypoints.http.auth import Authenticator
from tests.support.processes import ROOT, MariaDbDatabase, free_port

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
