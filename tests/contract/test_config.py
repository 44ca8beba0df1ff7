"""Configuration that must stop the process at start: the command line names the variable."""

from __future__ import annotations

import subprocess
import sys

from service.config import ENV_FILE_VARIABLE


def test_the_cli_names_the_variable_and_exits_2() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "service.main", "migrate"],
        env={"MEMORY_DEFAULT_MODEL": "x" * 129, ENV_FILE_VARIABLE: "", "PATH": ""},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "MEMORY_DEFAULT_MODEL: String should have at most 128 characters" in result.stderr
