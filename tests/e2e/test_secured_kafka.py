"""The service against secured Kafka endpoints (tests/support/secured_kafka.py says how each is built):
TLS with CA and hostname verification, SASL SCRAM-SHA-256, SCRAM-SHA-512 and PLAIN, and SASL_SSL.

Each proof runs the real `worker` process, whose admin creates the topics, whose readiness check
connects, whose consumer reads a poison record and whose dead-letter producer writes it to the DLQ,
all through the secured endpoint; the test's own clients use the same endpoint. Start-up refusals
are checked for one line and a non-zero exit."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from pydantic import SecretStr

from service.adapters.db.engine import upgrade_schema
from service.adapters.kafka.security import KafkaSecurity
from tests.support.processes import ROOT, ServiceProcess, free_port
from tests.support.secured_kafka import Pki, PlainTansu, SaslGateway, Stunnel, make_pki

pytestmark = pytest.mark.broker

PASSWORD = "s3cret-Passw0rd-not-in-any-log"


@dataclass
class Endpoint:
    bootstrap: str
    env: dict[str, str]
    security: KafkaSecurity
    gateway: SaslGateway | None = None


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_endpoint(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoint]:
    port = free_port()
    tansu = PlainTansu(port).start()
    stunnel = Stunnel(pki, tansu.port, tmp_path_factory.mktemp("stunnel"), port).start()
    yield Endpoint(
        f"localhost:{port}",
        {"MEMORY_KAFKA_SECURITY_PROTOCOL": "SSL", "MEMORY_KAFKA_SSL_CAFILE": str(pki.ca)},
        KafkaSecurity("SSL", cafile=str(pki.ca)),
    )
    stunnel.stop()
    tansu.stop()


@pytest.fixture(scope="module")
def sasl_endpoint() -> Iterator[Endpoint]:
    port = free_port()
    tansu = PlainTansu(port).start()
    gateway = SaslGateway(tansu.port, port=port, users={"memory": PASSWORD}).start()
    env = {
        "MEMORY_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "MEMORY_KAFKA_SASL_USERNAME": "memory",
        "MEMORY_KAFKA_SASL_PASSWORD": PASSWORD,
    }
    yield Endpoint(f"localhost:{port}", env, KafkaSecurity("SASL_PLAINTEXT"), gateway)
    gateway.stop()
    tansu.stop()


@pytest.fixture(scope="module")
def sasl_ssl_endpoint(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoint]:
    """SCRAM-SHA-512 inside TLS; the password comes from a mounted file, as in deploy/k8s."""
    port = free_port()
    tansu = PlainTansu(port).start()
    gateway = SaslGateway(tansu.port, users={"memory": PASSWORD}).start()
    directory = tmp_path_factory.mktemp("sasl-ssl")
    stunnel = Stunnel(pki, gateway.port, directory, port).start()
    secret = directory / "kafka-password"
    secret.write_text(PASSWORD + "\n")
    env = {
        "MEMORY_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "MEMORY_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "MEMORY_KAFKA_SASL_USERNAME": "memory",
        "MEMORY_KAFKA_SASL_PASSWORD_FILE": str(secret),
        "MEMORY_KAFKA_SSL_CAFILE": str(pki.ca),
    }
    security = KafkaSecurity("SASL_SSL", "SCRAM-SHA-512", "memory", SecretStr(PASSWORD), cafile=str(pki.ca))
    yield Endpoint(f"localhost:{port}", env, security, gateway)
    stunnel.stop()
    gateway.stop()
    tansu.stop()


def worker_env(endpoint: Endpoint, tmp_path: Path, **extra: str) -> dict[str, str]:
    url = f"sqlite+aiosqlite:///{tmp_path / 'memory.db'}"
    upgrade_schema(url)
    topic = f"task.finished.{uuid.uuid4().hex[:8]}"
    return {
        "MEMORY_DATABASE_URL": url,
        "MEMORY_KAFKA_BOOTSTRAP": endpoint.bootstrap,
        "MEMORY_KAFKA_TOPIC": topic,
        "MEMORY_KAFKA_GROUP_ID": f"g-{topic}",
        "MEMORY_KAFKA_PARTITIONS": "1",
        "MEMORY_KAFKA_SESSION_TIMEOUT_MS": "6000",
        "MEMORY_SHUTDOWN_GRACE_S": "1",
        "MEMORY_KAFKA_DLQ_IDEMPOTENCE": "false",  # Tansu has no idempotent producers
        **endpoint.env,
        **extra,
    }


async def _dead_letter_round_trip(endpoint: Endpoint, security: KafkaSecurity, env: dict[str, str]) -> None:
    """A poison record in, its dead letter out, both through the secured endpoint."""
    options: dict[str, Any] = security.options()
    producer = AIOKafkaProducer(bootstrap_servers=endpoint.bootstrap, **options)
    await producer.start()
    marker = uuid.uuid4().hex.encode()
    try:
        await producer.send_and_wait(env["MEMORY_KAFKA_TOPIC"], b"not json " + marker, key=b"poison")
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        f"{env['MEMORY_KAFKA_TOPIC']}.dlq",
        bootstrap_servers=endpoint.bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        **options,
    )
    await consumer.start()
    try:
        deadline = time.monotonic() + 30
        values: list[bytes | None] = []
        while marker not in b"".join(v or b"" for v in values) and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=1000)
            values += [r.value for records in batch.values() for r in records]
    finally:
        await consumer.stop()
    assert any(v is not None and marker in v for v in values), values


def _run_worker(env: dict[str, str], tmp_path: Path, name: str) -> ServiceProcess:
    return ServiceProcess("worker", env, name=name).start(timeout_s=60)


def _assert_secret_unlogged(service: ServiceProcess) -> None:
    log = service.log_path.read_text()
    assert PASSWORD not in log
    assert "kafka_connected" in log


async def test_tls_verifies_the_ca_and_carries_every_client(tls_endpoint: Endpoint, tmp_path: Path) -> None:
    env = worker_env(tls_endpoint, tmp_path)
    service = _run_worker(env, tmp_path, "kafka-ssl")
    try:
        assert httpx.get(f"{service.base_url}/readyz").json()["checks"]["broker"] == "ok"
        await _dead_letter_round_trip(tls_endpoint, tls_endpoint.security, env)
    finally:
        assert service.stop() == 0


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"])
async def test_sasl_logs_in_every_client(sasl_endpoint: Endpoint, tmp_path: Path, mechanism: str) -> None:
    assert sasl_endpoint.gateway is not None
    before = len(sasl_endpoint.gateway.logins)
    env = worker_env(sasl_endpoint, tmp_path, MEMORY_KAFKA_SASL_MECHANISM=mechanism)
    service = _run_worker(env, tmp_path, f"kafka-{mechanism}")
    try:
        security = KafkaSecurity("SASL_PLAINTEXT", mechanism, "memory", SecretStr(PASSWORD))  # type: ignore[arg-type]
        await _dead_letter_round_trip(sasl_endpoint, security, env)
    finally:
        assert service.stop() == 0
    logins = sasl_endpoint.gateway.logins[before:]
    # The probe, the admin, the consumer (and its coordinator), the dead-letter producer, the test's two.
    assert len(logins) >= 5 and all(login == (mechanism, "memory", True) for login in logins), logins
    _assert_secret_unlogged(service)


async def test_sasl_ssl_with_the_password_from_a_file_and_a_replay(
    sasl_ssl_endpoint: Endpoint, tmp_path: Path
) -> None:
    env = worker_env(sasl_ssl_endpoint, tmp_path)
    service = _run_worker(env, tmp_path, "kafka-sasl-ssl")
    try:
        await _dead_letter_round_trip(sasl_ssl_endpoint, sasl_ssl_endpoint.security, env)
    finally:
        assert service.stop() == 0
    _assert_secret_unlogged(service)
    replay = subprocess.run(
        [sys.executable, "-m", "service.main", "dlq", "replay"],
        env={**service.env},
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert replay.returncode == 0, replay.stderr
    assert '"replayed": 1' in replay.stdout and PASSWORD not in replay.stdout + replay.stderr


def _refused(env: dict[str, str], tmp_path: Path, name: str) -> str:
    service = ServiceProcess("worker", env, name=name).start(wait_ready=False)
    assert service.process is not None
    code = service.process.wait(timeout=90)
    log = service.log_path.read_text()
    assert code != 0, log
    refusal = [line for line in log.splitlines() if line.startswith("mao-memory:")]
    assert len(refusal) == 1 and "Traceback" not in log, log
    assert PASSWORD not in log and "wrong-password" not in log
    return refusal[0]


def test_a_wrong_password_stops_the_start_in_one_line(sasl_endpoint: Endpoint, tmp_path: Path) -> None:
    env = worker_env(
        sasl_endpoint,
        tmp_path,
        MEMORY_KAFKA_SASL_MECHANISM="SCRAM-SHA-512",
        MEMORY_KAFKA_SASL_PASSWORD="wrong-password",
    )
    line = _refused(env, tmp_path, "kafka-wrong-password")
    assert "SaslAuthenticationFailed" in line and "SCRAM-SHA-512 as 'memory'" in line


def test_an_untrusted_certificate_stops_the_start_in_one_line(
    tls_endpoint: Endpoint, pki: Pki, tmp_path: Path
) -> None:
    env = worker_env(tls_endpoint, tmp_path, MEMORY_KAFKA_SSL_CAFILE=str(pki.other_ca))
    line = _refused(env, tmp_path, "kafka-untrusted")
    assert "certificate is not trusted" in line and "MEMORY_KAFKA_SSL_CAFILE" in line


def test_a_hostname_the_certificate_does_not_name_stops_the_start(
    tls_endpoint: Endpoint, tmp_path: Path
) -> None:
    env = worker_env(
        tls_endpoint,
        tmp_path,
        MEMORY_KAFKA_BOOTSTRAP=tls_endpoint.bootstrap.replace("localhost", "127.0.0.1"),
    )
    line = _refused(env, tmp_path, "kafka-hostname")
    assert "certificate is not trusted" in line and "127.0.0.1" in line


def test_a_missing_ca_file_stops_the_start_in_one_line(tls_endpoint: Endpoint, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-ca.pem"
    env = worker_env(tls_endpoint, tmp_path, MEMORY_KAFKA_SSL_CAFILE=str(missing))
    line = _refused(env, tmp_path, "kafka-missing-ca")
    assert f"Kafka TLS file not found: {missing} (MEMORY_KAFKA_SSL_CAFILE)" in line


def test_readyz_says_why_once_the_password_is_refused(sasl_endpoint: Endpoint, tmp_path: Path) -> None:
    """The password is changed on the broker's side while the service runs: its connections are
    dropped, the new logins are refused, and /readyz names the cause."""
    gateway = sasl_endpoint.gateway
    assert gateway is not None
    env = worker_env(sasl_endpoint, tmp_path, MEMORY_KAFKA_SASL_MECHANISM="SCRAM-SHA-256")
    service = _run_worker(env, tmp_path, "kafka-rotated")
    try:
        gateway.users["memory"] = "rotated-elsewhere"
        gateway.drop_connections()
        deadline = time.monotonic() + 30
        answer: dict[str, Any] = {}
        while time.monotonic() < deadline:
            response = httpx.get(f"{service.base_url}/readyz", timeout=5)
            answer = response.json()
            if response.status_code == 503 and "Invalid username or password" in answer["checks"]["broker"]:
                break
            time.sleep(0.5)
        assert answer["checks"]["broker"].startswith("fail: cannot connect to Kafka"), answer
        assert "Invalid username or password" in answer["checks"]["broker"], answer
        assert PASSWORD not in str(answer)
    finally:
        gateway.users["memory"] = PASSWORD
        service.stop()
