"""The two set-up commands: `make run` installs only what the service needs, visibly, and once;
`make test` (and `.ci/run`'s `make faults` and `make simulate`) add the development tools."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.processes import ROOT


def planned(target: str, venv: Path) -> str:
    """The commands `make <target>` would run (`make -n`) with its virtual environment at `venv`."""
    return subprocess.run(
        ["make", "-n", "-C", str(ROOT), target, f"VENV={venv}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout


def test_a_first_make_run_installs_the_runtime_only_and_shows_it(tmp_path: Path) -> None:
    plan = planned("run", tmp_path / "venv")
    assert "pip install -e ." in plan and "[dev]" not in plan
    assert "--quiet" not in plan and "-q " not in plan
    assert "installing the service's dependencies" in plan


@pytest.mark.parametrize("target", ["install", "test", "faults", "simulate"])
def test_the_other_targets_add_the_development_tools(tmp_path: Path, target: str) -> None:
    assert "pip install -e '.[dev]'" in planned(target, tmp_path / "venv")


def test_a_second_make_run_installs_nothing(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / ".runtime-stamp").touch()  # newer than pyproject.toml: the first run's install
    plan = planned("run", venv)
    assert "pip" not in plan and "mao-memory run" in plan


def test_make_eval_needs_the_runtime_only_and_passes_each_model(tmp_path: Path) -> None:
    plan = subprocess.run(
        ["make", "-n", "-C", str(ROOT), "eval", f"VENV={tmp_path / 'venv'}", "MODELS=openai/a openai/b"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "pip install -e ." in plan and "[dev]" not in plan
    assert "mao-memory eval --model openai/a --model openai/b --out tests/output/eval.json" in plan
