"""Token secrets at the command line: a short one stops the process, naming its variable."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize("variable", ["MEMORY_JWT_SECRET", "MEMORY_INTERNAL_TOKEN"])
def test_the_cli_refuses_a_short_secret_naming_the_variable(tmp_path: Path, variable: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "service.main", "api"],
        env={variable: "x", "MEMORY_ENV_FILE": "", "PATH": ""},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert f"{variable}: Value error, must be at least 32 bytes" in result.stderr
