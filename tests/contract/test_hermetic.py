"""The suite is hermetic: a developer's `.env` (docs/api.md's walkthrough writes one), exported
`MEMORY_*` variables and a `make run` in progress change no test's outcome."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import jwt
import pytest

from service.config import Settings
from tests.support.processes import ROOT

DOTENV = {
    "MEMORY_JWT_SECRET": "dotenv-secret-dotenv-secret-0123456789",
    "MEMORY_INTERNAL_TOKEN": "dotenv-internal-token-0123456789",
    "MEMORY_HTTP_PORT": "9999",
    "MEMORY_DEFAULT_MODEL": "openai/dotenv-model",
    "MEMORY_LOG_LEVEL": "ERROR",
}
EXPORTED = {
    "MEMORY_JWT_SECRET": "exported-secret-exported-secret-0123456789",
    "memory_internal_token": "exported-internal-token-0123456789",  # pydantic-settings ignores the case
    "MEMORY_HTTP_PORT": "9998",
    "MEMORY_DEFAULT_MODEL": "openai/exported-model",
    "MEMORY_LLM_TIMEOUT_S": "1",
    # Read by litellm and the HTTP clients rather than by the service's settings.
    "OPENAI_ORG_ID": "org-exported",
    "http_proxy": "http://127.0.0.1:9",
    "HTTPS_PROXY": "http://127.0.0.1:9",
    "LITELLM_LOCAL_MODEL_COST_MAP": "False",
}
# The tests a developer's walkthrough `.env` once broke, and their neighbours.
AFFECTED = [
    "tests/unit/test_auth.py",
    "tests/contract/test_auth.py",
    "tests/unit/test_cli.py",
    "tests/contract/test_cli.py",
    "tests/unit/test_config.py",
    "tests/contract/test_config.py",
    "tests/unit/test_litellm_requests.py",
    "tests/unit/test_llm_failures.py",
]
# A module of the suite that imports litellm when collected, before any test runs.
IMPORTS_LITELLM = """import os

import litellm


def test_importing_litellm_loaded_no_dotenv() -> None:
    assert litellm
    assert not {"MEMORY_JWT_SECRET", "MEMORY_HTTP_PORT"} & set(os.environ)
"""


def developer_shell(**extra: str) -> dict[str, str]:
    """The environment of a developer's shell: without what the suite's conftest sets."""
    suites = {"MEMORY_ENV_FILE", "LITELLM_MODE", "NO_PROXY", "no_proxy"}
    return {k: v for k, v in os.environ.items() if k not in suites} | extra


def checkout_with_venv(tmp_path: Path) -> tuple[Path, Path]:
    """A checkout holding the walkthrough's `.env` and, below it, a venv's litellm (a link to this
    one): where litellm's DEV mode looks for a `.env`."""
    checkout = tmp_path / "checkout"
    site = checkout / ".venv" / "lib" / "site-packages"
    site.mkdir(parents=True)
    spec = importlib.util.find_spec("litellm")
    assert spec is not None and spec.origin is not None
    (site / "litellm").symlink_to(Path(spec.origin).parent)
    (checkout / ".env").write_text("".join(f"{k}={v}\n" for k, v in DOTENV.items()))
    return checkout, site


def test_the_service_importing_litellm_loads_no_dotenv(tmp_path: Path) -> None:
    """`import_litellm()` leaves a stray `.env` beside the venv unread, outside the suite too."""
    checkout, site = checkout_with_venv(tmp_path)
    shell = developer_shell()
    probe = "import os; from service.adapters.llm_client import import_litellm as i; l = i(); "
    probe += "print(l.__file__, os.environ.get('MEMORY_JWT_SECRET'))"
    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=checkout,
        env=shell | {"PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.split()
    assert out == [str(site / "litellm" / "__init__.py"), "None"]


def test_the_hostile_configuration_is_one_the_service_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Outside the suite the dotenv file and the variables do apply, so the next test means something."""
    (tmp_path / ".env").write_text("".join(f"{k}={v}\n" for k, v in DOTENV.items()))
    made = subprocess.run(
        [sys.executable, "-m", "service.main", "dev-token", "--user", "7"],
        cwd=tmp_path,
        env=developer_shell(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    assert jwt.decode(made.stdout.strip(), DOTENV["MEMORY_JWT_SECRET"], algorithms=["HS256"])["sub"] == "7"
    for name, value in EXPORTED.items():
        monkeypatch.setenv(name, value)
    assert Settings().http_port == 9998


def test_a_developers_env_file_and_variables_change_no_test(tmp_path: Path) -> None:
    """The checkout's layout: the `.env` in the directory holding the venv, where `import litellm`
    in its DEV mode would find it, and a collected module importing litellm."""
    checkout, site = checkout_with_venv(tmp_path)
    (checkout / "test_imports_litellm.py").write_text(IMPORTS_LITELLM)
    # A `make run` without a secret, live in this directory, sharing its throwaway secret.
    (checkout / "data").mkdir()
    running = {"pid": os.getpid(), "jwt_secret": "running-secret-running-secret-0123456789"}
    (checkout / "data" / ".dev-credentials").write_text(json.dumps(running))
    shell = developer_shell(**EXPORTED, PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]))
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
            str(checkout / "test_imports_litellm.py"),  # collected first
            *(str(ROOT / path) for path in AFFECTED),
        ],
        cwd=checkout,
        env=shell,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-4000:]
    assert " passed" in run.stdout and "failed" not in run.stdout
