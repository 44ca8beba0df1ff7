"""How every Kafka client of the service connects: TLS and SASL options built in one place.

The consumer, the dead-letter producer, the replay's clients, the topic admin and the readiness
check all take their connection options from `KafkaSecurity.options`, so a protocol or a
certificate is never applied to one client and forgotten on another. `probe` opens one connection
the way the clients do and says, in one line, why it failed: aiokafka's own clients only report
"Unable to bootstrap" and log the cause at ERROR, once per broker and retry.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from aiokafka.conn import create_conn
from aiokafka.helpers import create_ssl_context
from pydantic import SecretStr

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


class KafkaConnectionRefused(Exception):
    """Kafka cannot be reached as configured (a TLS, SASL or network failure); the message is one
    line that names the cause and the setting to look at, never a secret."""


@dataclass(frozen=True, slots=True)
class KafkaSecurity:
    protocol: SecurityProtocol = "PLAINTEXT"
    sasl_mechanism: SaslMechanism | None = None
    username: str | None = None
    password: SecretStr | None = None
    cafile: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    check_hostname: bool = True

    @property
    def tls(self) -> bool:
        return self.protocol in {"SSL", "SASL_SSL"}

    @property
    def sasl(self) -> bool:
        return self.protocol in {"SASL_PLAINTEXT", "SASL_SSL"}

    def options(self) -> dict[str, Any]:
        """aiokafka's keyword arguments for a client; the same for every kind of client."""
        options: dict[str, Any] = {"security_protocol": self.protocol}
        if self.tls:
            options["ssl_context"] = self.ssl_context()
        if self.sasl:
            options["sasl_mechanism"] = self.sasl_mechanism
            options["sasl_plain_username"] = self.username
            options["sasl_plain_password"] = self.password.get_secret_value() if self.password else None
        return options

    def ssl_context(self) -> ssl.SSLContext:
        """The CA file (else the system's trust store), the client certificate when one is set, and
        the broker's hostname checked against its certificate unless turned off."""
        files = {"CAFILE": self.cafile, "CERTFILE": self.certfile, "KEYFILE": self.keyfile}
        for setting, path in files.items():
            if path is not None and not Path(path).is_file():
                raise KafkaConnectionRefused(f"Kafka TLS file not found: {path} (MEMORY_KAFKA_SSL_{setting})")
        try:
            context: ssl.SSLContext = create_ssl_context(
                cafile=self.cafile, certfile=self.certfile, keyfile=self.keyfile
            )
        except (ssl.SSLError, OSError) as exc:
            raise KafkaConnectionRefused(f"Kafka TLS files unusable: {exc}") from None
        context.check_hostname = self.check_hostname
        return context

    def describe(self) -> str:
        """The settings in force, for a log line or an error: never the password."""
        parts: list[str] = [self.protocol]
        if self.sasl:
            parts.append(f"{self.sasl_mechanism} as {self.username!r}")
        return " ".join(parts)


async def probe(bootstrap: str, security: KafkaSecurity, timeout_s: float = 10.0) -> None:
    """Connect to the first bootstrap server that answers as the clients do (TLS handshake, SASL
    authentication), then close; raise `KafkaConnectionRefused` with the last server's cause."""
    options = security.options()
    cause = "no bootstrap server"
    for server in bootstrap.split(","):
        host, _, port = server.strip().rpartition(":")
        try:
            conn = await asyncio.wait_for(
                create_conn(host, int(port), client_id="mao-memory", **options), timeout_s
            )
        except Exception as exc:
            cause = _cause(exc)
            continue
        conn.close()
        return
    raise KafkaConnectionRefused(
        f"cannot connect to Kafka at {bootstrap} with {security.describe()}: {cause}"
    )


def _cause(exc: BaseException) -> str:
    """The innermost reason aiokafka wraps, in one line."""
    while exc.__cause__ is not None and not isinstance(exc, ssl.SSLError):
        exc = exc.__cause__
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"the broker's certificate is not trusted ({exc.verify_message}; MEMORY_KAFKA_SSL_CAFILE)"
    if isinstance(exc, TimeoutError):
        return "no answer in time (wrong port or protocol? MEMORY_KAFKA_SECURITY_PROTOCOL)"
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"
