"""Start-up on the embedded broker: a taken port is refused, and the service stops when its broker dies."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from service.adapters.db.engine import upgrade_schema
from tests.support.processes import ServiceProcess, free_port


@pytest.fixture
def embedded_env(tmp_path: Path) -> dict[str, str]:
    url = f"sqlite+aiosqlite:///{tmp_path / 'memory.db'}"
    upgrade_schema(url)
    return {
        "MEMORY_DATABASE_URL": url,
        "MEMORY_KAFKA_BOOTSTRAP": "",
        "MEMORY_EMBEDDED_KAFKA_PORT": str(free_port()),
        "MEMORY_KAFKA_PARTITIONS": "1",
        "MEMORY_SHUTDOWN_GRACE_S": "1",
    }


def test_a_taken_broker_port_is_refused_with_a_clear_message(
    embedded_env: dict[str, str], tmp_path: Path
) -> None:
    """Another instance (or a local Kafka) on the port: joining it would mix two services' data."""
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", int(embedded_env["MEMORY_EMBEDDED_KAFKA_PORT"])))
        squatter.listen()
        service = ServiceProcess("run", embedded_env, name="port-taken", cwd=tmp_path).start(wait_ready=False)
        assert service.process is not None
        code = service.process.wait(timeout=60)
    log = service.log_path.read_text()
    assert code == 2, log
    assert "is already in use, so the embedded broker cannot start there" in log
    assert "MEMORY_EMBEDDED_KAFKA_PORT" in log and "service_started" not in log


def test_the_service_stops_and_exits_non_zero_when_its_embedded_broker_dies(
    embedded_env: dict[str, str], tmp_path: Path
) -> None:
    service = ServiceProcess("run", embedded_env, name="broker-dies", cwd=tmp_path).start()
    port = embedded_env["MEMORY_EMBEDDED_KAFKA_PORT"]
    try:
        broker = subprocess.run(
            ["pgrep", "-f", f"tcp://127.0.0.1:{port}"], capture_output=True, text=True, check=True
        ).stdout.split()
        assert len(broker) == 1
        subprocess.run(["kill", "-9", broker[0]], check=True)
        assert service.process is not None
        started = time.monotonic()
        code = service.process.wait(timeout=30)
    finally:
        service.stop()
    log = service.log_path.read_text()
    assert code == 1 and time.monotonic() - started < 30
    assert "embedded_broker_died" in log and "the embedded broker exited" in log


def test_ctrl_c_in_the_terminal_stops_the_service_and_its_broker_cleanly(
    embedded_env: dict[str, str], tmp_path: Path
) -> None:
    """Ctrl-C reaches the whole foreground group: the broker must not die before the service has
    committed and stopped, or the shutdown would wait on a dead broker."""
    service = ServiceProcess("run", embedded_env, name="ctrl-c", cwd=tmp_path).start(terminal=True)
    port = embedded_env["MEMORY_EMBEDDED_KAFKA_PORT"]
    try:
        assert service.process is not None
        started = time.monotonic()
        os.killpg(service.process.pid, signal.SIGINT)
        code = service.process.wait(timeout=30)
    finally:
        service.stop()
    elapsed = time.monotonic() - started
    broker = subprocess.run(["pgrep", "-f", f"tcp://127.0.0.1:{port}"], capture_output=True, check=False)
    assert code == 0 and elapsed < 10, (code, elapsed, service.log_path.read_text()[-2000:])
    assert broker.returncode == 1, "the embedded broker outlived the service"


@pytest.mark.parametrize(("setting", "taken"), [("MEMORY_OPS_PORT", "ops"), ("MEMORY_HTTP_PORT", "api")])
def test_a_taken_listener_port_is_refused_with_a_clear_message(
    setting: str, taken: str, tmp_path: Path
) -> None:
    """A probe port (or the API's) held by another process: one line naming the setting, exit 2, and
    no `service_started` for a service that never listened there."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'memory.db'}"
    upgrade_schema(url)
    service = ServiceProcess("api", {"MEMORY_DATABASE_URL": url}, name=f"{taken}-port-taken")
    port = service.ops_port if taken == "ops" else service.port
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        service.start(wait_ready=False)
        assert service.process is not None
        code = service.process.wait(timeout=60)
    log = service.log_path.read_text()
    assert code == 2, log
    [line] = [line for line in log.splitlines() if line.startswith("mao-memory:")]
    assert f"127.0.0.1:{port}" in line and "already in use" in line and setting in line
    assert "service_started" not in log
