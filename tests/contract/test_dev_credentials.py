"""The throwaway secret a first run shares with `dev-token`: a dead run's file, from a real child
process that has exited, is ignored and replaced, by the run and by `dev-token`."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from pydantic import SecretStr

from service.entrypoints import dev_credentials

SECRET = SecretStr("shared-secret-shared-secret-0123456789")


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_killed_runs_file_is_ignored_and_replaced(tmp_path: Path) -> None:
    path = tmp_path / ".dev-credentials"
    path.write_text(json.dumps({"pid": dead_pid(), "jwt_secret": "old"}))
    path.chmod(0o644)
    assert dev_credentials.running_secret(path) is None
    with dev_credentials.shared(SECRET, path) as sharing:
        assert sharing and stat.S_IMODE(path.stat().st_mode) == 0o600
        assert dev_credentials.running_secret(path) == (os.getpid(), SECRET)


def test_dev_token_ignores_a_killed_runs_file(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / ".dev-credentials").write_text(json.dumps({"pid": dead_pid(), "jwt_secret": "x"}))
    made = subprocess.run(
        [sys.executable, "-m", "service.main", "dev-token", "--user", "42"],
        cwd=tmp_path,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert made.returncode == 2 and "MEMORY_JWT_SECRET is not set" in made.stderr
    assert str(tmp_path / "data" / ".dev-credentials") in made.stderr


def test_a_stale_file_is_replaced_not_written_through(tmp_path: Path) -> None:
    """Another user's file, reached by a hard link, or a planted symbolic link gets no secret."""
    path = tmp_path / ".dev-credentials"
    path.write_text(json.dumps({"pid": dead_pid(), "jwt_secret": "x"}))
    elsewhere = tmp_path / "strangers-copy"
    os.link(path, elsewhere)
    with dev_credentials.shared(SECRET, path) as sharing:
        assert sharing and SECRET.get_secret_value() not in elsewhere.read_text()
    target = tmp_path / "target"
    path.symlink_to(target)
    with dev_credentials.shared(SECRET, path) as sharing:
        assert sharing and not target.exists() and not path.is_symlink()
        assert dev_credentials.running_secret(path) == (os.getpid(), SECRET)
