"""The throwaway secret of a `mao-memory run` started without credentials, shared with
`mao-memory dev-token` in the same working directory for as long as that run lives.

The file holds the run's pid and secret, readable by its owner only, and goes when the run ends. A
run killed outright leaves it behind; its pid is gone, so the file is then ignored and replaced.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

from pydantic import SecretStr

PATH = Path("data") / ".dev-credentials"


@contextlib.contextmanager
def shared(secret: SecretStr, path: Path = PATH) -> Iterator[bool]:
    """Share `secret` at `path` while the block runs; yields False, sharing nothing, when a live run
    already shares its own there."""
    if running_secret(path) is not None:
        yield False
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as file:
        os.fchmod(fd, 0o600)  # a stale file keeps its old mode through O_TRUNC
        json.dump({"pid": os.getpid(), "jwt_secret": secret.get_secret_value()}, file)
    try:
        yield True
    finally:
        with contextlib.suppress(OSError):
            path.unlink()


def running_secret(path: Path = PATH) -> tuple[int, SecretStr] | None:
    """The pid and secret of the live run sharing them at `path`, if there is one."""
    try:
        content = json.loads(path.read_text())
        pid, secret = int(content["pid"]), str(content["jwt_secret"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return (pid, SecretStr(secret)) if _alive(pid) else None


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True
