"""`tests/unit` stays pure: a test here that starts a process or opens a connection fails at once,
and belongs in `tests/contract` or `tests/integration` (docs/testing.md)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest


class ImpureUnitTest(AssertionError):
    pass


def _refuse(what: str) -> Any:
    def refused(*_args: Any, **_kwargs: Any) -> Any:
        raise ImpureUnitTest(f"a unit test must not {what}: move it to tests/contract or tests/integration")

    return refused


@pytest.fixture(autouse=True)
def _pure(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(subprocess.Popen, "__init__", _refuse("start a process"))
    monkeypatch.setattr(asyncio, "create_subprocess_exec", _refuse("start a process"))
    monkeypatch.setattr(asyncio, "create_subprocess_shell", _refuse("start a process"))
    monkeypatch.setattr(os, "fork", _refuse("fork"))
    monkeypatch.setattr(socket.socket, "connect", _refuse("connect a socket"))
    monkeypatch.setattr(socket.socket, "connect_ex", _refuse("connect a socket"))
    monkeypatch.setattr(socket.socket, "bind", _refuse("bind a socket"))
    yield
