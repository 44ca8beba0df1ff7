"""The Kafka security settings and the one place that turns them into client options; the DLQ
topic's durability check. The connections themselves: tests/e2e/test_secured_kafka.py."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from service.adapters.kafka.security import KafkaConnectionRefused, KafkaSecurity
from service.config import Settings
from service.core.topic_durability import Durability, durability_gaps
from service.entrypoints.kafka_settings import kafka_security

SECRET = "hunter2-kafka-secret"


def sasl(**extra: object) -> Settings:
    return Settings(
        kafka_security_protocol="SASL_SSL",
        kafka_sasl_mechanism="SCRAM-SHA-512",
        kafka_sasl_username="memory",
        **extra,  # type: ignore[arg-type]
    )


def test_plaintext_is_the_default_and_adds_nothing() -> None:
    assert kafka_security(Settings()).options() == {"security_protocol": "PLAINTEXT"}


def test_sasl_ssl_options_carry_the_credentials_and_a_verifying_context() -> None:
    options = kafka_security(sasl(kafka_sasl_password=SECRET)).options()
    assert options["sasl_mechanism"] == "SCRAM-SHA-512"
    assert options["sasl_plain_username"] == "memory" and options["sasl_plain_password"] == SECRET
    context = options["ssl_context"]
    assert isinstance(context, ssl.SSLContext)
    assert context.check_hostname and context.verify_mode is ssl.CERT_REQUIRED


def test_hostname_checking_can_be_turned_off_only_explicitly() -> None:
    settings = Settings(kafka_security_protocol="SSL", kafka_ssl_check_hostname=False)
    assert not kafka_security(settings).options()["ssl_context"].check_hostname


def test_the_password_is_never_shown() -> None:
    settings = sasl(kafka_sasl_password=SECRET)
    security = kafka_security(settings)
    assert SECRET not in repr(settings) and SECRET not in str(settings)
    assert SECRET not in repr(security) and SECRET not in security.describe()


def test_the_password_is_read_from_a_mounted_file(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text(SECRET + "\n")
    settings = sasl(kafka_sasl_password_file=secret)
    assert settings.kafka_sasl_password == SecretStr(SECRET)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({}, "SASL_SSL needs MEMORY_KAFKA_SASL_PASSWORD"),
        ({"kafka_sasl_password": "x", "kafka_sasl_password_file": "/etc/hostname"}, "not both"),
        ({"kafka_sasl_password_file": "/nonexistent/password"}, "MEMORY_KAFKA_SASL_PASSWORD_FILE unreadable"),
        ({"kafka_sasl_password": "x", "kafka_ssl_certfile": "/c.pem"}, "go together"),
    ],
)
def test_incomplete_security_settings_are_refused(extra: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        sasl(**extra)


def test_a_missing_tls_file_is_named_with_its_setting(tmp_path: Path) -> None:
    cert, missing = tmp_path / "client.pem", tmp_path / "client.key"
    cert.write_text("-----BEGIN CERTIFICATE-----\n")
    security = KafkaSecurity("SSL", certfile=str(cert), keyfile=str(missing))
    with pytest.raises(KafkaConnectionRefused, match=r"client\.key \(MEMORY_KAFKA_SSL_KEYFILE\)"):
        security.options()


def test_durability_gaps_name_each_weakness() -> None:
    wanted = Durability(replication_factor=3, min_insync_replicas=2, retention_ms=1000)
    assert durability_gaps(wanted, 3, {"min.insync.replicas": "2", "retention.ms": "1000"}) == []
    assert durability_gaps(wanted, 1, {"min.insync.replicas": "1", "retention.ms": "-1"}) == [
        "replication factor 1 < 3 configured",
        "min.insync.replicas 1 < 2 configured",
        "retention.ms -1 keeps dead letters longer than 1000 configured",
    ]
    assert durability_gaps(Durability(), 1, {}) == []
