"""The throwaway secret of a `mao-memory run` started without credentials, shared with
`mao-memory dev-token` in the same working directory for as long as that run lives.

The file holds the run's pid and secret, readable by its owner only, and goes when the run ends. The
run holds an exclusive lock on it for its whole life, and a reader trusts the file only while that
lock is held: a pid alone may be reused after a restart. A run killed outright leaves the file
behind unlocked; it is then ignored and replaced by a new file (never rewritten in place, so a file
someone else created, or a link planted at the path, receives nothing). A reader also refuses a
file not owned by its own user or open to group or others.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
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
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # a dead run's file, a stranger's, or a link: replaced, not written through
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:  # another run took the path in between
        yield False
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, json.dumps({"pid": os.getpid(), "jwt_secret": secret.get_secret_value()}).encode())
        yield True
    finally:
        with contextlib.suppress(OSError):
            if os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                path.unlink()
        os.close(fd)  # releases the lock


def running_secret(path: Path = PATH) -> tuple[int, SecretStr] | None:
    """The pid and secret of the live run sharing them at `path`, if there is one."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        status = os.fstat(fd)
        if (
            not stat.S_ISREG(status.st_mode)
            or status.st_uid != os.getuid()
            or status.st_mode & (stat.S_IRWXG | stat.S_IRWXO)
            or not _locked_by_a_run(fd)
        ):
            return None
        with os.fdopen(os.dup(fd)) as file:
            content = json.loads(file.read())
        return int(content["pid"]), SecretStr(str(content["jwt_secret"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    finally:
        os.close(fd)


def _locked_by_a_run(fd: int) -> bool:
    """Whether a run holds the file's lock: taking a shared one without waiting fails."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False
