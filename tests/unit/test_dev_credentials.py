"""The throwaway secret a first run shares with `dev-token`: owner-only, for the run's life only."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from pydantic import SecretStr

from service.entrypoints import dev_credentials

SECRET = SecretStr("shared-secret-shared-secret-0123456789")


def test_shared_while_the_block_runs_owner_only_and_gone_after(tmp_path: Path) -> None:
    path = tmp_path / "data" / ".dev-credentials"
    with dev_credentials.shared(SECRET, path) as sharing:
        assert sharing and stat.S_IMODE(path.stat().st_mode) == 0o600
        assert dev_credentials.running_secret(path) == (os.getpid(), SECRET)
    assert not path.exists() and dev_credentials.running_secret(path) is None


def test_a_live_runs_file_is_left_to_it(tmp_path: Path) -> None:
    """A second run in the same directory (which fails on the taken ports) must not take it away."""
    path = tmp_path / ".dev-credentials"
    with dev_credentials.shared(SECRET, path), dev_credentials.shared(SecretStr("other"), path) as second:
        assert not second
        assert dev_credentials.running_secret(path) == (os.getpid(), SECRET)


def test_a_live_pid_without_the_runs_lock_is_not_a_run(tmp_path: Path) -> None:
    """After a restart the dead run's pid may belong to another process: only the lock counts."""
    path = tmp_path / ".dev-credentials"
    path.write_text(json.dumps({"pid": os.getpid(), "jwt_secret": "dead-runs-secret"}))
    path.chmod(0o600)
    assert dev_credentials.running_secret(path) is None
    with dev_credentials.shared(SECRET, path) as sharing:
        assert sharing and dev_credentials.running_secret(path) == (os.getpid(), SECRET)


def test_a_reader_trusts_only_its_own_private_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / ".dev-credentials"
    link = tmp_path / "link"
    link.symlink_to(path)
    with dev_credentials.shared(SECRET, path):
        assert dev_credentials.running_secret(link) is None
        path.chmod(0o640)
        assert dev_credentials.running_secret(path) is None
        path.chmod(0o600)
        assert dev_credentials.running_secret(path) == (os.getpid(), SECRET)
        monkeypatch.setattr(os, "getuid", lambda: path.stat().st_uid + 1)
        assert dev_credentials.running_secret(path) is None
