"""Where the integration and end-to-end tests find MySQL and Kafka.

`local` (the default): the MariaDB on MEMORY_TEST_MYSQL_HOST:MEMORY_TEST_MYSQL_PORT (127.0.0.1:3306,
root without a password) and a Tansu broker started per session. `containers`
(`MEMORY_TEST_BACKEND=containers`): MySQL 8 and Apache Kafka (Confluent's image, KRaft) started
through testcontainers, for a laptop with a Docker engine and no local MariaDB. Asking for
containers where no Docker engine answers is an error, never a silent fall back to local services.
"""

from __future__ import annotations

import atexit
import functools
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import quote

import pymysql

LOCAL = "local"
CONTAINERS = "containers"
MYSQL_IMAGE = "mysql:8.0"
KAFKA_IMAGE = "confluentinc/cp-kafka:7.6.0"
_MYSQL_PASSWORD = "test"


class BackendError(Exception):
    """The requested test backend cannot be used; the message says what to change."""


def choose(env: Mapping[str, str], docker_answers: Callable[[], bool]) -> str:
    value = env.get("MEMORY_TEST_BACKEND", "").strip().lower() or LOCAL
    if value == LOCAL:
        return LOCAL
    if value != CONTAINERS:
        raise BackendError(f"MEMORY_TEST_BACKEND must be {LOCAL!r} or {CONTAINERS!r}, not {value!r}")
    if not docker_answers():
        where = env.get("DOCKER_HOST", "the default socket")
        raise BackendError(
            f"MEMORY_TEST_BACKEND=containers, but no Docker engine answers at {where}; start Docker, "
            "or unset MEMORY_TEST_BACKEND to use the local MariaDB and Tansu"
        )
    return CONTAINERS


def docker_answers() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=5)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


@functools.cache
def backend() -> str:
    return choose(os.environ, docker_answers)


@dataclass(frozen=True)
class MySqlServer:
    host: str
    port: int
    user: str = "root"
    password: str = ""

    def url(self, database: str, driver: str = "asyncmy") -> str:
        return (
            f"mysql+{driver}://{quote(self.user)}:{quote(self.password)}@{self.host}:{self.port}/{database}"
        )

    def connect(self, **kwargs: object) -> pymysql.connections.Connection:  # type: ignore[type-arg]
        return pymysql.connect(
            host=self.host,
            port=self.port,
            user=self.user,
            password=self.password,
            **kwargs,  # type: ignore[arg-type]
        )


def local_mysql(env: Mapping[str, str]) -> MySqlServer:
    return MySqlServer(
        env.get("MEMORY_TEST_MYSQL_HOST", "127.0.0.1"), int(env.get("MEMORY_TEST_MYSQL_PORT", "3306"))
    )


@functools.cache
def mysql_server() -> MySqlServer:
    """The server every test database is created on; a container lives until the run ends."""
    if backend() == LOCAL:
        return local_mysql(os.environ)
    from testcontainers.community.mysql import MySqlContainer

    container = MySqlContainer(MYSQL_IMAGE, username="root", password=_MYSQL_PASSWORD).with_command(
        # The drivers' plain-TCP login, and MariaDB's utf8mb4_bin that the local runs use.
        "--default-authentication-plugin=mysql_native_password "
        "--character-set-server=utf8mb4 --collation-server=utf8mb4_bin"
    )
    container.start()
    atexit.register(container.stop)
    return MySqlServer(
        container.get_container_host_ip(), int(container.get_exposed_port(3306)), "root", _MYSQL_PASSWORD
    )


class Broker(Protocol):
    @property
    def bootstrap(self) -> str: ...

    def start(self) -> Broker: ...

    def stop(self) -> None: ...


class KafkaContainerBroker:
    """Apache Kafka in a container, shaped like the Tansu broker the local runs start."""

    def __init__(self) -> None:
        from testcontainers.community.kafka import KafkaContainer

        self._container = KafkaContainer(KAFKA_IMAGE).with_kraft()

    @property
    def bootstrap(self) -> str:
        return self._container.get_bootstrap_server()

    def start(self) -> KafkaContainerBroker:
        self._container.start(timeout=120)
        return self

    def stop(self) -> None:
        self._container.stop()


def session_broker() -> Broker:
    """The broker of a test session: Tansu locally, Kafka in a container otherwise."""
    if backend() == CONTAINERS:
        return KafkaContainerBroker()
    from tests.support.processes import TansuBroker

    return TansuBroker()
