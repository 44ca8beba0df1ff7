"""Which MySQL and Kafka the integration and end-to-end tests use (tests/support/backends.py)."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import make_url

from tests.support.backends import CONTAINERS, LOCAL, BackendError, MySqlServer, choose


def never_asked() -> bool:
    raise AssertionError("the default must not probe for Docker")


@pytest.mark.parametrize("value", [None, "", "  ", "local", "LOCAL"])
def test_the_local_services_are_the_default_and_docker_is_not_asked(value: str | None) -> None:
    env = {} if value is None else {"MEMORY_TEST_BACKEND": value}
    assert choose(env, never_asked) == LOCAL


@pytest.mark.parametrize("value", ["containers", " Containers "])
def test_containers_are_used_when_asked_and_docker_answers(value: str) -> None:
    assert choose({"MEMORY_TEST_BACKEND": value}, lambda: True) == CONTAINERS


def test_containers_without_a_docker_engine_is_an_error_that_says_what_to_do() -> None:
    env = {"MEMORY_TEST_BACKEND": "containers", "DOCKER_HOST": "tcp://127.0.0.1:1"}
    with pytest.raises(BackendError, match=r"no Docker engine answers at tcp://127\.0\.0\.1:1.*unset"):
        choose(env, lambda: False)


def test_an_unknown_backend_is_refused_by_name() -> None:
    with pytest.raises(BackendError, match="'local' or 'containers', not 'docker'"):
        choose({"MEMORY_TEST_BACKEND": "docker"}, never_asked)


def test_a_server_url_carries_any_password_intact() -> None:
    server = MySqlServer("127.0.0.1", 32771, "root", "p@ss:w/rd%")
    url = make_url(server.url("mm_test_1", driver="aiomysql"))
    assert (url.drivername, url.username, url.password, url.host, url.port, url.database) == (
        "mysql+aiomysql",
        "root",
        "p@ss:w/rd%",
        "127.0.0.1",
        32771,
        "mm_test_1",
    )
