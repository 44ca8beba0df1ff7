"""The Kafka connection settings as the Kafka adapters take them: one translation for the service
and the operator's commands alike."""

from __future__ import annotations

from service.adapters.kafka.security import KafkaSecurity
from service.config import Settings


def kafka_security(settings: Settings) -> KafkaSecurity:
    return KafkaSecurity(
        protocol=settings.kafka_security_protocol,
        sasl_mechanism=settings.kafka_sasl_mechanism,
        username=settings.kafka_sasl_username,
        password=settings.kafka_sasl_password,
        cafile=settings.kafka_ssl_cafile,
        certfile=settings.kafka_ssl_certfile,
        keyfile=settings.kafka_ssl_keyfile,
        check_hostname=settings.kafka_ssl_check_hostname,
    )
