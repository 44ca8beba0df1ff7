"""Which MySQL and Kafka the integration and end-to-end tests use (tests/support/backends.py), on real
sockets: a Docker engine asked where nothing listens, the local broker given a free port."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support import backends
from tests.support.backends import BackendError, MySqlServer, docker_answers
from tests.support.processes import TansuBroker, free_port


@pytest.fixture
def fresh_choice() -> Iterator[None]:
    backends.backend.cache_clear()
    yield
    backends.backend.cache_clear()


def test_docker_answers_is_false_where_nothing_listens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"tcp://127.0.0.1:{free_port()}")
    assert docker_answers() is False


def test_the_run_refuses_containers_here_rather_than_falling_back(
    monkeypatch: pytest.MonkeyPatch, fresh_choice: None
) -> None:
    monkeypatch.setenv("MEMORY_TEST_BACKEND", "containers")
    monkeypatch.setenv("DOCKER_HOST", f"tcp://127.0.0.1:{free_port()}")
    with pytest.raises(BackendError):
        backends.backend()


def test_the_local_choice_gives_tansu_and_the_configured_mariadb(
    monkeypatch: pytest.MonkeyPatch, fresh_choice: None
) -> None:
    monkeypatch.delenv("MEMORY_TEST_BACKEND", raising=False)
    assert isinstance(backends.session_broker(), TansuBroker)
    env = {"MEMORY_TEST_MYSQL_HOST": "db.internal", "MEMORY_TEST_MYSQL_PORT": "3307"}
    assert backends.local_mysql(env) == MySqlServer("db.internal", 3307, "root", "")
