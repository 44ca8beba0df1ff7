"""The suite is hermetic: a developer's `.env` (docs/api.md's walkthrough writes one), exported
`MEMORY_*` variables and a `make run` in progress change no test's outcome."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jwt

from service.config import Settings
from tests.support.processes import ROOT

DOTENV = {
    "MEMORY_JWT_SECRET": "dotenv-secret-dotenv-secret-0123456789",
    "MEMORY_INTERNAL_TOKEN": "dotenv-internal-token",
    "MEMORY_HTTP_PORT": "9999",
    "MEMORY_DEFAULT_MODEL": "openai/dotenv-model",
    "MEMORY_LOG_LEVEL": "ERROR",
}
EXPORTED = {
    "MEMORY_JWT_SECRET": "exported-secret-exported-secret-0123456789",
    "memory_internal_token": "exported-internal-token",  # pydantic-settings ignores the case
    "MEMORY_HTTP_PORT": "9998",
    "MEMORY_DEFAULT_MODEL": "openai/exported-model",
    "MEMORY_LLM_TIMEOUT_S": "1",
}
# The tests a developer's walkthrough `.env` once broke, and their neighbours.
AFFECTED = ["tests/unit/test_auth.py", "tests/unit/test_cli.py", "tests/unit/test_config.py"]


def developer_shell(**extra: str) -> dict[str, str]:
    """The environment of a developer's shell: without the suite's own MEMORY_ENV_FILE."""
    return {k: v for k, v in os.environ.items() if k != "MEMORY_ENV_FILE"} | extra


def test_the_hostile_configuration_is_one_the_service_reads(tmp_path: Path) -> None:
    """Outside the suite the dotenv file and the variables do apply, so the next test means something."""
    (tmp_path / ".env").write_text("".join(f"{k}={v}\n" for k, v in DOTENV.items()))
    made = subprocess.run(
        [sys.executable, "-m", "service.entrypoints.cli", "dev-token", "--user", "7"],
        cwd=tmp_path,
        env=developer_shell(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    assert jwt.decode(made.stdout.strip(), DOTENV["MEMORY_JWT_SECRET"], algorithms=["HS256"])["sub"] == "7"
    os.environ.update(EXPORTED)
    try:
        assert Settings().http_port == 9998
    finally:
        for name in EXPORTED:
            del os.environ[name]


def test_a_developers_env_file_and_variables_change_no_test(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("".join(f"{k}={v}\n" for k, v in DOTENV.items()))
    # A `make run` without a secret, live in this directory, sharing its throwaway secret.
    (tmp_path / "data").mkdir()
    running = {"pid": os.getpid(), "jwt_secret": "running-secret-running-secret-0123456789"}
    (tmp_path / "data" / ".dev-credentials").write_text(json.dumps(running))
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--rootdir={ROOT}",
            f"--config-file={ROOT / 'pyproject.toml'}",
            *(str(ROOT / path) for path in AFFECTED),
        ],
        cwd=tmp_path,
        env=developer_shell(**EXPORTED),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-4000:]
    assert " passed" in run.stdout and "failed" not in run.stdout
